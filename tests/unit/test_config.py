"""Service configuration from `serve` flags and AGENT_REWIND_* environment fallbacks."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from agent_rewind.config import Config, add_arguments, from_arguments


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in list(os.environ):
        if key.startswith("AGENT_REWIND_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)


def parse(*argv: str) -> Config:
    # The parser reads the environment when it is built, so build it after monkeypatching.
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return from_arguments(parser.parse_args(list(argv)))


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


def test_unknown_model_backend_is_refused() -> None:
    with pytest.raises(SystemExit):
        parse("--model", "gpt")


def test_resolved_is_idempotent(tmp_path: Path) -> None:
    config = parse("--state-dir", "s")
    assert config.resolved() == config
