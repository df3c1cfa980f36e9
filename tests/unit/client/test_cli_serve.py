"""`agent-rewind serve`: its flags, their AGENT_REWIND_* fallbacks and its help, without starting a server.

`agent_rewind.server.run` is replaced by a recorder, so each test sees the Config `serve` would run with.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import agent_rewind.server
from agent_rewind import config as serve_config
from agent_rewind.cli import main
from agent_rewind.config import Config


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in list(os.environ):
        if key.startswith("AGENT_REWIND_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Config]]:
    """The Configs `serve` handed to the server, which is never started."""
    seen: list[Config] = []

    def run(config: Config) -> int:
        seen.append(config)
        return 0

    monkeypatch.setattr(agent_rewind.server, "run", run)
    yield seen


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The `error:` line of a usage error, which must exit 2."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = [line for line in err.splitlines() if "error:" in line]
    return line


def test_serve_runs_with_its_flags(runs: list[Config], tmp_path: Path) -> None:
    argv = ["serve", "--listen", "0.0.0.0:1", "--model", "offline", "--idle-timeout", "7", "--state-dir", "s"]
    assert main(argv) == 0
    (config,) = runs
    assert (config.listen, config.model, config.idle_timeout) == ("0.0.0.0:1", "offline", 7.0)
    assert config.state_dir == tmp_path.resolve() / "s"


def test_serve_takes_its_environment(
    runs: list[Config], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AGENT_REWIND_MODEL", "anthropic")
    monkeypatch.setenv("AGENT_REWIND_WORKSPACE_ROOTS", os.pathsep.join(["a", "b"]))
    assert main(["serve"]) == 0
    (config,) = runs
    assert config.model == "anthropic"
    assert config.workspace_roots == (tmp_path.resolve() / "a", tmp_path.resolve() / "b")


# --- 1. a malformed variable is a usage error of `serve` only -----------------------------------


def test_a_malformed_variable_is_a_serve_usage_error_naming_it(
    runs: list[Config], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AGENT_REWIND_IDLE_TIMEOUT", "abc")
    assert usage_error(["serve"], capsys) == (
        "agent-rewind serve: error: environment variable AGENT_REWIND_IDLE_TIMEOUT (--idle-timeout): "
        "not a number of seconds: 'abc'"
    )
    assert runs == []


# --- 2. environment values are checked exactly as the flags are ---------------------------------


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--model", "offlin"),
        ("--log-format", "xml"),
        ("--log-level", "verbose"),
        ("--idle-timeout", "abc"),
        ("--idle-timeout", "-1"),
        ("--shutdown-grace", "inf"),
    ],
)
def test_an_environment_value_is_refused_as_the_flag_refuses_it(
    flag: str,
    value: str,
    runs: list[Config],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from_flag = usage_error(["serve", f"{flag}={value}"], capsys)
    variable = "AGENT_REWIND_" + flag.removeprefix("--").replace("-", "_").upper()
    monkeypatch.setenv(variable, value)
    from_env = usage_error(["serve"], capsys)
    reason = from_flag.removeprefix(f"agent-rewind serve: error: argument {flag}: ")
    assert reason != from_flag
    assert from_env == f"agent-rewind serve: error: environment variable {variable} ({flag}): {reason}"
    assert runs == []


def test_an_unknown_model_backend_from_the_environment_lists_the_choices(
    runs: list[Config], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AGENT_REWIND_MODEL", "offlin")
    line = usage_error(["serve"], capsys)
    assert "AGENT_REWIND_MODEL" in line
    assert "invalid choice: 'offlin'" in line
    assert "'offline'" in line


def test_a_variable_is_converted_as_the_flag_is(runs: list[Config], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_REWIND_LOG_LEVEL", "DEBUG")
    monkeypatch.setenv("AGENT_REWIND_SHUTDOWN_GRACE", "2.5")
    assert main(["serve", "--log-format", "json"]) == 0
    (config,) = runs
    assert (config.log_level, config.shutdown_grace, config.log_format) == ("debug", 2.5, "json")


# --- 3. `serve --help` shows every flag's variable and default ----------------------------------


def serve_help(capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--help"])
    assert exit_info.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines where it likes


def help_entries(text: str) -> dict[str, str]:
    """Each flag's entry under `options:`: from its name up to the next flag's."""
    body = text.split(" options: ", 1)[1]
    names = "|".join(re.escape(flag.name) for flag in serve_config.SERVE_FLAGS)
    # A yes/no flag's entry opens with both its forms: "--x, --no-x".
    parts = re.split(rf"(?:^| )({names})(?:, --no-[a-z-]+)? ", body)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


@pytest.mark.parametrize(
    ("flag", "entry_end"),
    [
        ("--listen", "(env AGENT_REWIND_LISTEN, default 127.0.0.1:50051)"),
        ("--state-dir", "(env AGENT_REWIND_STATE_DIR, default ./var)"),
        (
            "--workspace-root",
            f"(env AGENT_REWIND_WORKSPACE_ROOTS, several separated by {os.pathsep!r}, "
            "default workspaces/ in the state dir)",
        ),
        ("--model", "(env AGENT_REWIND_MODEL, default auto)"),
        ("--shutdown-grace", "(env AGENT_REWIND_SHUTDOWN_GRACE, default 10)"),
        ("--idle-timeout", "(env AGENT_REWIND_IDLE_TIMEOUT, default 300)"),
        ("--log-format", "(env AGENT_REWIND_LOG_FORMAT, default auto)"),
        ("--log-level", "(env AGENT_REWIND_LOG_LEVEL, default info)"),
    ],
)
def test_serve_help_shows_each_flags_variable_and_default(
    flag: str, entry_end: str, capsys: pytest.CaptureFixture[str]
) -> None:
    entry = help_entries(serve_help(capsys))[flag]
    assert entry.endswith(entry_end)
    assert len(entry) > len(entry_end) + 10  # a description before it


def test_serve_help_covers_every_declared_flag(capsys: pytest.CaptureFixture[str]) -> None:
    entries = help_entries(serve_help(capsys))
    assert serve_config.SERVE_FLAGS
    assert list(entries) == [flag.name for flag in serve_config.SERVE_FLAGS]
    for flag in serve_config.SERVE_FLAGS:
        assert f"(env {flag.env_var}" in entries[flag.name]


def test_the_command_list_names_serve(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "serve" in capsys.readouterr().out


def test_an_unknown_serve_flag_is_a_usage_error(
    runs: list[Config], capsys: pytest.CaptureFixture[str]
) -> None:
    assert usage_error(["serve", "--bogus"], capsys) == (
        "agent-rewind serve: error: unrecognized arguments: --bogus"
    )
    assert runs == []


def test_an_unknown_client_flag_is_still_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert usage_error(["--server", "127.0.0.1:1", "capabilities", "--bogus"], capsys) == (
        "agent-rewind capabilities: error: unrecognized arguments: --bogus"
    )
