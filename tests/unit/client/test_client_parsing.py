"""Command-line values: SDK options, rewind modes and scopes, prompt text, the server address, the parser."""

from __future__ import annotations

import io

import pytest
from google.protobuf import json_format

from agent_rewind.api.v1 import rewind_pb2
from agent_rewind.cli import build_parser, main
from agent_rewind.client import (
    DEFAULT_SERVER,
    UsageError,
    build_options,
    mode_name,
    parse_mode,
    parse_option,
    parse_scope,
    read_prompt_text,
    resolve_server,
    scope_name,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("model=claude-sonnet-4-5", ("model", "claude-sonnet-4-5")),
        ("max_turns=5", ("max_turns", 5)),
        ('allowed_tools=["Read","Write"]', ("allowed_tools", ["Read", "Write"])),
        ("include_partial_messages=true", ("include_partial_messages", True)),
        ('mcp_servers={"x": {"command": "y"}}', ("mcp_servers", {"x": {"command": "y"}})),
        ('system_prompt="quoted"', ("system_prompt", "quoted")),
        ("system_prompt=be brief, please", ("system_prompt", "be brief, please")),
        ("env=A=B", ("env", "A=B")),
        ("empty=", ("empty", "")),
        (" model =x", ("model", "x")),
        ("nothing=null", ("nothing", None)),
    ],
)
def test_option_value_is_json_else_plain_string(text: str, expected: tuple[str, object]) -> None:
    assert parse_option(text) == expected


@pytest.mark.parametrize("text", ["model", "=x", " =x", ""])
def test_option_without_key_or_equals_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError, match="KEY=VALUE"):
        parse_option(text)


def test_options_json_is_the_base_and_each_option_overrides_it() -> None:
    struct = build_options(["model=b", "max_turns=3"], '{"model": "a", "permission_mode": "acceptEdits"}')
    assert json_format.MessageToDict(struct) == {
        "model": "b",
        "permission_mode": "acceptEdits",
        "max_turns": 3.0,
    }


def test_no_options_give_an_empty_struct() -> None:
    assert not build_options().fields


@pytest.mark.parametrize(
    ("options_json", "message"),
    [("[1, 2]", "must be a JSON object"), ("{model: x}", "not valid JSON"), ('"x"', "must be a JSON object")],
)
def test_bad_options_json_is_a_usage_error(options_json: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        build_options((), options_json)


@pytest.mark.parametrize(
    ("text", "mode"),
    [
        ("files", rewind_pb2.REWIND_MODE_FILES),
        ("conversation", rewind_pb2.REWIND_MODE_CONVERSATION),
        ("both", rewind_pb2.REWIND_MODE_BOTH),
        ("BOTH", rewind_pb2.REWIND_MODE_BOTH),
        (" Files ", rewind_pb2.REWIND_MODE_FILES),
    ],
)
def test_mode_names(text: str, mode: int) -> None:
    assert parse_mode(text) == mode


@pytest.mark.parametrize("text", ["all", "file", "REWIND_MODE_BOTH", ""])
def test_unknown_mode_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError, match="mode must be one of files, conversation, both"):
        parse_mode(text)


def test_unspecified_mode_reads_as_files() -> None:
    assert mode_name(rewind_pb2.REWIND_MODE_UNSPECIFIED) == "files"
    assert mode_name(rewind_pb2.REWIND_MODE_BOTH) == "both"


@pytest.mark.parametrize(
    ("text", "scope"),
    [
        ("since", rewind_pb2.REWIND_SCOPE_SINCE),
        ("turn", rewind_pb2.REWIND_SCOPE_TURN),
        (" Turn ", rewind_pb2.REWIND_SCOPE_TURN),
    ],
)
def test_scope_names(text: str, scope: int) -> None:
    assert parse_scope(text) == scope


@pytest.mark.parametrize("text", ["", "turns", "REWIND_SCOPE_TURN", "all"])
def test_unknown_scope_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError, match="scope must be one of since, turn"):
        parse_scope(text)


def test_unspecified_scope_reads_as_since_and_an_unknown_one_as_its_number() -> None:
    assert scope_name(rewind_pb2.REWIND_SCOPE_UNSPECIFIED) == "since"
    assert scope_name(rewind_pb2.REWIND_SCOPE_TURN) == "turn"
    assert scope_name(7) == "7"  # type: ignore[arg-type]  # a newer server's scope


