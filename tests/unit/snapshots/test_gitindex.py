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


@pytest.mark.parametrize("version", ["2", "3", "4"])
def test_every_index_version_git_writes_is_read_alike(repo: Path, version: str) -> None:
    (repo / "dir").mkdir()
    (repo / "dir" / "c.txt").write_text("c\n")
    (repo / "new.txt").write_text("new\n")
    _git(repo, "add", "dir/c.txt")
    _git(repo, "add", "-N", "new.txt")  # intent to add: an extended entry (version 3 and on)
    _git(repo, "update-index", "--index-version", version)
    entries = gitindex.parse((repo / ".git" / "index").read_bytes())
    assert [e.path for e in entries] == [b"a.txt", b"b.txt", b"dir/c.txt", b"new.txt"]
    assert all(e.stage == 0 for e in entries)


def _resealed(body: bytes) -> bytes:
    import hashlib

    return body + hashlib.sha1(body, usedforsecurity=False).digest()


def test_a_damaged_index_is_refused_never_read_in_part(repo: Path) -> None:
    data = (repo / ".git" / "index").read_bytes()
    body = data[:-20]
    damaged = [
        data[:-1] + bytes([data[-1] ^ 1]),  # the checksum
        data[:10],  # shorter than a header and a checksum
        _resealed(body[:-30]),  # an entry cut short
        _resealed(body[:12] + body[12:].replace(b"a.txt\0", b"a.txtX", 1)),  # a name without its end
        _resealed(body + b"TREE" + (1000).to_bytes(4, "big")),  # an extension past the end
        _resealed(body + b"TR"),  # a truncated extension
    ]
    for bad in damaged:
        with pytest.raises(gitindex.BadIndex):
            gitindex.parse(bad)
