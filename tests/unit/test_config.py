"""Service configuration from `serve` flags and AGENT_REWIND_* environment fallbacks."""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

import pytest

from agent_rewind import config as serve_config
from agent_rewind.config import Config, add_arguments, from_arguments


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in list(os.environ):
        if key.startswith("AGENT_REWIND_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)


def parse(*argv: str) -> Config:
    return serve_config.parse_args(list(argv), prog="serve")


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The error line of a usage error, which exits 2."""
    with pytest.raises(SystemExit) as exit_info:
        parse(*argv)
    assert exit_info.value.code == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("serve: error: ")]
    return line.removeprefix("serve: error: ")


def test_state_dir_is_resolved_to_an_absolute_path(tmp_path: Path) -> None:
    config = parse("--state-dir", "rel/state")
    assert config.state_dir == tmp_path.resolve() / "rel" / "state"
    assert config.state_dir.is_absolute()


def test_default_state_dir_is_var_under_the_working_directory(tmp_path: Path) -> None:
    assert parse().state_dir == tmp_path.resolve() / "var"


def test_workspace_root_defaults_to_state_workspaces(tmp_path: Path) -> None:
    config = parse("--state-dir", "s")
    assert config.workspace_roots == (tmp_path.resolve() / "s" / "workspaces",)
    assert config.default_workspace_root == tmp_path.resolve() / "s" / "workspaces"


def test_workspace_roots_are_resolved_in_order(tmp_path: Path) -> None:
    config = parse(
        "--state-dir", "s", "--workspace-root", "a", "--workspace-root", str(tmp_path / "b" / "..")
    )
    assert config.workspace_roots == (tmp_path.resolve() / "a", tmp_path.resolve())
    assert config.default_workspace_root == tmp_path.resolve() / "a"


def test_paths_expand_the_home_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    config = parse("--state-dir", "~/state", "--workspace-root", "~/ws")
    assert config.state_dir == (tmp_path / "home" / "state").resolve()
    assert config.workspace_roots == ((tmp_path / "home" / "ws").resolve(),)


def test_workspace_roots_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AGENT_REWIND_WORKSPACE_ROOTS", os.pathsep.join(["x", str(tmp_path / "y")]))
    config = parse("--state-dir", "s")
    assert config.workspace_roots == (tmp_path.resolve() / "x", tmp_path.resolve() / "y")


def test_workspace_root_flag_wins_over_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AGENT_REWIND_WORKSPACE_ROOTS", "from-env")
    config = parse("--workspace-root", "from-flag")
    assert config.workspace_roots == (tmp_path.resolve() / "from-flag",)


def test_state_paths_live_under_the_state_dir(tmp_path: Path) -> None:
    config = parse("--state-dir", "s")
    state = tmp_path.resolve() / "s"
    assert config.claude_config_dir == state / "claude"
    assert config.ledger_path == state / "ledger.sqlite3"


def test_flag_defaults() -> None:
    config = parse()
    assert config.listen == "127.0.0.1:50051"
    assert config.model == "auto"
    assert config.shutdown_grace == 10.0
    assert config.idle_timeout == 300.0
    assert config.log_format == "auto"
    assert config.log_level == "info"


def test_environment_fallbacks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AGENT_REWIND_LISTEN", "0.0.0.0:6000")
    monkeypatch.setenv("AGENT_REWIND_STATE_DIR", "env-state")
    monkeypatch.setenv("AGENT_REWIND_MODEL", "offline")
    monkeypatch.setenv("AGENT_REWIND_SHUTDOWN_GRACE", "2.5")
    monkeypatch.setenv("AGENT_REWIND_IDLE_TIMEOUT", "0")
    monkeypatch.setenv("AGENT_REWIND_LOG_FORMAT", "json")
    monkeypatch.setenv("AGENT_REWIND_LOG_LEVEL", "debug")
    config = parse()
    assert config.listen == "0.0.0.0:6000"
    assert config.state_dir == tmp_path.resolve() / "env-state"
    assert config.model == "offline"
    assert config.shutdown_grace == 2.5
    assert config.idle_timeout == 0.0
    assert (config.log_format, config.log_level) == ("json", "debug")


def test_flags_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_REWIND_MODEL", "offline")
    monkeypatch.setenv("AGENT_REWIND_IDLE_TIMEOUT", "5")
    config = parse("--model", "anthropic", "--idle-timeout", "7")
    assert config.model == "anthropic"
    assert config.idle_timeout == 7.0


def test_unknown_model_backend_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert refused(["--model", "gpt"], capsys).startswith("argument --model: invalid choice: 'gpt'")


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("AGENT_REWIND_IDLE_TIMEOUT", "abc", "not a number of seconds: 'abc'"),
        ("AGENT_REWIND_SHUTDOWN_GRACE", "-1", "must be a finite number of seconds, 0 or more: '-1'"),
        ("AGENT_REWIND_IDLE_TIMEOUT", "nan", "must be a finite number of seconds, 0 or more: 'nan'"),
        (
            "AGENT_REWIND_MODEL",
            "offlin",
            "invalid choice: 'offlin' (choose from 'auto', 'offline', 'anthropic')",
        ),
        ("AGENT_REWIND_LOG_FORMAT", "text", "invalid choice: 'text' (choose from 'auto', 'json', 'console')"),
        ("AGENT_REWIND_LOG_LEVEL", "loud", "invalid choice: 'loud'"),
    ],
)
def test_a_bad_environment_value_is_a_usage_error_naming_the_variable(
    variable: str,
    value: str,
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(variable, value)
    flag = "--" + variable.removeprefix("AGENT_REWIND_").lower().replace("_", "-")
    assert refused([], capsys).startswith(f"environment variable {variable} ({flag}): {message}")


def test_a_bad_environment_value_is_not_read_when_the_flag_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_REWIND_MODEL", "offlin")
    monkeypatch.setenv("AGENT_REWIND_IDLE_TIMEOUT", "abc")
    config = parse("--model", "offline", "--idle-timeout", "1")
    assert (config.model, config.idle_timeout) == ("offline", 1.0)


def test_an_empty_variable_counts_as_unset(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for flag in serve_config.SERVE_FLAGS:
        monkeypatch.setenv(flag.env_var, "")
    config = parse()
    assert (config.model, config.idle_timeout, config.log_level) == ("auto", 300.0, "info")
    assert config.workspace_roots == (tmp_path.resolve() / "var" / "workspaces",)


def test_empty_entries_of_the_workspace_roots_variable_are_skipped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AGENT_REWIND_WORKSPACE_ROOTS", os.pathsep.join(["", "a", "", "b", ""]))
    assert parse().workspace_roots == (tmp_path.resolve() / "a", tmp_path.resolve() / "b")


@pytest.mark.parametrize("value", ["-1", "inf", "nan", "soon"])
def test_durations_must_be_finite_and_not_negative(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert refused([f"--shutdown-grace={value}"], capsys).startswith("argument --shutdown-grace: ")


def test_the_log_level_is_taken_in_any_case() -> None:
    assert parse("--log-level", "WARNING").log_level == "warning"


def test_the_parse_of_add_arguments_with_from_arguments_gives_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGENT_REWIND_MODEL", "offline")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    ns = parser.parse_args(["--listen", "h:1"])
    assert from_arguments(ns) == parse("--listen", "h:1")
    assert from_arguments(ns, {}).model == "auto"  # an explicit environment replaces os.environ


def test_every_flag_sets_a_config_field_and_shows_its_default() -> None:
    fields = {f.name for f in dataclasses.fields(Config)}
    assert serve_config.SERVE_FLAGS
    for flag in serve_config.SERVE_FLAGS:
        assert flag.config_field in fields
        assert flag.env_var.startswith("AGENT_REWIND_")
        assert flag.help_text().endswith(f"default {flag.default_text()})")
    assert len({flag.env_var for flag in serve_config.SERVE_FLAGS}) == len(serve_config.SERVE_FLAGS)


# --- a flag declared later gets the same treatment ----------------------------------------------


def later_flag() -> serve_config.Flag:
    """A flag as the many still to come will be declared: one row."""
    return serve_config.Flag(
        "--max-live-sessions",
        "max_live_sessions",
        "live CLI processes at most",
        convert=int,
        default_help="64",
    )


def test_a_new_flag_row_gives_its_argument_and_help() -> None:
    later = later_flag()
    parser = argparse.ArgumentParser()
    later.add_to(parser)
    assert parser.parse_args(["--max-live-sessions", "3"]).max_live_sessions == 3
    assert parser.parse_args([]).max_live_sessions is None  # absent: the environment decides
    assert later.env_var == "AGENT_REWIND_MAX_LIVE_SESSIONS"
    assert later.help_text() == "live CLI processes at most (env AGENT_REWIND_MAX_LIVE_SESSIONS, default 64)"


def test_a_new_flag_row_gives_its_checked_environment_fallback() -> None:
    later = later_flag()
    assert later.from_environment({"AGENT_REWIND_MAX_LIVE_SESSIONS": "8"}) == 8
    assert later.from_environment({}) is None
    with pytest.raises(argparse.ArgumentError) as err:
        later.from_environment({"AGENT_REWIND_MAX_LIVE_SESSIONS": "lots"})
    assert str(err.value) == (
        "environment variable AGENT_REWIND_MAX_LIVE_SESSIONS (--max-live-sessions): invalid int value: 'lots'"
    )


def test_a_value_starting_with_a_dash_is_a_value_not_a_flag() -> None:
    later = later_flag()
    assert later.from_environment({"AGENT_REWIND_MAX_LIVE_SESSIONS": "-2"}) == -2


def test_resolved_is_idempotent(tmp_path: Path) -> None:
    config = parse("--state-dir", "s")
    assert config.resolved() == config


def later_switch() -> serve_config.Flag:
    return serve_config.Flag(
        "--workspace-snapshots",
        "workspace_snapshots",
        "snapshot workspaces",
        switch=True,
        default_help="false",
    )


def test_a_new_yes_no_flag_row_gives_both_forms_and_its_help() -> None:
    later = later_switch()
    parser = argparse.ArgumentParser()
    later.add_to(parser)
    assert parser.parse_args(["--workspace-snapshots"]).workspace_snapshots is True
    assert parser.parse_args(["--no-workspace-snapshots"]).workspace_snapshots is False
    assert parser.parse_args([]).workspace_snapshots is None
    assert later.help_text() == (
        "snapshot workspaces (env AGENT_REWIND_WORKSPACE_SNAPSHOTS, true or false, default false)"
    )


@pytest.mark.parametrize(
    ("text", "value"), [("true", True), ("1", True), ("Yes", True), ("off", False), ("0", False)]
)
def test_a_yes_no_variable_says_true_or_false(text: str, value: bool) -> None:
    assert later_switch().from_environment({"AGENT_REWIND_WORKSPACE_SNAPSHOTS": text}) is value


def test_a_yes_no_variable_refuses_anything_else() -> None:
    with pytest.raises(argparse.ArgumentError) as err:
        later_switch().from_environment({"AGENT_REWIND_WORKSPACE_SNAPSHOTS": "maybe"})
    assert str(err.value) == (
        "environment variable AGENT_REWIND_WORKSPACE_SNAPSHOTS (--workspace-snapshots): "
        "invalid boolean value: 'maybe' (use true or false)"
    )


def test_the_cli_runs_nicer_than_the_service_by_default_and_cli_nice_bounds_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert parse().cli_nice == 10
    assert parse("--cli-nice", "0").cli_nice == 0
    assert parse("--cli-nice", "19").cli_nice == 19
    assert "must be 19 or less: '20'" in refused(["--cli-nice", "20"], capsys)
    assert "must be 0 or more: '-1'" in refused(["--cli-nice=-1"], capsys)
