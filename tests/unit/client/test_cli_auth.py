"""`agent-rewind` credentials (--token-file, --tls-*, their variables), refusals by the service, and
the `token` commands, against an in-process gRPC server that records each call's metadata."""

from __future__ import annotations

import hashlib
import io
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import agent_rewind.cli
from agent_rewind.access import AccessFile, Permission, parse
from agent_rewind.cli import main

if TYPE_CHECKING:
    from tests.unit.client.conftest import Pki, Serve

TOKEN = "arw_cli-token"
DEFAULT_PERMISSIONS = ["sessions.read", "sessions.write", "rewind", "rewind.preview", "events.read"]


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(f"{TOKEN}\n")
    return path


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The `error:` line of a usage error, which must exit 2 without a traceback."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = [line for line in err.splitlines() if "error:" in line]
    return line


# --- the token on the wire ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["--server", "{a}", "--token-file", "{t}", "capabilities"],
        ["capabilities", "--server", "{a}", "--token-file", "{t}"],
        ["--token-file", "{t}", "session", "list", "--server", "{a}"],
        ["--server", "{a}", "prompt", "s1", "say hi", "--token-file", "{t}"],
    ],
)
def test_the_token_file_is_sent_before_or_after_the_command(
    argv: list[str], serve: Serve, token_file: Path
) -> None:
    address, recorder = serve()
    assert main([a.format(a=address, t=token_file) for a in argv]) == 0
    (call,) = recorder.calls
    assert call.authorizations == [f"Bearer {TOKEN}"]


