"""What a rewind's `paths` may name, and which of a workspace's paths they choose.

A caller narrows a files rewind (or a revert, and so its undo) to some files and directories of
the workspace, named relative to it. Each is checked twice: as text when the request arrives
(`normalized`: not absolute, never `..`, no NUL, bounded), and against the workspace once the
session is held (`check_links`: no directory on the way is a symbolic link, so a name never means
a place outside the workspace). Every write of a rewind goes through `snapshots/files.py`, which
follows no link anyway: these checks are what tells the caller, not what keeps the files safe.

A name chooses itself and everything under it (`covers`). "." chooses the whole workspace.
"""

from __future__ import annotations

import itertools
import os
import stat
from collections.abc import Collection, Iterable, Sequence

from agent_rewind.errors import PathOutsideWorkspace

# How many paths one request may name, and how long each may be (PATH_MAX).
MAX_PATHS = 1000
MAX_PATH_BYTES = 4096

WHOLE = "."


def normalized(paths: Sequence[str]) -> tuple[str, ...]:
    """The names, each as a plain relative path (no `.` parts, no doubled or trailing slash),
    sorted and without repeats; PATH_OUTSIDE_WORKSPACE for one that is absolute or leaves the
    workspace. Empty: no narrowing."""
    if len(paths) > MAX_PATHS:
        raise PathOutsideWorkspace(f"{len(paths)} paths", f"are too many: at most {MAX_PATHS} may be named")
    out = set()
    for path in paths:
        if not path:
            raise PathOutsideWorkspace(path, "is empty")
        if "\x00" in path:
            raise PathOutsideWorkspace(path, "contains a NUL character")
        if len(path.encode(errors="surrogateescape")) > MAX_PATH_BYTES:
            raise PathOutsideWorkspace(path[:64] + "...", f"is longer than {MAX_PATH_BYTES} bytes")
        if path.startswith("/"):
            raise PathOutsideWorkspace(path, "is absolute")
        parts = [part for part in path.split("/") if part not in ("", ".")]
        if ".." in parts:
            raise PathOutsideWorkspace(path, "leaves the workspace (it has a '..' part)")
        out.add("/".join(parts) or WHOLE)
    return () if WHOLE in out else tuple(sorted(out))


def covers(chosen: Collection[str], path: str) -> bool:
    """Whether `path` (workspace-relative) is one of `chosen` or lies under one; every path when
    nothing is chosen. It looks up `path` and each directory on its way, so a thousand names
    cost no more than one (a set is fastest: `narrowed` makes one)."""
    if not chosen:
        return True
    parts = path.split("/")
    return any(name in chosen for name in itertools.accumulate(parts, _joined))


def _joined(directory: str, name: str) -> str:
    return directory + "/" + name


def narrowed(chosen: Collection[str], paths: Iterable[str]) -> set[str]:
    """The `paths` that `chosen` covers."""
    names = frozenset(chosen)
    return {path for path in paths if covers(names, path)}


def check_links(workspace: str, chosen: Sequence[str]) -> None:
    """PATH_OUTSIDE_WORKSPACE when a directory on the way to a chosen path is a symbolic link
    (the path would name a place outside the workspace). The path itself may be one: a rewind
    restores the link, never what it names. A part that does not exist ends the check (a file
    the rewind brings back need not exist now). Blocking: it reads the workspace."""
    for name in chosen:
        parts = name.split("/")
        at = workspace
        for part in parts[:-1]:
            at = os.path.join(at, part)
            try:
                info = os.lstat(at)
            except OSError:
                break
            if stat.S_ISLNK(info.st_mode):
                raise PathOutsideWorkspace(name, "leads through a symbolic link")
            if not stat.S_ISDIR(info.st_mode):
                break
