"""Deciding what a snapshot records of the paths git (or the watch) reported changed.

A path is recorded when it is a regular file or a symlink within the size bound, under real
directories only (never behind a symlink); a FIFO, socket or device is not recorded at all; a name
git refuses, or a file over the bound, makes the snapshot incomplete. Nested repositories are
listed here file by file, as git would add them were their `.git` not there. Git's own scan of
the workspace (`scan_workspace`) and its ignore rules (`ignored`) are asked here too. Nothing here
hashes or writes: `SnapshotStore` applies the plan to its index.
"""

from __future__ import annotations

import contextlib
import gc
import os
import stat
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from stat import S_ISLNK, S_ISREG

from agent_rewind.snapshots.errors import GitTimeout, UnsafePath
from agent_rewind.snapshots.files import split
from agent_rewind.snapshots.git import Git


@dataclass
class Plan:
    """What one snapshot does to the index: `update` goes through `update-index --add --remove`
    (hashing files, dropping the missing ones), `drop` through `--force-remove` (paths that must
    not be recorded: behind a symlink, a FIFO, over the size bound)."""

    update: list[str] = field(default_factory=list)
    drop: list[str] = field(default_factory=list)
    stats: dict[str, os.stat_result] = field(default_factory=dict)  # the lstat of each file to update
    added_bytes: int = 0
    problems: list[str] = field(default_factory=list)


def index_plan(workspace: Path, changed: list[str], untracked: list[str], max_file_bytes: int) -> Plan:
    """Sorts the paths git reported by what is there now, checking each file's size (lstat:
    a symlink's size is its target's length) before anything is hashed."""
    plan = Plan()
    tracked = set(changed)
    real_dirs: dict[str, bool] = {"": True}
    top = str(workspace)
    update, stats = plan.update, plan.stats
    added = 0
    # Once per path (every file of a first snapshot): the common case (a file or symlink within
    # the bound, under real directories, no `.git` in its name) is kept lean.
    for path in [*changed, *untracked]:
        parent = path.rpartition("/")[0]
        real = real_dirs.get(parent)
        if real is None:
            real = real_dir(workspace, parent, real_dirs)
        if not real:
            if path in tracked:  # behind a symlink now: update-index would refuse it
                plan.drop.append(path)
            continue
        try:
            info = os.lstat(f"{top}/{path}")  # encoded as os.fsencode does
        except (FileNotFoundError, NotADirectoryError):
            if path in tracked:
                update.append(path)  # deleted: --remove drops it
            continue
        mode = info.st_mode
        if (S_ISREG(mode) or S_ISLNK(mode)) and info.st_size <= max_file_bytes and ".git" not in path.lower():
            update.append(path)
            stats[path] = info
            added += info.st_size
            continue
        if stat.S_ISDIR(mode):
            if path in tracked:
                update.append(path)  # a file became a directory: --remove drops it
            continue
        problem = unrecordable(path, info, max_file_bytes)
        if problem is None:
            update.append(path)
            stats[path] = info
            added += info.st_size
            continue
        if problem:
            plan.problems.append(problem)
        if path in tracked:  # the snapshot must not claim the old content
            plan.drop.append(path)
    plan.added_bytes = added
    return plan