def test_the_variable_is_the_token_and_the_flag_beats_it(
    serve: Serve, token_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    address, recorder = serve()
    monkeypatch.setenv("AGENT_REWIND_TOKEN", "  arw_from-env\n")
    assert main(["--server", address, "capabilities"]) == 0
    assert main(["--server", address, "capabilities", "--token-file", str(token_file)]) == 0
    assert recorder.authorization() == ["Bearer arw_from-env", f"Bearer {TOKEN}"]


def test_no_token_sends_no_authorization(serve: Serve) -> None:
    address, recorder = serve()
    assert main(["--server", address, "capabilities"]) == 0
    assert recorder.calls[0].authorizations == []


@pytest.mark.parametrize(
    "argv",
    [
        ["capabilities", "--token", TOKEN],
        ["--token", TOKEN, "capabilities"],
        ["capabilities", f"--token={TOKEN}"],
    ],
)
def test_there_is_no_token_flag_and_the_value_is_not_echoed(
    argv: list[str], serve: Serve, capsys: pytest.CaptureFixture[str]
) -> None:
    address, recorder = serve()
    line = usage_error(["--server", address, *argv], capsys)
    assert line.endswith(
        "error: there is no --token flag: a token on the command line shows in process lists and shell "
        "history; put it in a file for --token-file FILE, or in $AGENT_REWIND_TOKEN"
    )
    assert TOKEN not in line
    assert recorder.calls == []


def test_an_abbreviated_token_flag_is_not_taken_for_token_file(
    serve: Serve, capsys: pytest.CaptureFixture[str]
) -> None:
    address, recorder = serve()
    line = usage_error(["--server", address, "capabilities", "--tok", TOKEN], capsys)
    assert "ambiguous option: --tok" in line
    assert TOKEN not in line
    assert recorder.calls == []


def test_a_token_sent_in_the_clear_beyond_loopback_is_warned_about(
    serve: Serve, token_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    address, recorder = serve()
    monkeypatch.setattr(agent_rewind.cli, "is_loopback", lambda server: False)
    assert main(["--server", address, "--token-file", str(token_file), "capabilities"]) == 0
    assert capsys.readouterr().err.splitlines() == [
        f"warning: sending the bearer token to {address} without TLS: anyone on the way can read it "
        "(--tls-ca makes the channel TLS)"
    ]
    assert recorder.calls[0].authorizations == [f"Bearer {TOKEN}"]


# --- TLS --------------------------------------------------------------------------------------------


def test_tls_ca_flag_and_variable(
    serve: Serve,
    pki: Pki,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    files = pki.write(tmp_path)
    address, recorder = serve(tls=pki)
    assert main(["--server", address, "--tls-ca", str(files["ca"]), "--json", "capabilities"]) == 0
    assert json.loads(capsys.readouterr().out)["service_version"] == "test"
    monkeypatch.setenv("AGENT_REWIND_TLS_CA", str(files["ca"]))
    assert main(["--server", address, "capabilities"]) == 0
    # The flag beats the variable: another CA, which did not sign the server's certificate.
    assert main(["--server", address, "capabilities", "--tls-ca", str(files["other_ca"])]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: cannot reach agent-rewind at {address} (")
    assert "not signed by a trusted CA" in line
    assert len(recorder.calls) == 2


def test_mutual_tls_from_variables_and_flags(
    serve: Serve, pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = pki.write(tmp_path)
    address, recorder = serve(tls=pki, client_ca=pki.ca)
    monkeypatch.setenv("AGENT_REWIND_TLS_CA", str(files["ca"]))
    monkeypatch.setenv("AGENT_REWIND_CLIENT_CERT", str(files["cert"]))
    monkeypatch.setenv("AGENT_REWIND_CLIENT_KEY", str(files["key"]))
    assert main(["--server", address, "capabilities"]) == 0
    monkeypatch.delenv("AGENT_REWIND_CLIENT_CERT")
    monkeypatch.delenv("AGENT_REWIND_CLIENT_KEY")
    argv = [
        "--server",
        address,
        "--tls-cert",
        str(files["cert"]),
        "capabilities",
        "--tls-key",
        str(files["key"]),
    ]
    assert main(argv) == 0
    assert [c.common_name for c in recorder.calls] == ["alice", "alice"]


def test_a_tls_server_called_in_plain_text_gets_a_hint(
    serve: Serve, pki: Pki, capsys: pytest.CaptureFixture[str]
) -> None:
    address, _ = serve(tls=pki)
    assert main(["--server", address, "capabilities"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert "if it serves TLS, pass --tls-ca" in line


# --- usage errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (
            ["--token-file", "{d}/missing"],
            {},
            "--token-file: cannot read {d}/missing: No such file or directory",
        ),
        (["--token-file", "{d}"], {}, "--token-file: cannot read {d}: Is a directory"),
        (["--token-file", "{d}/empty"], {}, "--token-file: {d}/empty is empty"),
        (["--tls-ca", "{d}/missing"], {}, "--tls-ca: cannot read {d}/missing: No such file or directory"),
        ([], {"AGENT_REWIND_TLS_CA": "{d}/missing"}, "$AGENT_REWIND_TLS_CA: cannot read {d}/missing"),
        (["--tls-ca", "{d}/empty"], {}, "--tls-ca: {d}/empty holds no PEM certificate"),
        (["--tls-cert", "{d}/cert.pem"], {}, "--tls-cert needs --tls-key (or $AGENT_REWIND_CLIENT_KEY)"),
        ([], {"AGENT_REWIND_CLIENT_KEY": "{d}/key.pem"}, "$AGENT_REWIND_CLIENT_KEY needs --tls-cert"),
        ([], {"AGENT_REWIND_TOKEN": "arw_a b\x01"}, "$AGENT_REWIND_TOKEN: a token is printable ASCII"),
    ],
)
def test_unusable_credentials_exit_2_and_call_nothing(
    argv: list[str],
    env: dict[str, str],
    message: str,
    serve: Serve,
    pki: Pki,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pki.write(tmp_path)
    (tmp_path / "empty").write_text("\n")
    address, recorder = serve()
    for key, value in env.items():
        monkeypatch.setenv(key, value.format(d=tmp_path))
    line = usage_error(["--server", address, "capabilities", *(a.format(d=tmp_path) for a in argv)], capsys)
    assert line.startswith(f"agent-rewind capabilities: error: {message.format(d=tmp_path)}")
    assert recorder.calls == []


# --- refusals -------------------------------------------------------------------------------------


def test_unauthenticated_is_one_line_and_exit_1(
    serve: Serve, token_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    address, _ = serve(token=TOKEN)
    wrong = tmp_path / "wrong"
    wrong.write_text("arw_wrong")
    for extra in ([], ["--token-file", str(wrong)]):
        assert main(["--server", address, "session", "list", *extra]) == 1
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err.splitlines() == [
            "error: UNAUTHENTICATED: the bearer token is not valid; the service admits a token "
            "(--token-file FILE or $AGENT_REWIND_TOKEN) or a client certificate (--tls-cert/--tls-key) "
            "that its access file lists"
        ]
    assert main(["--server", address, "session", "list", "--token-file", str(token_file)]) == 0


def test_unauthenticated_on_a_stream_is_the_same_line(
    serve: Serve, capsys: pytest.CaptureFixture[str]
) -> None:
    address, _ = serve(token=TOKEN)
    assert main(["--server", address, "prompt", "s1", "say hi"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: UNAUTHENTICATED: the bearer token is not valid; ")


def test_permission_denied_is_one_line_and_exit_1(
    serve: Serve, token_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    address, _ = serve(token=TOKEN, denied=("Rewind",))
    argv = ["--server", address, "--token-file", str(token_file), "rewind", "s1", "m1", "--mode", "files"]
    assert main(argv) == 1
    assert capsys.readouterr().err.splitlines() == [
        "error: PERMISSION_DENIED: this call needs the permission 'rewind', which the caller lacks; "
        "ask the service's operator to grant it in the access file"
    ]


# --- token create / token hash ------------------------------------------------------------------


def _create(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[str, dict[str, object], str]:
    """(token, access file entry, stderr) of a text `token create`."""
    assert main(["token", "create", *argv]) == 0
    captured = capsys.readouterr()
    out = captured.out
    match = re.match(r"token: (arw_[A-Za-z0-9_-]{43})\n\n", out)
    assert match, out
    words = " ".join(out.split())
    assert "The token is not stored anywhere" in words and "Keep it secret" in words
    entry = json.loads(out[out.index("\n{\n") :])
    return match.group(1), entry, captured.err


def test_token_create_prints_a_token_and_the_entry_holding_its_hash(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    token, entry, err = _create(["--principal", "billing-backend"], capsys)
    assert err == ""
    assert entry == {
        "name": "billing-backend",
        "permissions": DEFAULT_PERMISSIONS,
        "token_sha256": [hashlib.sha256(token.encode()).hexdigest()],
    }
    by_token, _ = parse({"principals": [entry]})
    (principal,) = by_token.values()
    assert principal.permissions == frozenset(Permission) - {Permission.ADMIN}
    # The service's own access file admits the token as the principal.
    access = tmp_path / "access.json"
    access.write_text(json.dumps({"principals": [entry]}))
    assert AccessFile(access).by_token(token).name == "billing-backend"


def test_token_create_takes_permissions_repeated_or_several_at_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, entry, _ = _create(
        ["--principal", "p", "--permission", "rewind", "sessions.read", "--permission", "admin"], capsys
    )
    assert entry["permissions"] == ["sessions.read", "rewind", "admin"]
    _, entry, _ = _create(
        ["--permission", "events.read", "--permission", "events.read", "--principal", "p"], capsys
    )
    assert entry["permissions"] == ["events.read"]


def test_every_token_is_new(capsys: pytest.CaptureFixture[str]) -> None:
    first, _, _ = _create(["--principal", "p"], capsys)
    second, _, _ = _create(["--principal", "p"], capsys)
    assert first != second


def test_token_create_json_is_one_object_and_the_note_goes_to_stderr(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # It calls no server: credentials that could not be read do not matter.
    monkeypatch.setenv("AGENT_REWIND_TLS_CA", "/nonexistent/ca.pem")
    assert main(["--server", "127.0.0.1:1", "token", "create", "--principal", "ci", "--json"]) == 0
    captured = capsys.readouterr()
    created = json.loads(captured.out)
    assert set(created) == {"token", "entry"}
    assert created["entry"]["token_sha256"] == [hashlib.sha256(created["token"].encode()).hexdigest()]
    assert created["entry"]["name"] == "ci"
    parse({"principals": [created["entry"]]})
    assert "The token is not stored anywhere" in " ".join(captured.err.split())
    assert main(["--json", "token", "create", "--principal", "ci"]) == 0
    assert set(json.loads(capsys.readouterr().out)) == {"token", "entry"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "the following arguments are required: --principal"),
        (["--principal", " "], "argument --principal: a principal needs a name"),
        (["--principal", "p", "--permission", "root"], "argument --permission: not a permission: 'root'"),
        (["--principal", "p", "--permission"], "argument --permission: expected at least one argument"),
    ],
)
def test_token_create_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert message in usage_error(["token", "create", *argv], capsys)


def test_token_hash_prints_the_sha256_of_stdin(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("  arw_existing\n"))
    assert main(["token", "hash"]) == 0
    assert capsys.readouterr().out == hashlib.sha256(b"arw_existing").hexdigest() + "\n"
    monkeypatch.setattr("sys.stdin", io.StringIO("arw_existing"))
    assert main(["token", "hash", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "token_sha256": hashlib.sha256(b"arw_existing").hexdigest()
    }


def test_token_hash_of_a_created_token_is_the_entry_s_hash(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    token, entry, _ = _create(["--principal", "p"], capsys)
    monkeypatch.setattr("sys.stdin", io.StringIO(token + "\n"))
    assert main(["token", "hash"]) == 0
    assert [capsys.readouterr().out.strip()] == entry["token_sha256"]


@pytest.mark.parametrize(
    ("stdin", "message"),
    [("", "no token on stdin"), (" \n", "no token on stdin"), ("a\nb\n", "more than one line")],
)
def test_token_hash_usage_errors(
    stdin: str, message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    assert message in usage_error(["token", "hash"], capsys)
