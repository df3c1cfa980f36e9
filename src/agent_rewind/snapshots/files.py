"""The workspace's files, reached only through real directories.

A restore writes into a directory the agent controls, so any component of a path may have become
a symbolic link pointing out of the workspace. Every path is therefore opened one component at a
time from the workspace root with O_NOFOLLOW (`openat`): a symlink on the way stops the walk
instead of being followed, whatever the agent changes meanwhile. The last component is replaced
by `rename`, which never writes through a symlink either.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from agent_rewind.snapshots.errors import UnsafePath

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO must not block
_CHUNK = 1 << 20

MODE_FILE = "100644"
MODE_EXECUTABLE = "100755"
MODE_SYMLINK = "120000"


# gremlin: pardon[equivalent] nothing assigns to or hashes one (dict values, compared by ==)
@dataclass(frozen=True)
class Entry:
    """What a snapshot records for one path: its git mode and blob id."""

    mode: str
    oid: str


def split(path: str) -> list[str]:
    """The components of a workspace-relative posix path; refuses anything that could leave the
    workspace or reach into a `.git` directory (which snapshots never hold)."""
    if not path or "\0" in path or path.startswith("/"):
        raise UnsafePath(path, "not a relative path")
    parts = path.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise UnsafePath(path, "has an empty, '.' or '..' component")
        if part.lower() == ".git":
            raise UnsafePath(path, "is inside a .git directory")
    return parts


def blob_oid(size: int, chunks: Iterable[bytes]) -> str:
    """Git's id of a blob: SHA-1 over a `blob <size>\\0` header and the bytes."""
    # gremlin: pardon[untestable] True differs only where hashlib is FIPS-restricted (SHA-1 refused); no test machine is
    digest = hashlib.sha1(b"blob %d\0" % size, usedforsecurity=False)
    for chunk in chunks:
        digest.update(chunk)
    return digest.hexdigest()


def _blocked(path: str, err: OSError) -> UnsafePath:
    return UnsafePath(path, f"a parent is a symbolic link or not a directory ({err.strerror})")


def _open_root(root: Path) -> int:
    """The workspace's descriptor, reached from `/` one directory at a time without following a
    link: a workspace (or a directory on the way) that was replaced by a link is UnsafePath, so
    nothing is read or written wherever it leads. FileNotFoundError when it does not exist."""
    if not root.is_absolute():
        raise UnsafePath(str(root), "the workspace's path is not absolute")
    fd = os.open("/", _DIR_FLAGS)
    try:
        for part in root.parts[1:]:
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                raise
            except OSError as err:
                raise UnsafePath(
                    str(root), f"the workspace, or a directory on the way to it, is a link ({err.strerror})"
                ) from None
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


