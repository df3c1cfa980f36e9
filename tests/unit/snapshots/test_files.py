"""`files.open_regular_file`, the one no-follow, non-blocking open of a workspace's files that
every reader goes through (`Workspace.entry`, `content`, `regular`, `read`, `open_regular`): it
never follows a link, never blocks on a FIFO, never hands back anything but a regular file, and
closes what it opened when it refuses it."""

from __future__ import annotations

import errno
import os
import socket
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_rewind.snapshots import files
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
