"""Shared by the client tests: no AGENT_REWIND_* variable of the shell reaches any of them; an
in-process gRPC server that records each call's metadata (and client certificate) and can refuse
calls as the service does; a small PKI for TLS (a CA, a server and a client certificate); the CLI
over a grpc_testing channel (`cli_over`, wire.py)."""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from agent_rewind.api.v1 import (
    rewind_pb2,
    rewind_service_pb2_grpc,
    session_pb2,
    session_service_pb2,
    session_service_pb2_grpc,
)
from tests.unit.client import wire

# --- TLS ------------------------------------------------------------------------------------------


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _certificate(
    common_name: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None = None,
    *,
    ca: bool = False,
    hosts: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer[0].subject if issuer else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if hosts:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    return builder.sign(issuer[1] if issuer else key, hashes.SHA256())


def _pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@dataclass(frozen=True)
class Pki:
    ca: bytes
    server_cert: bytes
    server_key: bytes
    client_cert: bytes  # common name "alice", signed by `ca`
    client_key: bytes
    other_ca: bytes  # signed nothing here

    def write(self, directory: Path) -> dict[str, Path]:
        """The client's files: ca, cert, key, other_ca."""
        files = {"ca": self.ca, "cert": self.client_cert, "key": self.client_key, "other_ca": self.other_ca}
        paths = {}
        for name, data in files.items():
            path = directory / f"{name}.pem"
            path.write_bytes(data)
            paths[name] = path
        return paths


@pytest.fixture(scope="session")
def pki() -> Pki:
    ca_key, server_key, client_key, other_key = _key(), _key(), _key(), _key()
    ca = _certificate("test CA", ca_key, ca=True)
    return Pki(
        ca=_pem(ca),
        server_cert=_pem(_certificate("server", server_key, (ca, ca_key), hosts=True)),
        server_key=_key_pem(server_key),
        client_cert=_pem(_certificate("alice", client_key, (ca, ca_key))),
        client_key=_key_pem(client_key),
        other_ca=_pem(_certificate("another CA", other_key, ca=True)),
    )


# --- the server -----------------------------------------------------------------------------------


@dataclass
class Call:
    method: str
    metadata: dict[str, str]
    common_name: str | None
    authorizations: list[str]  # every authorization header the call carried
    time_remaining: float | None = None  # seconds left before the call's deadline (huge: no deadline)


@dataclass
class Recorder:
    """Every call's metadata. With `token`, a call without `authorization: Bearer <token>` is refused
    UNAUTHENTICATED; a method in `denied` is refused PERMISSION_DENIED, as the service does."""

    token: str | None = None
    denied: set[str] = field(default_factory=set)
    calls: list[Call] = field(default_factory=list)

    def admit(self, method: str, context: Any) -> None:
        pairs = [(k, v) for k, v in context.invocation_metadata() if isinstance(v, str)]
        names = context.auth_context().get("x509_common_name") or []
        self.calls.append(
            Call(
                method,
                dict(pairs),
                names[0].decode() if names else None,
                [v for k, v in pairs if k == "authorization"],
                context.time_remaining(),
            )
        )
        if self.token is not None and self.calls[-1].metadata.get("authorization") != f"Bearer {self.token}":
            _abort(context, code_pb2.UNAUTHENTICATED, "the bearer token is not valid", "UNAUTHENTICATED", {})
        if method in self.denied:
            _abort(
                context,
                code_pb2.PERMISSION_DENIED,
                "this call needs the permission 'rewind', which the caller lacks",
                "PERMISSION_DENIED",
                {"permission": "rewind"},
            )

    def authorization(self) -> list[str | None]:
        return [c.metadata.get("authorization") for c in self.calls]


def _abort(context: Any, code: int, message: str, reason: str, metadata: dict[str, str]) -> None:
    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.ErrorInfo(reason=reason, domain="agent-rewind.v1", metadata=metadata))
    context.abort_with_status(
        rpc_status.to_status(status_pb2.Status(code=code, message=message, details=[detail]))
    )


