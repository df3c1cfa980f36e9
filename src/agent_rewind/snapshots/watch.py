"""What changed in a workspace since the last snapshot, without scanning it: inotify.

A full snapshot scan asks git to stat every file the index holds and to read every directory
that is not ignored: at 20,000 files that is most of a snapshot's cost, though a turn changes a
few files. While a store is in use (its session is live), a `Watch` follows the workspace's
directories with inotify and collects the paths that changed, so the next snapshot asks git about
those alone; with nothing changed, there is nothing to ask.

The watch is trusted only while it cannot have missed anything. Whenever it may have, `changed()`
says so (returns None) and the snapshot scans the whole workspace, exactly as without a watch:

- before its first scan (the watches are added first, then the scan runs: anything later is an
  event, anything earlier is in the scan);
- the kernel's event queue overflowed; a watch could not be added; the root was moved, deleted
  or unmounted;
- a directory was moved, in or out (the watches below it would name the wrong paths), or more
  directories appeared at once than are worth walking here;
- a `.gitignore` changed (what is ignored changed);
- more paths changed than are worth naming to git (a scan costs as much then);
- `distrust()`: the caller could not use what it was told (a snapshot failed or was incomplete).

Directories git ignores are not watched (`node_modules/`), nor `.git` directories, nor anything
behind a symlink. What inotify cannot see, and so neither can the watch: writes through a shared
memory mapping once its file is closed, writes through a hard link from outside the workspace, and
changes another machine makes on a network filesystem. Where other machines write the
workspaces, turn the watch off (`--no-snapshot-watch`): every snapshot then scans.

Not thread-safe: the store calls it under its own lock.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import weakref
from collections.abc import Iterable
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

# <sys/inotify.h>
IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_UNMOUNT = 0x00002000
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_EXCL_UNLINK = 0x04000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

MASK = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_CLOSE_WRITE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_ONLYDIR
    | IN_DONT_FOLLOW
    | IN_EXCL_UNLINK
)
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of NUL-padded name
_CHANGED = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO

# Past these, a scan is as cheap as naming the paths to git (and the command line stays short).
MAX_PATHS = 256
MAX_PATH_BYTES = 64 * 1024
# Directories one workspace may have watched, and new ones walked at once between two snapshots.
MAX_WATCHES = 50_000
MAX_NEW_DIRECTORIES = 1_000


class _Inotify:
    """The three system calls, through libc (Linux only: elsewhere `available` is False)."""

    def __init__(self) -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            self._init1 = libc.inotify_init1
            self._add = libc.inotify_add_watch
            self._add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
            self.available = True
        except (OSError, AttributeError):
            self.available = False

    def init(self) -> int:
        fd = int(self._init1(IN_NONBLOCK | IN_CLOEXEC))
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return fd

    def add(self, fd: int, path: bytes) -> int:
        wd = int(self._add(fd, path, MASK))
        if wd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), os.fsdecode(path))
        return wd


_INOTIFY = _Inotify()


class Unwatchable(Exception):
    """The workspace cannot be watched (no inotify, or a kernel limit): scan instead."""


class Watch:
    """The changes under `root` since the last `changed()` (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._fd = -1
        self._dirs: dict[int, str] = {}  # watch descriptor -> directory, relative ("" the root)
        self._changed: set[str] = set()
        self._trusted = False
        self._finalizer: weakref.finalize[[int], Watch] | None = None

    @property
    def watching(self) -> bool:
        return self._fd >= 0

    def start(self, ignored: Iterable[str]) -> None:
        """(Re)starts watching every directory under the root, except the `ignored` ones (paths
        relative to the root, as git lists them: `node_modules/`) and `.git`. The caller scans the
        whole workspace right after: from then on, `changed()` names what changed since."""
        self.close()
        if not _INOTIFY.available:
            raise Unwatchable("inotify is not available here")
        try:
            self._fd = _INOTIFY.init()
        except OSError as err:  # EMFILE: max_user_instances reached
            raise Unwatchable(f"inotify_init1: {err}") from err
        self._finalizer = weakref.finalize(self, os.close, self._fd)
        skip = {p.rstrip("/") for p in ignored}
        try:
            self._walk("", skip, MAX_WATCHES)
        except Unwatchable:
            self.close()
            raise
        self._changed.clear()
        self._trusted = True

    def changed(self) -> set[str] | None:
        """The paths (relative; a directory stands for everything below it) changed since the
        last call or `start()`, or None when the watch cannot say (the caller scans everything,
        then calls `start()` again). Either way the collected changes are handed over."""
        if self._fd < 0:
            return None
        self._drain()
        changed, self._changed = self._changed, set()
        trusted, self._trusted = self._trusted, self._trusted and self._fd >= 0
        if not trusted:
            return None
        return changed

    def quiet(self) -> bool:
        """Whether nothing changed since the last `changed()` or `start()`, as far as the watch can
        say (False when it cannot). Hands nothing over: the next `changed()` still names it all."""
        if self._fd < 0:
            return False
        self._drain()
        return self._trusted and not self._changed

    def unchanged(self, path: str) -> bool:
        """Whether the watch vouches that nothing changed at `path` (a relative path), nor at a
        directory above it, since the last `changed()` or `start()` (False when it cannot say).
        Hands nothing over."""
        if self._fd < 0:
            return False
        self._drain()
        if not self._trusted:
            return False
        parts = path.split("/")
        return not any("/".join(parts[:depth]) in self._changed for depth in range(1, len(parts) + 1))

    def distrust(self) -> None:
        """The next `changed()` returns None: the caller lost what it was last told."""
        self._trusted = False

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # closes the descriptor, once
            self._finalizer = None
        self._fd = -1
        self._dirs.clear()
        self._changed.clear()
        self._trusted = False

    # --- inside

    def _walk(self, top: str, skip: set[str], budget: int) -> int:
        """Watches `top` and every directory below it (not following symlinks; `.git` and
        `skip` excepted). Returns the budget left; raises Unwatchable past it or on a failure
        other than a directory vanishing meanwhile."""
        pending = [top]
        while pending:
            rel = pending.pop()
            if budget <= 0:
                raise Unwatchable(f"over {MAX_WATCHES} directories to watch")
            full = os.fsencode(self.root / rel) if rel else os.fsencode(self.root)
            try:
                wd = _INOTIFY.add(self._fd, full)
            except OSError as err:
                if err.errno in (errno.ENOENT, errno.ENOTDIR, errno.EACCES, errno.ELOOP):
                    if rel == "":
                        raise Unwatchable(f"the workspace cannot be watched: {err}") from err
                    continue  # vanished, or became a symlink: its parent's event says so
                raise Unwatchable(f"inotify_add_watch: {err}") from err  # ENOSPC: max_user_watches
            self._dirs[wd] = rel
            budget -= 1
            try:
                entries = list(os.scandir(full))
            except OSError:
                continue
            for entry in entries:  # a first snapshot's: every directory of the workspace
                try:
                    if not entry.is_dir(follow_symlinks=False):
                        continue
                except OSError:
                    continue
                name = os.fsdecode(entry.name)
                if name == ".git":
                    continue
                child = f"{rel}/{name}" if rel else name
                if child not in skip:
                    pending.append(child)
        return budget

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self._fd, 64 * 1024)
            except BlockingIOError:
                return
            except OSError as err:
                log.warning("workspace watch failed; snapshots scan instead", error=str(err))
                self._trusted = False
                return
            if not data:
                return
            self._handle(data)

    def _handle(self, data: bytes) -> None:
        new_dirs: list[str] = []
        at = 0
        while at + _EVENT.size <= len(data):
            wd, mask, _cookie, length = _EVENT.unpack_from(data, at)
            name = data[at + _EVENT.size : at + _EVENT.size + length].rstrip(b"\0")
            at += _EVENT.size + length
            if mask & (IN_Q_OVERFLOW | IN_UNMOUNT):
                self._trusted = False
                continue
            parent = self._dirs.get(wd)
            if parent is None:
                continue  # a watch removed meanwhile
            if mask & IN_IGNORED:  # its directory is gone (its parent said so)
                del self._dirs[wd]
                if parent == "":
                    self._trusted = False
                continue
            if mask & (IN_DELETE_SELF | IN_MOVE_SELF):
                if parent == "" or mask & IN_MOVE_SELF:
                    self._trusted = False
                continue
            if not mask & _CHANGED or not name:
                continue
            text = os.fsdecode(name)
            path = f"{parent}/{text}" if parent else text
            if text == ".gitignore" or (mask & IN_ISDIR and mask & (IN_MOVED_FROM | IN_MOVED_TO)):
                self._trusted = False
            elif mask & IN_ISDIR and mask & IN_CREATE and text != ".git":
                new_dirs.append(path)
            self._changed.add(path)
        if new_dirs and self._trusted:
            self._watch_new(new_dirs)
        if self._trusted and (
            len(self._changed) > MAX_PATHS or sum(len(p) + 1 for p in self._changed) > MAX_PATH_BYTES
        ):
            self._trusted = False  # a scan is as cheap; what was collected is dropped below
        if not self._trusted:
            self._changed.clear()

    def _watch_new(self, directories: list[str]) -> None:
        """Watches directories made since the last drain, and what is below them already (their
        paths stand for their contents: the snapshot lists them from git). Ignored or not: which
        would need git; an ignored one costs its watches and some events git then filters out."""
        budget = min(MAX_NEW_DIRECTORIES, MAX_WATCHES - len(self._dirs))
        try:
            for directory in directories:
                budget = self._walk(directory, set(), budget)
        except Unwatchable:
            self._trusted = False  # the next scan starts over, skipping what git ignores
