"""What DeleteSession erases of the CLI's files, and how it treats the workspace: everything of
the session (found by name, by the live-process record, in the prompt history), nothing of any
other session, and never anything a symbolic link points at."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_rewind.sessions.erasure import WorkspaceRefused, erase_cli_files, remove_workspace

SID = "0b7f3c1e-5a8d-4d6e-9f10-2a3b4c5d6e7f"
OTHER = "1c8e4d2f-6b9e-4e7f-8a21-3b4c5d6e7f80"


def _write(path: Path, text: str = "content") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _cli_dir(config: Path, sid: str, cwd: str) -> list[Path]:
    """What the CLI leaves of a session (as observed, and the names it uses elsewhere)."""
    project = config / "projects" / cwd.replace("/", "-")
    return [
        _write(project / f"{sid}.jsonl"),
        _write(project / sid / "subagents" / "agent-a1.jsonl"),
        _write(project / sid / "subagents" / "agent-a1.meta.json"),
        _write(project / sid / "tool-results" / "t1.txt"),
        _write(config / "file-history" / sid / "3311ca829bc48670@v2"),
        _write(config / "session-env" / sid / "env"),
        _write(config / "tasks" / sid / "1.json"),
        _write(config / "todos" / f"{sid}-agent-{sid}.json"),
        _write(config / "debug" / f"{sid}.txt"),
        _write(config / "startup-perf" / f"{sid}.json"),
    ]


def test_everything_the_cli_keeps_of_the_session_goes_and_nothing_of_another(tmp_path: Path) -> None:
    config = tmp_path / "claude"
    mine = _cli_dir(config, SID, "/ws/mine")
    theirs = _cli_dir(config, OTHER, "/ws/theirs")
    shared = [
        _write(config / ".claude.json", "{}"),
        _write(config / "shell-snapshots" / "snapshot-bash-1.sh"),
    ]
    removed = erase_cli_files(config, SID, "/ws/mine")
    assert not any(p.exists() for p in mine)
    assert all(p.exists() for p in theirs + shared)
    assert not (config / "projects" / "-ws-mine").exists(), "its project directory, now empty"
    assert (config / "projects" / "-ws-theirs").is_dir()
    assert config / "projects" / "-ws-mine" / f"{SID}.jsonl" in removed
    assert erase_cli_files(config, SID, "/ws/mine") == [], "idempotent"


def test_a_project_directory_shared_with_another_session_stays(tmp_path: Path) -> None:
    config = tmp_path / "claude"
    project = config / "projects" / "-ws-a"
    _write(project / f"{SID}.jsonl")
    _write(project / f"{OTHER}.jsonl")
    erase_cli_files(config, SID)
    assert sorted(p.name for p in project.iterdir()) == [f"{OTHER}.jsonl"]


def test_the_record_of_a_process_that_ran_the_session_goes(tmp_path: Path) -> None:
    """`sessions/<pid>.json` names the session; a killed CLI leaves it (and its key) behind."""
    config = tmp_path / "claude"
    live = config / "sessions"
    _write(live / "1442.json", json.dumps({"pid": 1442, "sessionId": SID, "cwd": "/ws/mine"}))
    _write(live / "1442.3bb8a6.key", "{}")
    _write(live / "1500.json", json.dumps({"pid": 1500, "sessionId": OTHER}))
    _write(live / "1500.aa11.key", "{}")
    _write(live / "1600.json", "not json")
    erase_cli_files(config, SID)
    assert sorted(p.name for p in live.iterdir()) == ["1500.aa11.key", "1500.json", "1600.json"]


def test_prompt_history_lines_of_the_session_or_its_workspace_are_dropped(tmp_path: Path) -> None:
    config = tmp_path / "claude"
    lines = [
        {"display": "mine", "sessionId": SID, "project": "/ws/mine"},
        {"display": "theirs", "sessionId": OTHER, "project": "/ws/theirs"},
        {"display": "mine, an older line without a session", "project": "/ws/mine"},
    ]
    history = _write(config / "history.jsonl", "".join(json.dumps(line) + "\n" for line in lines))
    removed = erase_cli_files(config, SID, "/ws/mine")
    assert history in removed
    assert [json.loads(line)["display"] for line in history.read_text().splitlines()] == ["theirs"]
    before = history.read_text()
    assert erase_cli_files(config, SID, "/ws/mine") == []
    assert history.read_text() == before


def test_a_link_named_after_the_session_is_removed_not_what_it_points_at(tmp_path: Path) -> None:
    config = tmp_path / "claude"
    outside = _write(tmp_path / "elsewhere" / "precious.txt")
    (config / "file-history").mkdir(parents=True)
    (config / "file-history" / SID).symlink_to(outside.parent)
    _write(config / "session-env" / SID / "env")
    (config / "session-env" / SID / "inner").symlink_to(outside.parent)
    erase_cli_files(config, SID)
    assert not (config / "file-history" / SID).is_symlink()
    assert not (config / "session-env" / SID).exists()
    assert outside.read_text() == "content"


def test_an_id_too_short_to_be_a_session_s_is_refused(tmp_path: Path) -> None:
    _write(tmp_path / "claude" / "file-history" / "x")
    with pytest.raises(ValueError):
        erase_cli_files(tmp_path / "claude", "")
    assert (tmp_path / "claude" / "file-history" / "x").exists()


# The workspace


def test_a_workspace_inside_a_root_is_deleted_links_in_it_as_links(tmp_path: Path) -> None:
    root = tmp_path / "workspaces"
    outside = _write(tmp_path / "elsewhere" / "precious.txt")
    workspace = root / "a"
    _write(workspace / "src" / "main.py")
    (workspace / "link").symlink_to(outside.parent)
    assert remove_workspace(str(workspace), [root])
    assert not workspace.exists() and root.is_dir()
    assert outside.read_text() == "content"
    assert not remove_workspace(str(workspace), [root]), "already gone"


def test_a_workspace_replaced_by_a_link_loses_the_link_only(tmp_path: Path) -> None:
    root = tmp_path / "workspaces"
    outside = _write(tmp_path / "elsewhere" / "precious.txt")
    root.mkdir()
    (root / "a").symlink_to(outside.parent)
    assert remove_workspace(str(root / "a"), [root])
    assert not (root / "a").is_symlink() and outside.read_text() == "content"


def test_a_workspace_reached_through_a_link_or_outside_the_roots_is_left_alone(tmp_path: Path) -> None:
    root = tmp_path / "workspaces"
    outside = _write(tmp_path / "elsewhere" / "inner" / "precious.txt")
    root.mkdir()
    (root / "proj").symlink_to(outside.parent.parent)  # a parent of the workspace became a link
    for cwd in (root / "proj" / "inner", root, tmp_path / "elsewhere" / "inner", Path("relative")):
        with pytest.raises(WorkspaceRefused):
            remove_workspace(str(cwd), [root])
    assert outside.read_text() == "content"