class Workspace:
    """Reads and writes files under `root` without following any symlink inside it. Close it
    (or use it as a context manager) to release the root's descriptor."""

    def __init__(self, root: Path) -> None:
        self._root = _open_root(root)
        self._dirty: set[tuple[str, ...]] = set()

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._root >= 0:
            os.close(self._root)
            self._root = -1

    @contextlib.contextmanager
    def _directory(self, parts: list[str], *, create: bool = False) -> Iterator[int]:
        """The descriptor of the directory `parts` (from the root), made if `create`. A symlink or
        a file on the way raises OSError (ELOOP, ENOTDIR); a missing one FileNotFoundError."""
        fd = os.dup(self._root)
        try:
            for depth, name in enumerate(parts):
                try:
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(name, 0o777, dir_fd=fd)
                    self._dirty.add(tuple(parts[:depth]))
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = child
            yield fd
        finally:
            os.close(fd)

    def entry(self, path: str) -> Entry | None:
        """What a snapshot taken now would record at `path`: None when there is no file or
        symlink there (nothing, a directory, a FIFO, or a parent that is not a real directory)."""
        parts = split(path)
        try:
            with self._directory(parts[:-1]) as parent:
                return _entry(parent, parts[-1])
        except OSError as err:
            if err.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                return None
            raise

    def content(self, path: str, limit: int) -> tuple[str, bytes] | None:
        """The mode and bytes a snapshot taken now would record at `path` (a symlink's bytes are
        its target); None when there is no file or symlink there. OSError(EFBIG) past `limit`."""
        parts = split(path)
        try:
            with self._directory(parts[:-1]) as parent:
                return _content(parent, parts[-1], limit)
        except OSError as err:
            if err.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                return None
            raise

    def lstat(self, path: str) -> os.stat_result | None:
        """What is at `path` itself (a link not followed); None when nothing is, or a parent is
        not a real directory."""
        parts = split(path)
        try:
            with self._directory(parts[:-1]) as parent:
                return os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
        except OSError as err:
            if err.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                return None
            raise

    @contextlib.contextmanager
    def regular(self, path: str) -> Iterator[tuple[int, os.stat_result] | None]:
        """The descriptor and stat data of the regular file at `path`, opened without following
        a link and without blocking (a FIFO or a device is never opened); None when there is no
        regular file there."""
        parts = split(path)
        found = None
        try:
            with self._directory(parts[:-1]) as parent:
                found = open_regular_file(parts[-1], parent)
        except OSError as err:
            if err.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                raise
        if found is None:
            yield None
            return
        try:
            yield found
        finally:
            os.close(found[0])

    def write(self, path: str, mode: str, chunks: Iterable[bytes]) -> None:
        """Makes `path` a file (or, for MODE_SYMLINK, a symlink whose target is the bytes) with
        this content, creating its parent directories. The new file is complete on disk before
        it atomically replaces what was there; an empty directory in the way is removed, a
        non-empty one is an error."""
        parts = split(path)
        try:
            with self._directory(parts[:-1], create=True) as parent:
                _clear_directory(parent, parts[-1])
                temp = f".agent-rewind-{secrets.token_hex(8)}.tmp"
                try:
                    if mode == MODE_SYMLINK:
                        os.symlink(os.fsdecode(b"".join(chunks)), temp, dir_fd=parent)
                    else:
                        _write_file(parent, temp, 0o777 if mode == MODE_EXECUTABLE else 0o666, chunks)
                    os.replace(temp, parts[-1], src_dir_fd=parent, dst_dir_fd=parent)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(temp, dir_fd=parent)
                    raise
        except OSError as err:
            if err.errno in (errno.ENOTDIR, errno.ELOOP):
                raise _blocked(path, err) from err
            raise
        self._dirty.add(tuple(parts[:-1]))

    def remove(self, path: str) -> None:
        """Makes `path` hold nothing: unlinks a file or symlink (never what it points to), removes
        an empty directory; then removes the parents this left empty, as git tracks no
        directories. Nothing there, or a parent that is not a real directory, is already done."""
        parts = split(path)
        try:
            with self._directory(parts[:-1]) as parent:
                _remove_leaf(parent, parts[-1])
        except OSError as err:
            if err.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                raise
        else:
            self._dirty.add(tuple(parts[:-1]))
        self._prune_empty(parts[:-1])

    def _prune_empty(self, parts: list[str]) -> None:
        while parts:
            try:
                with self._directory(parts[:-1]) as parent:
                    os.rmdir(parts[-1], dir_fd=parent)
            except OSError:
                return  # not empty, gone, or not a real directory: stop here
            self._dirty.add(tuple(parts[:-1]))
            parts = parts[:-1]

    def sync(self) -> None:
        """Flushes the directories that gained or lost entries, so the renames survive a crash."""
        for parts in sorted(self._dirty, key=len, reverse=True):
            with contextlib.suppress(OSError), self._directory(list(parts)) as fd:
                os.fsync(fd)
        self._dirty.clear()


def _entry(parent: int, name: str) -> Entry | None:
    info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    if stat.S_ISLNK(info.st_mode):
        target = os.readlink(os.fsencode(name), dir_fd=parent)
        return Entry(MODE_SYMLINK, blob_oid(len(target), [target]))
    found = open_regular_file(name, parent, info)
    if found is None:
        return None
    fd, opened = found
    try:
        executable = bool(opened.st_mode & stat.S_IXUSR)
        return Entry(MODE_EXECUTABLE if executable else MODE_FILE, blob_oid(opened.st_size, chunks(fd)))
    finally:
        os.close(fd)


