"""The git index reader (snapshots/gitindex.py) against indexes git itself writes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from agent_rewind.snapshots import gitindex


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    _git(tmp_path, "init", "-q")
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text(f"{name}\n")
    _git(tmp_path, "add", "a.txt", "b.txt")
    return tmp_path


def test_git_s_own_index_is_read(repo: Path) -> None:
    entries = gitindex.parse((repo / ".git" / "index").read_bytes())
    assert [e.path for e in entries] == [b"a.txt", b"b.txt"]


def test_a_split_index_is_refused(repo: Path) -> None:
    """Its entries are in another file (sharedindex.*), which a snapshot must not trust or miss:
    the slip of issue 37 compared the extension's name with a str, so it was never refused."""
    _git(repo, "update-index", "--split-index")
    data = (repo / ".git" / "index").read_bytes()
    assert b"link" in data, "git wrote a split index"
    with pytest.raises(gitindex.BadIndex, match="split index"):
        gitindex.parse(data)


def test_other_extensions_are_read_past(repo: Path) -> None:
    _git(repo, "update-index", "--untracked-cache")
    _git(repo, "status", "--porcelain")  # writes the untracked cache and the tree extension
    data = (repo / ".git" / "index").read_bytes()
    assert b"UNTR" in data
    assert [e.path for e in gitindex.parse(data)] == [b"a.txt", b"b.txt"]
