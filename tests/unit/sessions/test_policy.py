"""The tool policy (sessions/policy.py): file tools stay inside the workspace whatever the session
allows, and any other tool runs only when the session's allowed_tools names it."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest

from agent_rewind.sessions.policy import FILE_TOOLS, ToolPolicy


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "workspaces" / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "notes.txt").write_text("x")
    return ws


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    place = tmp_path / "outside"
    place.mkdir()
    (place / "secret.txt").write_text("s")
    return place


def allows(policy: ToolPolicy, tool: str, tool_input: dict[str, Any]) -> bool:
    """What both questions answer; they must agree for file tools."""
    permission = policy.permission(tool, tool_input)
    confinement = policy.confinement(tool, tool_input)
    if tool in FILE_TOOLS:
        assert permission == confinement, (tool, tool_input)
    if not permission.allow:
        assert permission.message
    return permission.allow


def test_the_file_tools() -> None:
    assert (
        frozenset({"Read", "Write", "Edit", "MultiEdit", "NotebookEdit", "Glob", "Grep", "LS"}) == FILE_TOOLS
    )


# Inside and outside


@pytest.mark.parametrize("tool", sorted(FILE_TOOLS - {"NotebookEdit"}))
def test_file_tools_inside_the_workspace_are_allowed(workspace: Path, tool: str) -> None:
    policy = ToolPolicy(workspace, [])
    key = "path" if tool in ("Glob", "Grep", "LS") else "file_path"
    for path in (
        "notes.txt",
        "sub/new.py",
        "./sub/../notes.txt",
        str(workspace / "sub" / "x.py"),
        str(workspace),
    ):
        assert allows(policy, tool, {key: path, "pattern": "*"}), (tool, path)


def test_a_file_tool_without_a_path_works_in_the_workspace(workspace: Path) -> None:
    policy = ToolPolicy(workspace, [])
    assert allows(policy, "Grep", {"pattern": "TODO"})
    assert allows(policy, "LS", {})
    assert allows(policy, "Glob", {"pattern": "**/*.py"})


def test_absolute_paths_outside_are_denied(workspace: Path, outside: Path) -> None:
    policy = ToolPolicy(workspace, [])
    decision = policy.confinement("Write", {"file_path": "/etc/passwd", "content": "x"})
    assert not decision.allow
    assert "outside" in decision.message
    assert not allows(policy, "Read", {"file_path": str(outside / "secret.txt")})
    assert not allows(policy, "Edit", {"file_path": "/"})
    assert not allows(policy, "NotebookEdit", {"notebook_path": "/etc/x.ipynb"})
    assert not allows(policy, "Grep", {"pattern": "x", "path": "/etc"})
    assert not allows(policy, "LS", {"path": str(outside)})


def test_dot_dot_escapes_are_denied(workspace: Path) -> None:
    policy = ToolPolicy(workspace, [])
    assert not allows(policy, "Write", {"file_path": "../elsewhere/x.txt"})
    assert not allows(policy, "Write", {"file_path": "sub/../../x.txt"})
    assert not allows(policy, "Edit", {"file_path": str(workspace / "a" / ".." / ".." / "x")})
    assert not allows(policy, "LS", {"path": ".."})


def test_a_sibling_with_the_workspace_as_prefix_is_outside(workspace: Path) -> None:
    sibling = workspace.parent / (workspace.name + "-evil")
    sibling.mkdir()
    assert not allows(ToolPolicy(workspace, []), "Write", {"file_path": str(sibling / "x")})


def test_home_paths_are_expanded(workspace: Path, outside: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    policy = ToolPolicy(workspace, [])
    monkeypatch.setenv("HOME", str(outside))
    assert not allows(policy, "Read", {"file_path": "~/secret.txt"})
    assert not allows(policy, "Read", {"file_path": "~"})
    assert not allows(policy, "Glob", {"pattern": "~/*"})
    monkeypatch.setenv("HOME", str(workspace))
    assert allows(policy, "Read", {"file_path": "~/notes.txt"})


def test_a_nul_in_a_path_is_denied(workspace: Path) -> None:
    assert not allows(ToolPolicy(workspace, []), "Read", {"file_path": "notes.txt\x00/etc/passwd"})


def test_a_workspace_given_through_a_symlink_is_resolved(workspace: Path, tmp_path: Path) -> None:
    link = tmp_path / "ws-link"
    os.symlink(workspace, link)
    policy = ToolPolicy(link, [])
    assert allows(policy, "Read", {"file_path": str(workspace / "notes.txt")})
    assert allows(policy, "Read", {"file_path": str(link / "notes.txt")})
    assert not allows(policy, "Read", {"file_path": str(tmp_path / "x")})


# Symlinks


def test_a_symlinked_directory_pointing_out_is_denied(workspace: Path, outside: Path) -> None:
    os.symlink(outside, workspace / "link")
    policy = ToolPolicy(workspace, [])
    assert not allows(policy, "Write", {"file_path": "link/new.txt"})
    assert not allows(policy, "Read", {"file_path": str(workspace / "link" / "secret.txt")})
    assert not allows(policy, "LS", {"path": "link"})
    assert not allows(policy, "Glob", {"pattern": "link/**/*"})


def test_a_symlinked_file_pointing_out_is_denied(workspace: Path, outside: Path) -> None:
    os.symlink(outside / "secret.txt", workspace / "innocent.txt")
    assert not allows(ToolPolicy(workspace, []), "Edit", {"file_path": "innocent.txt"})


def test_a_symlink_pointing_inside_is_allowed(workspace: Path) -> None:
    os.symlink(workspace / "sub", workspace / "alias")
    assert allows(ToolPolicy(workspace, []), "Write", {"file_path": "alias/x.py"})


def test_a_symlink_loop_is_denied_not_an_error(workspace: Path) -> None:
    os.symlink(workspace / "loop-a", workspace / "loop-b")
    os.symlink(workspace / "loop-b", workspace / "loop-a")
    os.symlink("self", workspace / "self")
    policy = ToolPolicy(workspace, [])
    assert not allows(policy, "Read", {"file_path": "loop-a/x"})
    assert not allows(policy, "Read", {"file_path": "self"})


# Glob patterns


@pytest.mark.parametrize("pattern", ["../*", "**/../../*", "sub/../../etc/*", "..", "*/.."])
def test_glob_patterns_with_dot_dot_are_denied(workspace: Path, pattern: str) -> None:
    decision = ToolPolicy(workspace, []).confinement("Glob", {"pattern": pattern})
    assert not decision.allow
    assert ".." in decision.message


def test_glob_patterns_starting_outside_are_denied(workspace: Path, outside: Path) -> None:
    policy = ToolPolicy(workspace, [])
    assert not allows(policy, "Glob", {"pattern": "/etc/*"})
    assert not allows(policy, "Glob", {"pattern": "/*"})
    assert not allows(policy, "Glob", {"pattern": f"{outside}/**/*.txt"})
    assert not allows(policy, "Glob", {"pattern": "*.py", "path": str(outside)})


def test_glob_patterns_inside_are_allowed(workspace: Path) -> None:
    policy = ToolPolicy(workspace, [])
    assert allows(policy, "Glob", {"pattern": "sub/**/*.py"})
    assert allows(policy, "Glob", {"pattern": f"{workspace}/**/*.py"})
    assert allows(policy, "Glob", {"pattern": "*.txt", "path": "sub"})
    # Dots in names are not `..`.
    assert allows(policy, "Glob", {"pattern": "**/...config.*"})


def test_a_grep_pattern_is_a_regex_not_a_path(workspace: Path) -> None:
    assert allows(ToolPolicy(workspace, []), "Grep", {"pattern": "../..", "path": "sub"})


# allowed_tools


def test_other_tools_run_only_when_allowed_tools_names_them(workspace: Path) -> None:
    denied = ToolPolicy(workspace, []).permission("Bash", {"command": "ls"})
    assert not denied.allow
    assert "allowed_tools" in denied.message
    assert ToolPolicy(workspace, ["Bash"]).permission("Bash", {"command": "ls"}).allow
    assert not ToolPolicy(workspace, ["Bash"]).permission("WebFetch", {"url": "https://x"}).allow
    assert not ToolPolicy(workspace, ["bash"]).permission("Bash", {"command": "ls"}).allow


def test_confinement_leaves_other_tools_to_the_permission_question(workspace: Path) -> None:
    """The hook runs for every tool call; for other tools it has no opinion."""
    policy = ToolPolicy(workspace, [])
    assert policy.confinement("Bash", {"command": "cat /etc/passwd"}).allow
    assert policy.confinement("WebFetch", {"url": "file:///etc/passwd"}).allow


@pytest.mark.parametrize("tool", ["Read", "Write", "Glob"])
def test_a_file_tool_in_allowed_tools_is_still_confined(workspace: Path, tool: str) -> None:
    policy = ToolPolicy(workspace, [tool, "Bash"])
    outside_input = {"file_path": "/etc/passwd", "path": "/etc", "pattern": "/etc/*"}
    assert not policy.confinement(tool, outside_input).allow
    assert not policy.permission(tool, outside_input).allow
    assert policy.confinement(tool, {"file_path": "notes.txt", "pattern": "*.txt"}).allow


@pytest.mark.parametrize("pattern", ["{/etc,src}/*", "{src, ~/.ssh}/*", "{a,{/etc,b}}/*", "src/{..,x}/*"])
def test_glob_brace_alternatives_that_leave_the_workspace_are_denied(workspace: Path, pattern: str) -> None:
    assert not allows(ToolPolicy(workspace, []), "Glob", {"pattern": pattern})


@pytest.mark.parametrize("pattern", ["{src,docs}/*.md", "**/*.{py,txt}"])
def test_glob_brace_alternatives_inside_the_workspace_are_allowed(workspace: Path, pattern: str) -> None:
    assert allows(ToolPolicy(workspace, []), "Glob", {"pattern": pattern})


def test_a_decision_cannot_be_changed_by_whoever_it_is_given_to(workspace: Path) -> None:
    """Every allowed call gets the same decision: one caller changing it would allow or deny for
    every session."""
    policy = ToolPolicy(workspace, ["Bash"])
    decision = policy.permission("Bash", {"command": "ls"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        decision.allow = False  # type: ignore[misc]
    assert policy.confinement("Read", {"file_path": "notes.txt"}).allow
