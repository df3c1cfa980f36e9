"""Who the client says it is: a bearer token, TLS, and where the command line finds them.

A token is sent as `authorization: Bearer <token>` on every call, by a client interceptor, so it
works on a plain loopback channel as well as over TLS. It is read from a file (`--token-file`) or
from $AGENT_REWIND_TOKEN, never from a flag: a flag's value shows in process lists and shell history.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from ._parsing import UsageError

TOKEN_ENV = "AGENT_REWIND_TOKEN"
TLS_CA_ENV = "AGENT_REWIND_TLS_CA"
TLS_CERT_ENV = "AGENT_REWIND_CLIENT_CERT"
TLS_KEY_ENV = "AGENT_REWIND_CLIENT_KEY"

_AUTHORIZATION = "authorization"


def check_token(token: str) -> str:
    """The token, or ValueError: gRPC metadata values are printable ASCII, and a token is never empty."""
    if not token:
        raise ValueError("the token is empty")
    if any(not (" " <= c <= "~") for c in token) or token != token.strip():
        raise ValueError("a token is printable ASCII with no surrounding whitespace")
    return token


@dataclass(frozen=True)
class Tls:
    """TLS for the channel: the CA certificates (PEM) to trust the server by (None: the system's), and
    for mutual TLS a client certificate chain and its private key (PEM), which go together."""

    ca: bytes | None = None
    cert_chain: bytes | None = None
    key: bytes | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if (self.cert_chain is None) != (self.key is None):
            raise ValueError("a client certificate chain and its key go together")

    def channel_credentials(self) -> Any:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert_chain
        )


@dataclass(frozen=True)
class Credentials:
    """What `resolve_credentials` found: a bearer token, TLS, both or neither."""

    token: str | None = field(default=None, repr=False)
    tls: Tls | None = None


@dataclass(frozen=True)
class _CallDetails:
    """A grpc.ClientCallDetails with other metadata; gRPC reads only these attributes."""

    method: str
    timeout: float | None
    metadata: Sequence[tuple[str, str | bytes]] | None
    credentials: Any
    wait_for_ready: bool | None
    compression: Any


class BearerToken(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[misc]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[misc]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[misc]
    grpc.StreamStreamClientInterceptor,  # type: ignore[misc]
):
    """Adds `authorization: Bearer <token>` to every call, unary and streaming alike (replacing any
    authorization the call carried)."""

    def __init__(self, token: str) -> None:
        self._header = f"Bearer {check_token(token)}"

    def __repr__(self) -> str:  # never the token
        return "BearerToken(...)"

    def _details(self, details: Any) -> _CallDetails:
        metadata = [(k, v) for k, v in (details.metadata or ()) if k.lower() != _AUTHORIZATION]
        metadata.append((_AUTHORIZATION, self._header))
        return _CallDetails(
            method=details.method,
            timeout=details.timeout,
            metadata=metadata,
            credentials=getattr(details, "credentials", None),
            wait_for_ready=getattr(details, "wait_for_ready", None),
            compression=getattr(details, "compression", None),
        )

    def intercept_unary_unary(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Callable[..., Any], details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation: Callable[..., Any], details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)


# --- the command line -----------------------------------------------------------------------------


def _pick(flag: str | None, flag_name: str, variable: str, env: Mapping[str, str]) -> tuple[str, str] | None:
    """(path, where it came from): the flag, else the variable (an empty one counts as unset)."""
    if flag is not None:
        if not flag:
            raise UsageError(f"{flag_name} needs a file name")
        return flag, flag_name
    value = env.get(variable)
    return (value, f"${variable}") if value else None


def _read(path: str, source: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise UsageError(f"{source}: cannot read {path}: {err.strerror or err}") from None
    return data


def _read_pem(picked: tuple[str, str] | None, what: str, marker: bytes) -> bytes | None:
    if picked is None:
        return None
    path, source = picked
    data = _read(path, source)
    if b"-----BEGIN" not in data or marker not in data:
        raise UsageError(f"{source}: {path} holds no PEM {what}")
    return data


def resolve_credentials(
    *,
    token_file: str | None = None,
    tls_ca: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Credentials:
    """The credentials of the command-line flags, each falling back to its variable:

    `--token-file`, else $AGENT_REWIND_TOKEN (the token itself); `--tls-ca`, `--tls-cert`, `--tls-key`,
    else $AGENT_REWIND_TLS_CA, _CERT, _KEY (PEM files). TLS is on when any of the three is given;
    without a CA the system's roots are trusted. Raises UsageError for an unreadable, empty or
    malformed file, and for a certificate without its key (or the other way round).
    """
    environ = os.environ if env is None else env
    token: str | None = None
    token_source: str | None = None
    if token_file is not None:
        token_source = "--token-file"
        if not token_file:
            raise UsageError("--token-file needs a file name")
        try:
            token = _read(token_file, token_source).decode().strip()
        except UnicodeDecodeError:
            raise UsageError(f"--token-file: {token_file} is not text") from None
        if not token:
            raise UsageError(f"--token-file: {token_file} is empty")
    elif environ.get(TOKEN_ENV, "").strip():
        token, token_source = environ[TOKEN_ENV].strip(), f"${TOKEN_ENV}"
    if token is not None:
        try:
            check_token(token)
        except ValueError as err:
            raise UsageError(f"{token_source}: {err}") from None

    cert = _pick(tls_cert, "--tls-cert", TLS_CERT_ENV, environ)
    key = _pick(tls_key, "--tls-key", TLS_KEY_ENV, environ)
    if cert is not None and key is None:
        raise UsageError(
            f"{cert[1]} needs --tls-key (or ${TLS_KEY_ENV}): a client certificate and its key go together"
        )
    if key is not None and cert is None:
        raise UsageError(
            f"{key[1]} needs --tls-cert (or ${TLS_CERT_ENV}): a client certificate and its key go together"
        )
    ca = _read_pem(_pick(tls_ca, "--tls-ca", TLS_CA_ENV, environ), "certificate", b"CERTIFICATE")
    chain = _read_pem(cert, "certificate", b"CERTIFICATE")
    private = _read_pem(key, "private key", b"PRIVATE KEY")
    tls = Tls(ca, chain, private) if (ca, chain, private) != (None, None, None) else None
    return Credentials(token=token, tls=tls)