def read(parent: int, name: str, limit: int) -> tuple[os.stat_result, bytes] | None:
    """The stat data and the bytes a snapshot records for `name` (a symlink's are its target);
    None when it is not a file or symlink now. OSError(EFBIG) past `limit`. Only a regular
    file is opened (opening a device or a FIFO can do something)."""
    info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    if stat.S_ISLNK(info.st_mode):
        return info, os.readlink(os.fsencode(name), dir_fd=parent)
    found = open_regular_file(name, parent, info)
    if found is None:
        return None
    fd, opened = found
    try:
        if opened.st_size > limit:
            raise OSError(errno.EFBIG, f"over {limit} bytes", name)
        data = os.read(fd, opened.st_size + 1)
        if len(data) > opened.st_size:  # it grew since the fstat: read on, never past `limit`
            chunks, size = [data], len(data)
            while size <= limit and (chunk := os.read(fd, min(_CHUNK, limit + 1 - size))):
                chunks.append(chunk)
                size += len(chunk)
            data = b"".join(chunks)
        if len(data) > limit:
            raise OSError(errno.EFBIG, f"over {limit} bytes", name)
        return opened, data
    finally:
        os.close(fd)


def open_regular_file(
    name: str | Path, parent: int | None = None, info: os.stat_result | None = None
) -> tuple[int, os.stat_result] | None:
    """A descriptor of the regular file `name` (relative to `parent`, or a path) and its stat
    data, opened without following a link and without blocking; None when it is something else
    (a FIFO, a socket, a device, a directory, or a link: a link swapped in since the look raises
    ELOOP). Whatever it is, nothing waits on it and nothing of it is read. The caller closes the
    descriptor. `info`: the lstat of `name` the caller has just made, not made again.

    The files a snapshot hashes, a restore compares, a rewind's fixes read and a fork copies are
    all opened here (`open_regular` too): the one place where a followed link would let the
    agent's workspace reach past it, and a FIFO's or a device's open stall the server or do
    something."""
    if info is None:
        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    if not stat.S_ISREG(info.st_mode):
        return None  # a FIFO or a device is never even opened: opening one can do something
    fd = os.open(name, _READ_FLAGS, dir_fd=parent)
    try:
        opened = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(opened.st_mode):  # swapped since the stat
        os.close(fd)
        return None
    return fd, opened


def open_regular(name: str | Path, parent: int | None = None) -> int:
    """A descriptor of the regular file `name` (relative to `parent`, or a path), opened by
    `open_regular_file` (without following a link and without blocking); -1 when it is something
    else (a link, a FIFO, a socket, a device, a directory). Whatever it is, nothing waits on it
    and nothing of it is read."""
    found = open_regular_file(name, parent)
    return -1 if found is None else found[0]


def _content(parent: int, name: str, limit: int) -> tuple[str, bytes] | None:
    found = read(parent, name, limit)
    if found is None:
        return None
    info, data = found
    if stat.S_ISLNK(info.st_mode):
        return MODE_SYMLINK, data
    return (MODE_EXECUTABLE if info.st_mode & stat.S_IXUSR else MODE_FILE), data


def chunks(fd: int) -> Iterator[bytes]:
    """The bytes of an open file from where it is, a chunk at a time."""
    while chunk := os.read(fd, _CHUNK):
        yield chunk


def _write_file(parent: int, name: str, mode: int, chunks: Iterable[bytes]) -> None:
    fd = os.open(
        name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=parent
    )
    try:
        for chunk in chunks:
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _clear_directory(parent: int, name: str) -> None:
    """An empty directory where a file must go is removed; a non-empty one raises."""
    try:
        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        os.rmdir(name, dir_fd=parent)  # ENOTEMPTY: there is content a snapshot does not hold


def _remove_leaf(parent: int, name: str) -> None:
    info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    if stat.S_ISDIR(info.st_mode):
        os.rmdir(name, dir_fd=parent)
    else:
        os.unlink(name, dir_fd=parent)
