"""Counting the CLI processes a server runs (agent_rewind.testing.processes)."""

from __future__ import annotations

import subprocess
import time

import pytest

from agent_rewind.testing import processes


def test_a_cli_caught_between_fork_and_exec_of_its_child_counts_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CLI starting a program forks first; until the child execs it looks like its parent (same
    binary, same arguments). Here a shell and its child stand for them: the child is not counted."""
    monkeypatch.setattr(processes, "_is_cli", lambda pid, binary: True)
    parent = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    try:
        deadline = time.monotonic() + 5
        while len(processes.descendants(parent.pid)) < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        found = processes.cli_processes(root=None)
        pids = [p.pid for p in found]
        assert parent.pid in pids
        assert all(p.ppid != parent.pid for p in found), found  # the shell's child is left out
    finally:
        parent.kill()
        parent.wait()
