"""The git index reader (snapshots/gitindex.py) against indexes git itself writes."""

from __future__ import annotations

import os
import struct
import subprocess
from pathlib import Path

import pytest

from agent_rewind.snapshots import gitindex

# No system or user config: an `index.version` or `feature.manyFiles` there would change the
# layout the tests below cut at fixed offsets.
_ENV = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null"}


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=_ENV)


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


def _index(repo: Path) -> bytes:
    return (repo / ".git" / "index").read_bytes()


_LATE = 1_700_000_000_999_999_999  # a nanosecond short of a second: a float rounds it up


def _run_git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=_ENV).stdout
    return out.decode()


def _cacheinfo(repo: Path, *paths: str) -> None:
    """Entries for `paths` (the empty blob), put in the index with no file behind them."""
    oid = _run_git(repo, "hash-object", "-w", "/dev/null").strip()
    for path in paths:
        _git(repo, "update-index", "--add", "--cacheinfo", f"100644,{oid},{path}")


def _as_git_shows_it(repo: Path, path: str) -> gitindex.Stat:
    """The stat data `git ls-files --debug` shows for `path` (and its mode, from `ls-files -s`)."""
    words = _run_git(repo, "ls-files", "--debug", "--", path).split()[1:]
    shown = dict(zip(words[0::2], words[1::2], strict=True))
    ctime_s, ctime_ns = shown["ctime:"].split(":")
    mtime_s, mtime_ns = shown["mtime:"].split(":")
    mode = int(_run_git(repo, "ls-files", "-s", "--", path).split()[0], 8)
    return gitindex.Stat(
        int(ctime_s), int(ctime_ns), int(mtime_s), int(mtime_ns), int(shown["dev:"]),
        int(shown["ino:"]), mode, int(shown["uid:"]), int(shown["gid:"]), int(shown["size:"]),
    )  # fmt: skip


def test_stat_data_is_read_and_taken_as_git_records_it(repo: Path) -> None:
    """Each field of an entry's stat data is git's own, and `Stat.of` a file's lstat is what git
    records for it, to the nanosecond: a second off and the store's index never matches git's
    (an mtime a nanosecond short of a second, which a float division rounds up)."""
    late = repo / "late.sh"
    late.write_text("#!/bin/sh\n")
    late.chmod(0o755)
    os.utime(late, ns=(_LATE, _LATE))
    _git(repo, "add", "late.sh")
    entries = {e.path: e for e in gitindex.parse(_index(repo))}
    for name in ("a.txt", "late.sh"):
        assert entries[name.encode()].stat == _as_git_shows_it(repo, name)
    taken = gitindex.Stat.of(gitindex.MODE_EXECUTABLE, os.lstat(late))
    assert taken == entries[b"late.sh"].stat
    assert (taken.mtime_s, taken.mtime_ns) == (1_700_000_000, 999_999_999)


def test_a_ctime_a_nanosecond_short_of_a_second_is_kept_in_its_second(tmp_path: Path) -> None:
    """The kernel sets a file's ctime, so no real file can be given this one: a stat result of a
    real file with its ctime replaced. A float division would put it in the next second."""
    real = os.lstat(tmp_path)
    st = os.stat_result(tuple(real)[:10], {"st_ctime_ns": _LATE, "st_mtime_ns": real.st_mtime_ns})
    taken = gitindex.Stat.of(gitindex.MODE_FILE, st)
    assert (taken.ctime_s, taken.ctime_ns) == (1_700_000_000, 999_999_999)


def test_an_index_written_here_is_read_by_git_as_the_files_stand(repo: Path) -> None:
    """git reads the index `write` makes (its checksum, its layout) with the stat data given,
    and finds every file unchanged."""
    os.utime(repo / "b.txt", ns=(_LATE, _LATE))
    rows: list[tuple[bytes, str, gitindex.Stat]] = []
    for name in ("b.txt", "a.txt"):  # out of order: `write` sorts
        oid = _run_git(repo, "hash-object", "-w", name).strip()
        rows.append((name.encode(), oid, gitindex.Stat.of(gitindex.MODE_FILE, os.lstat(repo / name))))
    (repo / ".git" / "index").write_bytes(gitindex.write(rows))
    for path, _oid, stat in rows:
        assert _as_git_shows_it(repo, path.decode()) == stat
    assert _run_git(repo, "diff-files", "--name-only") == ""


def test_an_empty_index_is_read_and_one_byte_less_is_refused(tmp_path: Path) -> None:
    """git's index with no entries is a header and a checksum, the least an index can be (and
    `write` makes the same bytes); a header one byte short, its checksum right, is refused."""
    _git(tmp_path, "init", "-q")
    (tmp_path / "a").touch()
    _git(tmp_path, "add", "a")
    _git(tmp_path, "rm", "-q", "--cached", "a")
    data = _index(tmp_path)
    assert len(data) == 12 + 20, "git wrote an index of no entries and no extension"
    assert gitindex.parse(data) == []
    assert gitindex.write([]) == data
    for short in (_resealed(data[:11]), _resealed(b"")):
        with pytest.raises(gitindex.BadIndex):
            gitindex.parse(short)


def test_an_extended_entry_in_a_version_2_index_is_refused(repo: Path) -> None:
    """Only version 3 and on have extended flags (intent to add, skip worktree): git's version 3
    index with one, relabelled version 2, is not read as if it were right."""
    (repo / "new.txt").write_text("new\n")
    _git(repo, "add", "-N", "new.txt")
    _git(repo, "update-index", "--index-version", "3")
    body = bytearray(_index(repo)[:-20])
    assert [e.path for e in gitindex.parse(_resealed(bytes(body)))][-1] == b"new.txt"
    body[4:8] = (2).to_bytes(4, "big")
    with pytest.raises(gitindex.BadIndex, match="version 2"):
        gitindex.parse(_resealed(bytes(body)))


