"""scripts/install.sh, as two make targets on a fresh clone run it at once (make run, make demo)."""

from __future__ import annotations

import fcntl
import select
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tree(tmp_path: Path) -> Path:
    """A tree with the script, a pyproject, a lock file and a venv whose pip only logs its calls."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "install.sh", tmp_path / "scripts" / "install.sh")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "requirements").mkdir()
    (tmp_path / "requirements" / "runtime.txt").write_text("x==1\n")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path / "pip.calls"}\n')
    python.chmod(0o755)
    return tmp_path


def test_a_second_install_says_it_waits_for_the_first_then_finds_it_done(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    with (tree / ".venv.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the first install, still running
        second = subprocess.Popen(
            ["sh", "scripts/install.sh", "runtime"], cwd=tree, stderr=subprocess.PIPE, text=True
        )
        assert second.stderr is not None
        ready, _, _ = select.select([second.stderr], [], [], 10)
        if not ready:
            second.kill()
        assert ready, "it waited for the lock in silence"
        said = second.stderr.readline()
        assert "another make is installing dependencies into .venv; waiting for it" in said
        assert second.poll() is None, "it waits while the first holds the lock"
        fcntl.flock(lock, fcntl.LOCK_UN)
    rest = second.stderr.read()
    assert second.wait(30) == 0
    assert "installing the runtime dependencies" in rest and "installed" in rest
    assert len((tree / "pip.calls").read_text().splitlines()) == 2  # the locked set, then the package
    # A third finds the stamp and does nothing, saying nothing.
    third = subprocess.run(
        ["sh", "scripts/install.sh", "runtime"], cwd=tree, capture_output=True, text=True, check=True
    )
    assert third.stderr == ""
    assert len((tree / "pip.calls").read_text().splitlines()) == 2