def test_dash_reads_the_prompt_from_stdin_without_the_pipe_newline() -> None:
    assert read_prompt_text("-", io.StringIO("write a.txt x\nsay done\n")) == "write a.txt x\nsay done"
    assert read_prompt_text("say hi", io.StringIO("ignored")) == "say hi"


def test_server_comes_from_the_flag_then_the_environment_then_the_default() -> None:
    env = {"AGENT_REWIND_SERVER": "10.0.0.1:9"}
    assert resolve_server("h:1", env) == "h:1"
    assert resolve_server(None, env) == "10.0.0.1:9"
    assert resolve_server(None, {}) == DEFAULT_SERVER == "127.0.0.1:50051"


# --- the parser ---------------------------------------------------------------------------------


def test_server_and_json_are_accepted_before_or_after_the_command() -> None:
    parser = build_parser()
    before = parser.parse_args(["--server", "h:1", "--json", "session", "list"])
    after = parser.parse_args(["session", "list", "--server", "h:2", "--json"])
    neither = parser.parse_args(["capabilities"])
    assert (before.server, before.json) == ("h:1", True)
    assert (after.server, after.json) == ("h:2", True)
    assert (neither.server, neither.json) == (None, False)


def test_rewind_arguments() -> None:
    args = build_parser().parse_args(
        ["rewind", "sid", "mid", "--mode", "both", "--dry-run", "--expect-last", "last", "--request-id", "r"]
    )
    assert (args.session_id, args.message_id, args.mode) == ("sid", "mid", rewind_pb2.REWIND_MODE_BOTH)
    assert (args.dry_run, args.expect_last, args.request_id) == (True, "last", "r")


def test_rewind_without_expect_last_sends_no_precondition() -> None:
    args = build_parser().parse_args(["rewind", "sid", "mid", "--mode", "files"])
    assert args.expect_last is None
    assert args.dry_run is False


def test_rewind_path_repeats_in_order_and_scope_defaults_to_unspecified() -> None:
    args = build_parser().parse_args(
        ["rewind", "sid", "mid", "--mode", "files", "--path", "src/", "--scope", "turn", "--path", "a b.txt"]
    )
    assert (args.paths, args.scope) == (["src/", "a b.txt"], rewind_pb2.REWIND_SCOPE_TURN)
    plain = build_parser().parse_args(["rewind", "sid", "mid", "--mode", "files"])
    # Nothing narrowed: the request's own defaults, which the server reads as every path, since.
    assert (plain.paths, plain.scope) == ([], rewind_pb2.REWIND_SCOPE_UNSPECIFIED)


@pytest.mark.parametrize(
    "argv",
    [
        ["rewind", "sid", "mid"],
        ["rewind", "sid", "mid", "--mode", "everything"],
        ["points", "sid", "--page-size", "-1"],
        ["points", "sid", "--page-size", "ten"],
        ["session"],
        [],
        ["prompt", "sid"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    assert exit_info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_session_create_arguments() -> None:
    args = build_parser().parse_args(
        [
            "session",
            "create",
            "--cwd",
            "/w",
            "--no-checkpointing",
            "--option",
            "model=x",
            "--option",
            "max_turns=2",
            "--options-json",
            "{}",
        ]
    )
    assert args.cwd == "/w"
    assert args.no_checkpointing is True
    assert args.option == ["model=x", "max_turns=2"]
    assert args.options_json == "{}"


def test_a_bad_option_exits_2_before_any_call(capsys: pytest.CaptureFixture[str]) -> None:
    # Port 1 on loopback: were a call attempted, it would fail with exit code 1, not 2.
    with pytest.raises(SystemExit) as exit_info:
        main(["--server", "127.0.0.1:1", "session", "create", "--option", "model"])
    assert exit_info.value.code == 2
    assert (
        "agent-rewind session create: error: --option expects KEY=VALUE, got 'model'"
        in capsys.readouterr().err
    )


def test_prompt_arguments() -> None:
    args = build_parser().parse_args(["prompt", "sid", "say hi", "--request-id", "r"])
    assert (args.session_id, args.text, args.request_id) == ("sid", "say hi", "r")
    assert build_parser().parse_args(["prompt", "sid", "say hi"]).request_id is None


def test_building_the_parser_reads_no_serve_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_REWIND_IDLE_TIMEOUT", "abc")
    monkeypatch.setenv("AGENT_REWIND_MODEL", "offlin")
    assert build_parser().parse_args(["capabilities"]).command == "capabilities"