def _long(lead: str, length: int) -> str:
    """A path of exactly `length` bytes: directories of 99 bytes, the first named from `lead`."""
    chunks = (length - 1) // 100
    return lead + (("d" * 99 + "/") * chunks + "f" * (length - 100 * chunks))[1:]


@pytest.mark.parametrize("version", ["2", "3", "4"])
def test_names_of_4095_bytes_and_longer_are_read(repo: Path, version: str) -> None:
    """A name's length field holds up to 4094; from 4095 on it holds 4095 and the name runs to
    its NUL (git writes such paths: nothing limits a path's length in the index)."""
    paths = [_long(lead, length) for lead, length in zip("cdef", (4094, 4095, 4096, 5000), strict=True)]
    assert [len(p) for p in paths] == [4094, 4095, 4096, 5000]
    _cacheinfo(repo, *paths)
    _git(repo, "update-index", "--index-version", version)
    entries = gitindex.parse(_index(repo))
    assert [e.path.decode() for e in entries] == ["a.txt", "b.txt", *paths]


def test_a_name_that_runs_to_the_end_of_the_index_is_refused(repo: Path) -> None:
    """git's index cut right after the first entry's name (no NUL left): refused, not an
    IndexError a caller does not expect."""
    body = _index(repo)[:-20]
    assert body[74:79] == b"a.txt"
    with pytest.raises(gitindex.BadIndex):
        gitindex.parse(_resealed(body[:79]))


def test_a_version_4_entry_cut_before_its_prefix_is_refused(repo: Path) -> None:
    """Version 4 puts a varint (how much of the previous name to drop) after the fixed fields:
    an index cut right before it is refused, not an IndexError."""
    _git(repo, "update-index", "--index-version", "4")
    body = _index(repo)[:-20]
    with pytest.raises(gitindex.BadIndex):
        gitindex.parse(_resealed(body[:74]))


@pytest.fixture
def long_prefix(tmp_path: Path) -> tuple[bytes, int]:
    """git's version 4 index of a 302-byte name then `e.txt`, which drops all 302 bytes (the
    varint 0x81 0x2e: two bytes), and where that varint starts."""
    _git(tmp_path, "init", "-q")
    first = "d" * 300 + "/f"
    _cacheinfo(tmp_path, first, "e.txt")
    _git(tmp_path, "update-index", "--index-version", "4")
    data = _index(tmp_path)
    at = 12 + 62 + 1 + len(first) + 1 + 62
    assert data[at : at + 2] == b"\x81\x2e", "git dropped the whole previous name"
    return data, at


def test_a_version_4_prefix_of_more_than_one_byte_is_read(long_prefix: tuple[bytes, int]) -> None:
    data, _ = long_prefix
    assert [e.path for e in gitindex.parse(data)] == [b"d" * 300 + b"/f", b"e.txt"]


def test_a_version_4_prefix_cut_in_the_middle_is_refused(long_prefix: tuple[bytes, int]) -> None:
    """The index ends after the varint's first byte, which says another follows."""
    data, at = long_prefix
    with pytest.raises(gitindex.BadIndex, match="prefix"):
        gitindex.parse(_resealed(data[: at + 1]))


def _forged(version: int, ctime_ns: int, mtime_s: int, flags: int, rest: bytes) -> bytes:
    """An index of one entry: its fixed fields (zero but those given), then `rest`, resealed."""
    head = struct.pack(">4sII", b"DIRC", version, 1)
    fields = struct.pack(">10I20sH", 0, ctime_ns, mtime_s, 0, 0, 0, 0o100644, 0, 0, 0, bytes(20), flags)
    return _resealed(head + fields + rest)


def test_a_long_name_without_its_end_is_refused() -> None:
    """A name of 4095 bytes or more runs to its NUL; with none left the index is refused, though
    the bytes, were the reader to step back from the missing end, would walk as extensions
    (the entry's fields chosen so: header, then one extension that ends where the file does)."""
    name = b"n" * 5000
    # read back from offset 4: an "extension" of 1 byte, then one whose length is bytes 17-20
    length = 12 + 62 + len(name) - 21
    data = _forged(2, length >> 8, (length & 0xFF) << 24, gitindex.NAME_MASK, name)
    with pytest.raises(gitindex.BadIndex, match="without its end"):
        gitindex.parse(data)


def test_a_version_4_name_without_its_end_is_refused() -> None:
    """As above for version 4, where every name runs to its NUL: stepping back would read the
    header as an extension, then the entry's first bytes as one that ends where the file does."""
    name = b"n" * 10
    data = _forged(4, 12 + 62 + 1 + len(name) - 20, 0, 0, b"\0" + name)
    with pytest.raises(gitindex.BadIndex, match="without its end"):
        gitindex.parse(data)


def test_an_empty_extension_at_the_end_is_read_past(repo: Path) -> None:
    """An extension of no bytes (its 8-byte head only) ends the index exactly; git reads past it
    too."""
    body = _index(repo)[:-20]
    data = _resealed(body + b"ZERO" + bytes(4))
    (repo / ".git" / "index").write_bytes(data)
    assert _run_git(repo, "ls-files").split() == ["a.txt", "b.txt"]
    assert [e.path for e in gitindex.parse(data)] == [b"a.txt", b"b.txt"]
