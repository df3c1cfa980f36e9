"""`files.open_regular_file`, the one no-follow, non-blocking open of a workspace's files that
every reader goes through (`Workspace.entry`, `content`, `regular`, `read`, `open_regular`): it
never follows a link, never blocks on a FIFO, never hands back anything but a regular file, and
closes what it opened when it refuses it."""

from __future__ import annotations

import errno
import os
import socket
import stat
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_rewind.snapshots import files
from agent_rewind.snapshots.errors import UnsafePath
from agent_rewind.snapshots.files import Workspace, open_regular, open_regular_file


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    (path / "file.txt").write_text("mine\n")
    return path


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    secret = tmp_path / "secret.txt"
    secret.write_text("not the workspace's\n")
    return secret


@pytest.fixture
def parent(ws: Path) -> Iterator[int]:
    fd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
    yield fd
    os.close(fd)


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.fixture
def no_leak() -> Iterator[None]:
    """Every descriptor a test's calls opened and did not hand back is closed."""
    before = _open_fds()
    yield
    assert _open_fds() <= before


def _within(seconds: float, work: Callable[[], Any]) -> Any:
    """`work()` in a thread, failing the test if it has not returned within `seconds` (a blocking
    open of a FIFO never returns: its thread is left behind, a daemon)."""
    done: list[Any] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            done.append(work())
        except BaseException as err:
            failed.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "blocked"
    if failed:
        raise failed[0]
    return done[0]


def _unblock(fifo: Path) -> None:
    """Lets a reader blocked in the open of `fifo` go, should the function under test block."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return
    os.close(fd)


# A regular file: its descriptor and its own stat data


@pytest.mark.usefixtures("no_leak")
def test_a_regular_file_is_opened_with_its_stat_data(ws: Path, parent: int) -> None:
    for found in (open_regular_file("file.txt", parent), open_regular_file(ws / "file.txt")):
        assert found is not None
        fd, info = found
        try:
            assert stat.S_ISREG(info.st_mode) and info.st_size == 5
            assert (info.st_dev, info.st_ino) == (os.fstat(fd).st_dev, os.fstat(fd).st_ino)
            assert os.read(fd, 100) == b"mine\n"
        finally:
            os.close(fd)


@pytest.mark.usefixtures("no_leak")
def test_the_callers_stat_data_spare_the_lstat_but_the_open_is_still_checked(
    ws: Path, parent: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = os.lstat(ws / "file.txt")
    monkeypatch.setattr(os, "stat", lambda *args, **kwargs: pytest.fail("looked again"))
    found = open_regular_file("file.txt", parent, info)
    assert found is not None
    os.close(found[0])
    (ws / "dir").mkdir()
    assert open_regular_file("dir", parent, info) is None  # stat data of a file: a directory now


# Links: never followed


@pytest.mark.usefixtures("no_leak")
def test_a_link_to_a_file_is_not_followed(ws: Path, parent: int, outside: Path) -> None:
    (ws / "link").symlink_to(outside)
    (ws / "relative").symlink_to("file.txt")
    for name in ("link", "relative"):
        assert open_regular_file(name, parent) is None
        assert open_regular_file(ws / name) is None
        assert open_regular(name, parent) == -1


@pytest.mark.usefixtures("no_leak")
def test_a_link_swapped_in_after_the_look_is_not_followed(ws: Path, parent: int, outside: Path) -> None:
    """The caller looked and saw a file; a link is there when it opens: the open itself refuses
    it (O_NOFOLLOW), nothing of the link's target is read."""
    info = os.lstat(ws / "file.txt")
    (ws / "file.txt").unlink()
    (ws / "file.txt").symlink_to(outside)
    with pytest.raises(OSError) as raised:
        open_regular_file("file.txt", parent, info)
    assert raised.value.errno == errno.ELOOP