_paused = 0
_paused_lock = threading.Lock()
_resume = False


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cycle collector off while a first snapshot makes an object or a few per file
    (100,000 index entries, stat results, paths, hashed files): else it walks the growing heap
    again and again, about half the cost of parsing an index, a sixth of hashing every file in a
    server's heap. Process-wide: cycles made meanwhile elsewhere wait (a first snapshot's few
    seconds) for the collector's next run. Nested and concurrent uses are counted: the last to
    leave turns it back on, if it was on. Nothing made here holds a cycle."""
    global _paused, _resume
    with _paused_lock:
        if _paused == 0:
            _resume = gc.isenabled()
            gc.disable()
        _paused += 1
    try:
        yield
    finally:
        with _paused_lock:
            _paused -= 1
            if _paused == 0 and _resume:
                gc.enable()


def unrecordable(path: str, info: os.stat_result, max_file_bytes: int) -> str | None:
    """None when a snapshot records the path (a file or symlink within the size bound); else
    why not: "" for what git never records (a FIFO, socket or device), or the problem that
    makes the snapshot incomplete (a name git refuses, a file over the bound)."""
    if not (stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode)):
        return ""
    if refused := refused_by_git(path, stat.S_ISLNK(info.st_mode)):
        return f"unsupported path ({refused}): {path}"
    if info.st_size > max_file_bytes:
        return f"file over {max_file_bytes} bytes: {path}"
    return None


def real_dir(workspace: Path, path: str, real_dirs: dict[str, bool]) -> bool:
    """Whether `path` and each of its parents is a directory, not a symlink to one."""
    known = real_dirs.get(path)
    if known is not None:
        return known
    real = real_dir(workspace, path.rpartition("/")[0], real_dirs)
    if real:
        try:
            real = stat.S_ISDIR(os.lstat(workspace / path).st_mode)
        except OSError:
            real = False
    real_dirs[path] = real
    return real


def nested_files(git: Git, workspace: Path, directories: list[str], deadline: float) -> list[str]:
    """The files of nested repositories, as git would add them were the `.git` not there."""
    found: list[str] = []
    pending = [d.rstrip("/") for d in directories]
    while pending:
        if time.monotonic() > deadline:
            raise GitTimeout("the deadline passed while listing a nested repository")
        directory = pending.pop()
        try:
            entries = list(os.scandir(workspace / directory))
        except OSError:
            continue  # vanished or unreadable: git would not list it either
        for entry in entries:
            if entry.name == ".git":
                continue
            path = f"{directory}/{entry.name}"
            if entry.is_dir(follow_symlinks=False):
                pending.append(path)
            elif entry.is_file(follow_symlinks=False) or entry.is_symlink():
                found.append(path)
    if not found:
        return []
    # `:/:` turns off pathspec magic in a name; check-ignore refuses the literal flag.
    out = git.run(
        "check-ignore", "-z", "--stdin",
        stdin=b"".join(b":/:" + os.fsencode(p) + b"\0" for p in found),
        deadline=deadline, ok=(0, 1), literal=False,
    )  # fmt: skip
    ignored = {p.removeprefix(":/:") for p in listed_paths(out)}
    return [p for p in found if p not in ignored]


def scan_workspace(git: Git, deadline: float, paths: Iterable[str] | None = None) -> tuple[bytes, bytes]:
    """The tracked paths whose stat data changed, and the untracked ones (not ignored): of
    the whole workspace, or of `paths` (a directory stands for everything below it)."""
    if paths is None:
        spec: tuple[str, ...] = ()
        preload: tuple[str, ...] = ()
    else:
        spec = ("--", *sorted(paths))
        preload = ("-c", "core.preloadIndex=false")  # its threads would stat every file
    changed, others = git.run_parallel(
        [
            (*preload, "diff-files", "--name-only", "-z", *spec),
            ("ls-files", "-z", "--others", "--exclude-standard", *spec),
        ],
        deadline,
    )
    return changed, others


def ignored(reader: Git, paths: list[str], deadline: float) -> set[str]:
    """Which of the untracked `paths` the workspace's ignore rules exclude (`reader`: a git that
    reads no index)."""
    if not paths:
        return set()
    # `:/:` turns off pathspec magic in a name; check-ignore refuses the literal flag.
    out = reader.run(
        "check-ignore", "--no-index", "-z", "--stdin",
        stdin=b"".join(b":/:" + os.fsencode(p) + b"\0" for p in paths),
        deadline=deadline, ok=(0, 1), literal=False,
    )  # fmt: skip
    return {p.removeprefix(":/:") for p in listed_paths(out)}


def refused_by_git(path: str, is_link: bool) -> str:
    """Why git's verify_path would skip this path (it only says so on stderr), or ''."""
    if ".git" not in path.lower():  # most paths: no component can be one
        return ""
    parts = path.split("/")
    if any(part.lower() == ".git" for part in parts):
        return "a .git component"
    if is_link and any(part.lower() == ".gitmodules" for part in parts):
        return "a symlink named .gitmodules"
    return ""


def capturable(path: str) -> bool:
    try:
        split(path)
    except UnsafePath:
        return False
    return True


def listed_paths(out: bytes) -> list[str]:
    return [os.fsdecode(p) for p in out.split(b"\0") if p]


def nul_joined(paths: Sequence[str]) -> bytes:
    return b"".join(os.fsencode(p) + b"\0" for p in paths)
