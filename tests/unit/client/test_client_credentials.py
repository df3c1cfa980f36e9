"""`Client` credentials against a real in-process gRPC server: the bearer token on every kind of call,
over a plain loopback channel and over TLS; mutual TLS; and where `resolve_credentials` finds them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest

from agent_rewind.client import (
    BearerToken,
    Client,
    Credentials,
    Tls,
    UsageError,
    is_loopback,
    render_rpc_error,
    resolve_credentials,
)

if TYPE_CHECKING:
    from tests.unit.client.conftest import Pki, Serve

TOKEN = "arw_test-token"
ECHO_SERVICE = "test.Echo"  # conftest's client- and bidirectional-streaming methods


def test_the_token_goes_on_unary_and_server_streaming_calls(serve: Serve) -> None:
    address, recorder = serve()
    with Client(address, token=TOKEN) as client:
        assert not client.tls
        assert client.capabilities().service_version == "test"
        assert [s.session_id for s in client.list_sessions().sessions] == ["s1"]
        events = list(client.prompt("s1", "say hi"))
        assert events[-1].result.subtype == "success"
    assert [c.method for c in recorder.calls] == ["GetCapabilities", "ListSessions", "Prompt"]
    assert [c.authorizations for c in recorder.calls] == [[f"Bearer {TOKEN}"]] * 3


def test_without_a_token_calls_carry_no_authorization(serve: Serve) -> None:
    address, recorder = serve()
    with Client(address) as client:
        client.capabilities()
        list(client.prompt("s1", "say hi"))
    assert [c.authorizations for c in recorder.calls] == [[], []]


def test_the_interceptor_covers_client_and_bidirectional_streaming_and_replaces_an_authorization(
    serve: Serve,
) -> None:
    address, recorder = serve()
    with grpc.insecure_channel(address) as plain:
        channel = grpc.intercept_channel(plain, BearerToken(TOKEN))
        collect = channel.stream_unary(f"/{ECHO_SERVICE}/Collect")
        chat = channel.stream_stream(f"/{ECHO_SERVICE}/Chat")
        assert collect(iter([b"a", b"b"])) == f"Bearer {TOKEN}".encode()
        assert list(chat(iter([b"one", b"two"]))) == [
            f"one Bearer {TOKEN}".encode(),
            f"two Bearer {TOKEN}".encode(),
        ]
        # A call's own authorization is replaced, not sent alongside.
        collect(iter([b"a"]), metadata=(("authorization", "Bearer other"), ("x-trace", "t")))
    assert [c.authorizations for c in recorder.calls] == [[f"Bearer {TOKEN}"]] * 3
    assert recorder.calls[-1].metadata["x-trace"] == "t"


@pytest.mark.parametrize("token", ["", " arw_x", "arw_x\n", "arw\u00e9", "arw\nx"])
def test_a_token_that_cannot_be_a_header_is_refused_before_any_channel(token: str) -> None:
    with pytest.raises(ValueError, match="token"):
        Client("127.0.0.1:1", token=token)


def test_no_repr_shows_the_token() -> None:
    assert TOKEN not in repr(BearerToken(TOKEN))
    assert TOKEN not in repr(Credentials(token=TOKEN))
    assert "secret key" not in repr(Tls(cert_chain=b"chain", key=b"secret key"))


def test_tls_trusting_the_ca_carries_the_token(serve: Serve, pki: Pki) -> None:
    address, recorder = serve(tls=pki)
    with Client(address, token=TOKEN, tls=Tls(ca=pki.ca)) as client:
        assert client.tls
        assert client.capabilities().dry_run
        list(client.prompt("s1", "say hi"))
    assert [c.authorizations for c in recorder.calls] == [[f"Bearer {TOKEN}"]] * 2
    assert recorder.calls[0].common_name is None


def test_mutual_tls_presents_the_client_certificate(serve: Serve, pki: Pki) -> None:
    address, recorder = serve(tls=pki, client_ca=pki.ca)
    with Client(address, tls=Tls(ca=pki.ca, cert_chain=pki.client_cert, key=pki.client_key)) as client:
        client.capabilities()
    assert recorder.calls[0].common_name == "alice"
    with Client(address, tls=Tls(ca=pki.ca)) as client, pytest.raises(grpc.RpcError) as err:
        client.capabilities()  # no client certificate: the handshake fails
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert len(recorder.calls) == 1


def test_a_server_certificate_no_trusted_ca_signed_is_refused_with_a_hint(serve: Serve, pki: Pki) -> None:
    address, recorder = serve(tls=pki)
    with (
        Client(address, token=TOKEN, tls=Tls(ca=pki.other_ca)) as client,
        pytest.raises(grpc.RpcError) as err,
    ):
        client.capabilities()
    (line,) = render_rpc_error(err.value, server=address, tls=True)
    assert line.startswith(f"error: cannot reach agent-rewind at {address} (")
    assert line.endswith(
        "the server's certificate is not signed by a trusted CA: pass the CA that signed it with --tls-ca"
    )
    assert recorder.calls == []  # the token never left


def test_a_certificate_needs_its_key() -> None:
    with pytest.raises(ValueError, match="go together"):
        Tls(cert_chain=b"chain")
    with pytest.raises(ValueError, match="go together"):
        Tls(key=b"key")


@pytest.mark.parametrize(
    ("server", "loopback"),
    [
        ("127.0.0.1:50051", True),
        ("127.1.2.3:1", True),
        ("localhost:50051", True),
        ("[::1]:50051", True),
        ("10.0.0.5:50051", False),
        ("agents.example.com:443", False),
        ("[2001:db8::1]:50051", False),
    ],
)
def test_loopback_addresses(server: str, loopback: bool) -> None:
    assert is_loopback(server) is loopback


# --- resolve_credentials: flags, then variables ---------------------------------------------------


@pytest.fixture
def files(tmp_path: Path, pki: Pki) -> dict[str, Path]:
    paths = pki.write(tmp_path)
    (tmp_path / "token").write_text(f"  {TOKEN}\n\n")
    (tmp_path / "env-token").write_text("arw_from-env-file\n")
    paths["token"] = tmp_path / "token"
    return paths


def test_no_flag_and_no_variable_is_no_credentials() -> None:
    assert resolve_credentials(env={}) == Credentials()
    assert resolve_credentials(env={"AGENT_REWIND_TOKEN": "  ", "AGENT_REWIND_TLS_CA": ""}) == Credentials()


def test_the_token_file_is_stripped_and_beats_the_variable(files: dict[str, Path]) -> None:
    env = {"AGENT_REWIND_TOKEN": "arw_from-env"}
    assert resolve_credentials(token_file=str(files["token"]), env=env).token == TOKEN
    assert resolve_credentials(env=env).token == "arw_from-env"
    assert resolve_credentials(env={"AGENT_REWIND_TOKEN": " arw_padded\n"}).token == "arw_padded"


def test_tls_flags_beat_their_variables(files: dict[str, Path], pki: Pki) -> None:
    env = {
        "AGENT_REWIND_TLS_CA": str(files["other_ca"]),
        "AGENT_REWIND_CLIENT_CERT": str(files["cert"]),
        "AGENT_REWIND_CLIENT_KEY": str(files["key"]),
    }
    from_env = resolve_credentials(env=env).tls
    assert from_env == Tls(ca=pki.other_ca, cert_chain=pki.client_cert, key=pki.client_key)
    flagged = resolve_credentials(tls_ca=str(files["ca"]), env=env).tls
    assert flagged == Tls(ca=pki.ca, cert_chain=pki.client_cert, key=pki.client_key)
    assert resolve_credentials(tls_ca=str(files["ca"]), env={}).tls == Tls(ca=pki.ca)
    # A client certificate alone turns TLS on, trusting the system's roots.
    only_cert = resolve_credentials(tls_cert=str(files["cert"]), tls_key=str(files["key"]), env={}).tls
    assert only_cert == Tls(cert_chain=pki.client_cert, key=pki.client_key)


@pytest.mark.parametrize(
    ("kwargs", "env", "message"),
    [
        ({"tls_cert": "cert"}, {}, "--tls-cert needs --tls-key (or $AGENT_REWIND_CLIENT_KEY)"),
        ({"tls_key": "key"}, {}, "--tls-key needs --tls-cert (or $AGENT_REWIND_CLIENT_CERT)"),
        ({}, {"AGENT_REWIND_CLIENT_KEY": "key"}, "$AGENT_REWIND_CLIENT_KEY needs --tls-cert"),
        ({"token_file": "missing"}, {}, "--token-file: cannot read {dir}/missing: No such file or directory"),
        ({"token_file": "a-dir"}, {}, "--token-file: cannot read {dir}/a-dir: Is a directory"),
        ({"token_file": "empty"}, {"AGENT_REWIND_TOKEN": "arw_x"}, "--token-file: {dir}/empty is empty"),
        ({"token_file": "two-words"}, {}, "--token-file: a token is printable ASCII"),
        ({"token_file": ""}, {}, "--token-file needs a file name"),
        ({}, {"AGENT_REWIND_TLS_CA": "missing"}, "$AGENT_REWIND_TLS_CA: cannot read {dir}/missing"),
        ({"tls_ca": "token"}, {}, "--tls-ca: {dir}/token holds no PEM certificate"),
        ({"tls_cert": "cert", "tls_key": "ca.pem"}, {}, "--tls-key: {dir}/ca.pem holds no PEM private key"),
    ],
)
def test_unusable_credentials_are_usage_errors(
    kwargs: dict[str, str],
    env: dict[str, str],
    message: str,
    files: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-dir").mkdir()
    (tmp_path / "empty").write_text(" \n")
    (tmp_path / "two-words").write_text("arw_a\narw_b\n")
    (tmp_path / "cert").write_bytes(files["cert"].read_bytes())
    (tmp_path / "key").write_bytes(files["key"].read_bytes())
    absolute = {k: str(tmp_path / v) if v not in ("", "cert", "key") else v for k, v in kwargs.items()}
    absolute_env = {k: str(tmp_path / v) if k != "AGENT_REWIND_TOKEN" else v for k, v in env.items()}
    with pytest.raises(UsageError) as err:
        resolve_credentials(**absolute, env=absolute_env)
    assert str(err.value).startswith(message.format(dir=tmp_path))