@pytest.mark.usefixtures("no_leak")
def test_a_link_swapped_in_between_the_lstat_and_the_open_is_not_followed(
    ws: Path, parent: int, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_stat = os.stat

    def swapping(name: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        found = real_stat(name, *args, **kwargs)
        if name == "file.txt":  # the function's own look: swap right after it
            (ws / "file.txt").unlink()
            (ws / "file.txt").symlink_to(outside)
        return found

    monkeypatch.setattr(os, "stat", swapping)
    with pytest.raises(OSError) as raised:
        open_regular_file("file.txt", parent)
    assert raised.value.errno == errno.ELOOP


# FIFOs: never waited on


@pytest.mark.usefixtures("no_leak")
def test_a_fifo_is_not_opened(ws: Path, parent: int) -> None:
    os.mkfifo(ws / "fifo")
    try:
        assert _within(5, lambda: open_regular_file("fifo", parent)) is None
        assert _within(5, lambda: open_regular("fifo", parent)) == -1
    finally:
        _unblock(ws / "fifo")


@pytest.mark.usefixtures("no_leak")
def test_a_fifo_swapped_in_after_the_look_does_not_block_and_is_closed(ws: Path, parent: int) -> None:
    """The caller looked and saw a file; a FIFO with no writer is there when it opens: the open
    returns at once (O_NONBLOCK), the descriptor is closed and nothing is handed back."""
    info = os.lstat(ws / "file.txt")
    (ws / "file.txt").unlink()
    os.mkfifo(ws / "file.txt")
    try:
        assert _within(5, lambda: open_regular_file("file.txt", parent, info)) is None
    finally:
        _unblock(ws / "file.txt")


# Anything else: never handed back


@pytest.mark.usefixtures("no_leak")
def test_a_directory_a_socket_and_a_device_are_refused(ws: Path, parent: int) -> None:
    (ws / "dir").mkdir()
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(ws / "sock"))
        for name in ("dir", "sock"):
            assert open_regular_file(name, parent) is None
            assert open_regular(name, parent) == -1


@pytest.mark.usefixtures("no_leak")
def test_a_device_is_never_opened(monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening a device can do something (a tape rewinds, a terminal hangs up): its lstat alone
    refuses it."""
    opened: list[Any] = []
    real_open = os.open

    def counted(*args: Any, **kwargs: Any) -> int:
        opened.append(args)
        return real_open(*args, **kwargs)

    monkeypatch.setattr(os, "open", counted)
    assert open_regular_file("/dev/null") is None
    assert open_regular("/dev/zero") == -1
    assert opened == []


@pytest.mark.usefixtures("no_leak")
def test_missing_is_file_not_found(parent: int) -> None:
    with pytest.raises(FileNotFoundError):
        open_regular_file("missing", parent)


@pytest.mark.usefixtures("no_leak")
def test_the_descriptor_is_closed_when_its_fstat_fails(
    ws: Path, parent: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    failed: list[int] = []

    def failing(fd: int) -> os.stat_result:
        failed.append(fd)
        raise OSError(errno.EIO, "the disk failed")

    with monkeypatch.context() as patched, pytest.raises(OSError, match="the disk failed"):
        patched.setattr(os, "fstat", failing)
        open_regular_file("file.txt", parent)
    assert len(failed) == 1


# Every reader goes through it


def _entry(workspace: Workspace) -> bool:
    return workspace.entry("file.txt") is not None


def _content(workspace: Workspace) -> bool:
    return workspace.content("file.txt", 100) is not None


def _regular(workspace: Workspace) -> bool:
    with workspace.regular("file.txt") as found:
        return found is not None


def _read(workspace: Workspace) -> bool:
    with workspace._directory([]) as parent:
        return files.read(parent, "file.txt", 100) is not None


def _open_regular(workspace: Workspace) -> bool:
    with workspace._directory([]) as parent:
        fd = open_regular("file.txt", parent)
    if fd < 0:
        return False
    os.close(fd)
    return True


@pytest.mark.usefixtures("no_leak")
@pytest.mark.parametrize("reader", [_entry, _content, _regular, _read, _open_regular])
def test_every_reader_opens_through_it(
    ws: Path, monkeypatch: pytest.MonkeyPatch, reader: Callable[[Workspace], bool]
) -> None:
    """A reader that opened a file its own way would escape the tests above: each is seen to
    call `open_regular_file`, and to hand back nothing when it refuses."""
    calls: list[str] = []
    real = files.open_regular_file

    def counted(name: str | Path, *args: Any) -> tuple[int, os.stat_result] | None:
        calls.append(str(name))
        return real(name, *args)

    with Workspace(ws) as workspace:
        monkeypatch.setattr(files, "open_regular_file", counted)
        assert reader(workspace)
        assert calls == ["file.txt"]
        monkeypatch.setattr(files, "open_regular_file", lambda *args: None)
        assert not reader(workspace)


# What the agent plants where a workspace's path is looked at: the link itself, never its target


def _git_oid(data: bytes) -> str:
    """The id git itself gives a blob of these bytes."""
    done = subprocess.run(
        ["git", "hash-object", "--stdin"], input=data, capture_output=True, check=True, timeout=60
    )
    return done.stdout.decode().strip()


def test_blob_oid_is_gits_own_id() -> None:
    for data in (b"", b"mine\n", bytes(range(256)) * 5000):
        assert files.blob_oid(len(data), [data[:1000], data[1000:]]) == _git_oid(data)


@pytest.mark.usefixtures("no_leak")
def test_lstat_reports_a_planted_link_not_what_it_names(ws: Path, tmp_path: Path, outside: Path) -> None:
    """A link to a file outside, to a directory, and a dangling one: each is seen as the link it
    is (its size is its target's length), never as the file or directory it names, nor missing."""
    (tmp_path / "elsewhere").mkdir()
    targets = {"to-file": str(outside), "to-dir": str(tmp_path / "elsewhere"), "dangling": "nowhere"}
    for name, target in targets.items():
        (ws / name).symlink_to(target)
    with Workspace(ws) as workspace:
        for name, target in targets.items():
            info = workspace.lstat(name)
            assert info is not None, name
            assert stat.S_ISLNK(info.st_mode) and info.st_size == len(os.fsencode(target)), name


@pytest.mark.usefixtures("no_leak")
def test_entry_of_a_planted_link_is_the_link_hashed_by_its_target(
    ws: Path, tmp_path: Path, outside: Path
) -> None:
    """A snapshot records a link as git does (mode 120000, the blob of its target's path), be it
    to a file outside the workspace, to a directory or dangling: not the outside file's content,
    and not nothing."""
    (tmp_path / "elsewhere").mkdir()
    targets = {"to-file": str(outside), "to-dir": str(tmp_path / "elsewhere"), "dangling": "nowhere"}
    for name, target in targets.items():
        (ws / name).symlink_to(target)
    with Workspace(ws) as workspace:
        for name, target in targets.items():
            want = files.Entry(files.MODE_SYMLINK, _git_oid(os.fsencode(target)))
            assert workspace.entry(name) == want, name
        assert workspace.entry("file.txt") == files.Entry(files.MODE_FILE, _git_oid(b"mine\n"))


@pytest.mark.usefixtures("no_leak")
def test_a_write_over_a_planted_link_to_a_directory_replaces_the_link(ws: Path, tmp_path: Path) -> None:
    """The link is what is replaced: the (empty) directory it names, outside the workspace, is
    neither removed nor written into, and the write does not fail on it."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (ws / "name").symlink_to(elsewhere)
    with Workspace(ws) as workspace:
        workspace.write("name", files.MODE_FILE, [b"restored\n"])
    assert not (ws / "name").is_symlink() and (ws / "name").read_bytes() == b"restored\n"
    assert elsewhere.is_dir() and list(elsewhere.iterdir()) == []


@pytest.mark.usefixtures("no_leak")
def test_a_remove_of_a_planted_link_to_a_directory_unlinks_the_link(ws: Path, tmp_path: Path) -> None:
    """The link goes; the (empty) directory it names, outside the workspace, stays."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (ws / "name").symlink_to(elsewhere)
    with Workspace(ws) as workspace:
        workspace.remove("name")
    assert not os.path.lexists(ws / "name")
    assert elsewhere.is_dir()


# Directories: a write makes those it needs, a read makes none


@pytest.mark.usefixtures("no_leak")
def test_a_write_makes_its_missing_parent_directories(ws: Path) -> None:
    with Workspace(ws) as workspace:
        workspace.write("new/deeper/file.txt", files.MODE_FILE, [b"made\n"])
    assert (ws / "new" / "deeper" / "file.txt").read_bytes() == b"made\n"


@pytest.mark.usefixtures("no_leak")
def test_a_read_of_a_path_under_missing_directories_makes_none(ws: Path) -> None:
    with Workspace(ws) as workspace:
        assert workspace.entry("new/deeper/file.txt") is None
        assert workspace.content("new/deeper/file.txt", 100) is None
        assert workspace.lstat("new/deeper/file.txt") is None
        with workspace.regular("new/deeper/file.txt") as found:
            assert found is None
    assert not os.path.lexists(ws / "new")


def test_sync_flushes_the_deepest_directories_first(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory's new entries are on disk before its parent's entry naming it is flushed."""
    with Workspace(ws) as workspace:
        workspace.write("a/b/c/file.txt", files.MODE_FILE, [b"x"])
        workspace.write("top.txt", files.MODE_FILE, [b"x"])
        names = {os.stat(ws / sub).st_ino: sub for sub in (".", "a", "a/b", "a/b/c")}
        flushed: list[str] = []
        real_fsync = os.fsync

        def recorded(fd: int) -> None:
            flushed.append(names.get(os.fstat(fd).st_ino, "?"))
            real_fsync(fd)

        monkeypatch.setattr(os, "fsync", recorded)
        workspace.sync()
    assert flushed == ["a/b/c", "a/b", "a", "."]


# The bounded read: a file of `limit` bytes is read, one byte more is refused


def _bounded_read(ws: Path, name: str, limit: int) -> tuple[os.stat_result, bytes] | None:
    with Workspace(ws) as workspace, workspace._directory([]) as parent:
        return files.read(parent, name, limit)


@pytest.mark.usefixtures("no_leak")
def test_a_file_of_exactly_the_limit_is_read_one_byte_more_is_refused(ws: Path) -> None:
    (ws / "ten").write_bytes(b"0123456789")
    found = _bounded_read(ws, "ten", 10)
    assert found is not None and found[1] == b"0123456789"
    with pytest.raises(OSError) as raised:
        _bounded_read(ws, "ten", 9)
    assert raised.value.errno == errno.EFBIG


def _growing(monkeypatch: pytest.MonkeyPatch, path: Path, growth: dict[int, bytes]) -> None:
    """Before the n-th `os.read` (from 1), `growth[n]` is appended to `path`: a file the agent
    writes to while it is read."""
    real_read = os.read
    calls = [0]

    def reading(fd: int, size: int) -> bytes:
        calls[0] += 1
        if calls[0] in growth:
            with path.open("ab") as appended:
                appended.write(growth[calls[0]])
        return real_read(fd, size)

    monkeypatch.setattr(os, "read", reading)


@pytest.mark.usefixtures("no_leak")
def test_a_file_that_keeps_growing_past_the_limit_while_read_is_refused_not_cut(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its size was under the limit when looked at; it reaches the limit exactly between two
    reads, then grows on: that is over the limit (EFBIG), not its first `limit` bytes, and no more
    than one byte past the limit is read."""
    (ws / "log").write_bytes(b"01234")
    _growing(monkeypatch, ws / "log", {1: b"56789", 3: b"x" * 100})
    with pytest.raises(OSError) as raised:
        _bounded_read(ws, "log", 10)
    assert raised.value.errno == errno.EFBIG
    monkeypatch.undo()
    (ws / "log").write_bytes(b"01234")
    _growing(monkeypatch, ws / "log", {1: b"56789" + b"x" * 100})
    with pytest.raises(OSError) as raised:
        _bounded_read(ws, "log", 10)
    assert raised.value.errno == errno.EFBIG


@pytest.mark.usefixtures("no_leak")
def test_a_file_that_grows_while_read_is_read_to_the_limit(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (ws / "log").write_bytes(b"01234")
    _growing(monkeypatch, ws / "log", {1: b"56789"})
    found = _bounded_read(ws, "log", 10)
    assert found is not None and found[1] == b"0123456789"


@pytest.mark.usefixtures("no_leak")
def test_a_file_read_to_its_end_is_not_read_again(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One read found its end, the size its stat data gave: what was appended after is not glued
    on (the bytes are one version of the file, consistent with the stat data handed back)."""
    (ws / "log").write_bytes(b"01234")
    _growing(monkeypatch, ws / "log", {2: b"appended later"})
    found = _bounded_read(ws, "log", 100)
    assert found is not None
    assert found[1] == b"01234" and found[0].st_size == 5


# The path check


@pytest.mark.parametrize("path", ["", "a\0b", "/etc/passwd"])
def test_an_empty_a_nul_or_an_absolute_path_is_not_a_relative_path(path: str) -> None:
    with pytest.raises(UnsafePath, match="not a relative path"):
        files.split(path)


# The root's descriptor


def test_closing_twice_is_harmless(ws: Path) -> None:
    workspace = Workspace(ws)
    workspace.close()
    workspace.close()
    with Workspace(ws) as again:
        again.close()


def test_a_root_on_descriptor_0_is_closed(tmp_path: Path) -> None:
    """A server started with its stdin closed gets descriptor 0 for a workspace's root: closing
    the workspace closes it too."""
    root = tmp_path / "ws"
    # _open_root alternates between two descriptors, the lowest free one first: with 0 free the
    # root's lands on 0 when its path has an even number of components below `/`.
    if len(root.parts[1:]) % 2:
        root = root / "deeper"
    root.mkdir(parents=True)
    saved = os.dup(0)
    try:
        os.close(0)
        workspace = Workspace(root)
        assert os.path.samefile("/proc/self/fd/0", root)
        workspace.close()
        with pytest.raises(OSError) as raised:
            os.fstat(0)
        assert raised.value.errno == errno.EBADF
    finally:
        os.dup2(saved, 0)
        os.close(saved)