class _Sessions(session_service_pb2_grpc.SessionServiceServicer):
    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def ListSessions(self, request: Any, context: Any) -> session_service_pb2.ListSessionsResponse:  # noqa: N802
        self.recorder.admit("ListSessions", context)
        return session_service_pb2.ListSessionsResponse(sessions=[session_pb2.Session(session_id="s1")])

    def Prompt(self, request: Any, context: Any) -> Iterator[session_pb2.TurnEvent]:  # noqa: N802
        self.recorder.admit("Prompt", context)
        yield session_pb2.TurnEvent(
            session_id=request.session_id,
            message_id="u-1",
            user_prompt=session_pb2.UserPrompt(text=request.text),
        )
        yield session_pb2.TurnEvent(
            session_id=request.session_id, result=session_pb2.TurnResult(subtype="success", num_turns=1)
        )


class _Rewinds(rewind_service_pb2_grpc.RewindServiceServicer):
    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def GetCapabilities(self, request: Any, context: Any) -> rewind_pb2.Capabilities:  # noqa: N802
        self.recorder.admit("GetCapabilities", context)
        return rewind_pb2.Capabilities(service_version="test", dry_run=True)

    def Rewind(self, request: Any, context: Any) -> rewind_pb2.RewindResult:  # noqa: N802
        self.recorder.admit("Rewind", context)
        return rewind_pb2.RewindResult(rewind_id="r1")


ECHO_SERVICE = "test.Echo"


def _echo_handler(recorder: Recorder) -> grpc.GenericRpcHandler:
    """Client-streaming `Collect` and bidirectional `Chat` (the API has neither kind): each answers
    with the call's authorization header, as bytes."""

    def collect(requests: Iterator[bytes], context: Any) -> bytes:
        recorder.admit("Collect", context)
        list(requests)
        return (recorder.calls[-1].metadata.get("authorization") or "").encode()

    def chat(requests: Iterator[bytes], context: Any) -> Iterator[bytes]:
        recorder.admit("Chat", context)
        for request in requests:
            yield request + b" " + (recorder.calls[-1].metadata.get("authorization") or "").encode()

    return grpc.method_handlers_generic_handler(
        ECHO_SERVICE,
        {
            "Collect": grpc.stream_unary_rpc_method_handler(collect),
            "Chat": grpc.stream_stream_rpc_method_handler(chat),
        },
    )


Serve = Callable[..., tuple[str, Recorder]]


@pytest.fixture
def serve() -> Iterator[Serve]:
    """`serve(tls=None, client_ca=None, token=None, denied=())` -> (address, recorder): a server on a
    free loopback port, plain or TLS (mutual with `client_ca`), stopped after the test."""
    servers: list[grpc.Server] = []

    def start(
        *,
        tls: Pki | None = None,
        client_ca: bytes | None = None,
        token: str | None = None,
        denied: tuple[str, ...] = (),
    ) -> tuple[str, Recorder]:
        recorder = Recorder(token=token, denied=set(denied))
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        session_service_pb2_grpc.add_SessionServiceServicer_to_server(_Sessions(recorder), server)
        rewind_service_pb2_grpc.add_RewindServiceServicer_to_server(_Rewinds(recorder), server)
        server.add_generic_rpc_handlers((_echo_handler(recorder),))
        if tls is None:
            port = server.add_insecure_port("127.0.0.1:0")
        else:
            credentials = grpc.ssl_server_credentials(
                [(tls.server_key, tls.server_cert)],
                root_certificates=client_ca,
                require_client_auth=client_ca is not None,
            )
            port = server.add_secure_port("127.0.0.1:0", credentials)
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}", recorder

    yield start
    for server in servers:
        server.stop(None)


@pytest.fixture(autouse=True)
def no_agent_rewind_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """No AGENT_REWIND_* variable of the developer's shell (a token, a CA) reaches a test."""
    for key in list(os.environ):
        if key.startswith("AGENT_REWIND_"):
            monkeypatch.delenv(key)


@pytest.fixture(name="cli_over")
def cli_over_fixture(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """`cli_over(channel, argv, interrupt_at=None)`: the CLI over a grpc_testing channel (wire.py)."""
    return wire.cli_over(monkeypatch)
