"""What the CLI's checkpoint restore gets wrong across branches, and putting it right.

A files rewind to a point restores every file the CLI's file history records as changed since
the point was sent, by the visible turns and by turns a conversation rewind dropped since, to what
it held just before the point: what the transcript's file history on every branch says (the
dropped branches stay in the file). The CLI itself restores a file to the backup its own chain
holds, which after a conversation rewind can be wrong: a file the dropped turns first created and
a visible turn then changed again is, to the CLI, a file that existed before the point, and it
would be left holding what the dropped turns wrote. The service puts such files right.

What a rewind changed is seen, not asked for. The CLI's dry run names the files its restore
would change, but it costs a control request on every rewind, and the CLI's real restore answers
only whether it could. So a rewind reads, before its restore, every file the CLI's file history
tracks (`look`: few, small files, read without following a link); after the restore (and the
fixes above) it reads them again, and what differs is what the rewind changed, its lines counted
as `git diff --numstat` counts them (`seen`). A session whose tracked files are many or big, one
outside the workspace, is planned by the CLI's dry run, as before. Nothing is read through a
link: a tracked file that is one counts no lines (the CLI's restore skips it; the service's own
fix below may remove it).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import structlog

from agent_rewind.rewind.diffstat import line_counts
from agent_rewind.rewind.paths import covers
from agent_rewind.snapshots.errors import UnsafePath
from agent_rewind.snapshots.files import (
    MODE_EXECUTABLE,
    MODE_FILE,
    MODE_SYMLINK,
    Workspace,
    chunks,
    open_regular,
)
from agent_rewind.transcript.entries import RewindPoint
from agent_rewind.transcript.index import ConversationView

log = structlog.get_logger(__name__)

_CHUNK = 1 << 20

# What a rewind reads of the tracked files to see what it changed (`look`); beyond it, the CLI's
# dry run plans it.
# They are read (and their lines counted) in a thread, never through a link or from a FIFO.
MAX_LOOKED_AT = 64
MAX_LOOKED_AT_BYTES = 1 << 20  # in all


# A backup of the CLI's file history the service restores from itself (`apply`) is at most
# this big; a bigger one is left to the CLI's own restore (logged). Each is streamed, never
# held whole.
MAX_FIX_BYTES = 256 << 20


@dataclass(frozen=True)  # gremlin: pardon[equivalent] nothing assigns to or hashes one
class Fix:
    path: Path  # absolute, inside the workspace
    relative: str  # the same path, from the workspace
    backup: Path | None  # the CLI's backup of what it held before; None: it did not exist


def _inside(path: Path, workspace: Path) -> bool:
    return path == workspace or path.is_relative_to(workspace)


def planned(view: ConversationView, point: RewindPoint, workspace: Path, history: Path) -> list[Fix]:
    """What every file first recorded after `point` was sent (on any branch) held just before it.
    Files the CLI's snapshot at the point tracks it restores right itself. Reads nothing but
    the backups' stat data."""
    return _fixes(view.files_before(point).items(), workspace, history)


def chosen(
    view: ConversationView, point: RewindPoint, workspace: Path, history: Path, paths: tuple[str, ...]
) -> list[Fix]:
    """What a files rewind to `point` narrowed to `paths` (rewind/paths.py) restores, which the
    service writes itself from the CLI's backups (the CLI's restore takes every file): each file
    the CLI's snapshot at the point tracks, as that snapshot holds it, and each file first
    recorded after it, as `planned` has it; only those under `paths`."""
    fixes = _fixes(view.checkpoint_files(point).items(), workspace, history)
    names = frozenset(paths)
    return [fix for fix in fixes if covers(names, fix.relative)]


def _fixes(files: Iterable[tuple[str, str | None]], workspace: Path, history: Path) -> list[Fix]:
    workspace = workspace.resolve()
    fixes = []
    for tracked, name in files:
        path = Path(os.path.normpath(workspace / tracked))
        if path == workspace or not _inside(path, workspace):
            continue
        relative = path.relative_to(workspace).as_posix()
        if name is None:
            fixes.append(Fix(path, relative, None))
            continue
        backup = history / name
        try:
            if "/" in name or name in (".", ".."):
                raise OSError(f"{name!r} is not a file name")
            info = os.stat(backup, follow_symlinks=False)
            if not stat.S_ISREG(info.st_mode):
                raise OSError("not a regular file")
            if info.st_size > MAX_FIX_BYTES:
                raise OSError(f"over {MAX_FIX_BYTES} bytes")
        except OSError as err:  # a backup the CLI lost, or one not to trust: leave the file as is
            log.warning("a file-history backup is missing", path=str(path), backup=name, error=str(err))
            continue
        fixes.append(Fix(path, relative, backup))
    return fixes


def _holds(files: Workspace, fix: Fix) -> bool:
    """Whether the workspace's file already holds what `fix` puts there: compared a chunk at a
    time, never through a link, never waiting on a FIFO."""
    if fix.backup is None:
        return files.lstat(fix.relative) is None
    with files.regular(fix.relative) as found:
        if found is None:
            return False
        fd, info = found
        backup = open_regular(fix.backup)
        if backup == -1:  # not a regular file (open_regular)
            return False
        try:
            if os.fstat(backup).st_size != info.st_size:
                return False
            while True:
                ours, theirs = os.read(fd, _CHUNK), os.read(backup, _CHUNK)
                if ours != theirs:
                    return False
                if not ours:
                    return True
        finally:
            os.close(backup)


def needed(fixes: list[Fix], workspace: Path) -> list[Fix]:
    """The fixes whose file does not already hold what it should (in a thread: it reads files)."""
    try:
        with Workspace(workspace.resolve()) as files:
            return [f for f in fixes if not _holds(files, f)]
    except (OSError, UnsafePath) as err:
        log.warning("the files a rewind puts right could not be read", error=str(err))
        return []


def apply(fixes: list[Fix], workspace: Path) -> None:
    """Writes (or deletes) each file, never through a link, streaming each from its backup;
    idempotent, so an interrupted rewind may do it again. A file that cannot be put right (a
    link on the way, a backup gone) is left as the CLI's restore left it, and logged. Runs in a
    thread: it reads and writes files."""
    try:
        files = Workspace(workspace.resolve())
    except (OSError, UnsafePath) as err:
        log.error("no file of a rewind could be put right", error=str(err))
        return
    with files:
        for fix in fixes:
            try:
                _apply(files, fix)
            except (OSError, UnsafePath) as err:
                log.error("a file of a rewind could not be put right", path=str(fix.path), error=str(err))
        files.sync()


def _apply(files: Workspace, fix: Fix) -> None:
    if _holds(files, fix):
        return
    if fix.backup is None:
        files.remove(fix.relative)
        return
    backup = open_regular(fix.backup)
    if backup == -1:  # not a regular file (open_regular)
        raise OSError(f"the backup {fix.backup.name} is not a regular file")
    try:
        info = os.fstat(backup)
        if info.st_size > MAX_FIX_BYTES:
            raise OSError(f"the backup {fix.backup.name} is over {MAX_FIX_BYTES} bytes")
        mode = MODE_EXECUTABLE if info.st_mode & stat.S_IXUSR else MODE_FILE
        files.write(fix.relative, mode, chunks(backup))
    finally:
        os.close(backup)


@dataclass(frozen=True)  # gremlin: pardon[equivalent] nothing assigns to or hashes one
class Narrowed:
    """A narrowed files rewind from checkpoints, as planned: the fixes it writes, the links it
    leaves (the CLI's restore skips them too), and its lines inserted and deleted (0 when a file
    is over the bound `look` reads)."""

    fixes: tuple[Fix, ...]
    skipped_links: int
    insertions: int
    deletions: int


def narrowed(fixes: list[Fix], workspace: Path) -> Narrowed:
    """Of `fixes`, those whose file does not hold what it should and is no symbolic link, with
    their lines counted while they and their backups fit in what `look` reads (none counted
    past it). In a thread: it reads files, never through a link or from a FIFO."""
    todo: list[Fix] = []
    links = insertions = deletions = 0
    left: int | None = MAX_LOOKED_AT_BYTES  # None: too much to count
    with Workspace(workspace.resolve()) as files:
        for fix in fixes:
            if _is_link(files, fix):
                links += 1
                continue
            if _holds(files, fix):
                continue
            todo.append(fix)
            if left is None:
                continue
            try:
                now = files.content(fix.relative, left)
                was = _backup_text(fix, left - len(now[1] if now is not None else b""))
            except OSError:  # past the bound (EFBIG), or unreadable: lines are not told
                left = None
                continue
            left -= len(now[1] if now is not None else b"") + len(was or b"")
            added, removed = line_counts(_text(now), was)
            insertions += added
            deletions += removed
    if left is None:
        insertions = deletions = 0
    return Narrowed(tuple(todo), links, insertions, deletions)


def _backup_text(fix: Fix, limit: int) -> bytes | None:
    """The backup's bytes; OSError(EFBIG) past `limit`."""
    if fix.backup is None:
        return None
    fd = open_regular(fix.backup)
    if fd == -1:
        raise OSError(errno.ENOENT, "the backup is not a regular file", str(fix.backup))
    try:
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise OSError(errno.EFBIG, "past the bound", str(fix.backup))
    return data


def apply_narrowed(fixes: list[Fix], workspace: Path) -> None:
    """Writes the fixes of a narrowed rewind (`chosen`), leaving symbolic links as the CLI's
    restore does; idempotent (`apply`)."""
    try:
        with Workspace(workspace.resolve()) as files:
            kept = [fix for fix in fixes if not _is_link(files, fix)]
    except (OSError, UnsafePath) as err:
        log.error("no file of a narrowed rewind could be put back", error=str(err))
        return
    apply(kept, workspace)


def _is_link(files: Workspace, fix: Fix) -> bool:
    found = files.lstat(fix.relative)
    return found is not None and stat.S_ISLNK(found.st_mode)


# Workspace-relative path -> its mode and bytes (a symlink's are its target); None: nothing there.
Files = dict[str, tuple[str, bytes] | None]


def tracked(view: ConversationView, workspace: Path) -> list[str] | None:
    """The workspace-relative paths of every file the CLI's file history tracks (any branch):
    all a files rewind from its checkpoints can change. None when there are too many, or one
    lies outside the workspace."""
    names = view.tracked_files
    if len(names) > MAX_LOOKED_AT:
        return None
    root = workspace.resolve()
    out = []
    for name in names:
        path = Path(os.path.normpath(root / name))
        if path == root or not _inside(path, root):
            return None
        out.append(path.relative_to(root).as_posix())
    return sorted(out)


def look(workspace: Path, paths: list[str]) -> Files | None:
    """What each of `paths` holds now (a symlink: its target, unfollowed), read without following
    any link in the workspace (a link on the way to a file reads as no file); None when they are
    too big to look at."""
    found: Files = {}
    left = MAX_LOOKED_AT_BYTES
    try:
        with Workspace(workspace) as files:
            for path in paths:
                content = files.content(path, left)
                found[path] = content
                left -= len(content[1]) if content is not None else 0
    except (OSError, UnsafePath):  # too big, a link on the way, the workspace gone: ask the CLI
        return None
    return found


def seen(workspace: Path, before: Files) -> tuple[tuple[str, ...], int, int] | None:
    """What a restore changed of the files `look` read before it: their absolute paths, and the
    lines inserted and deleted. None when one cannot be read now as it could before."""
    after = look(workspace, list(before))
    if after is None:
        return None
    changed = [path for path, content in before.items() if after[path] != content]
    insertions = deletions = 0
    for path in changed:
        added, removed = line_counts(_text(before[path]), _text(after[path]))
        insertions += added
        deletions += removed
    return tuple(str(workspace / path) for path in changed), insertions, deletions


def _text(content: tuple[str, bytes] | None) -> bytes | None:
    """What a file's lines are counted in: a symlink has none (git counts its target as one)."""
    return None if content is None or content[0] == MODE_SYMLINK else content[1]


def without_links(preview: tuple[str, ...]) -> tuple[str, ...]:
    """The CLI's preview of a restore less the files that are symlinks now: its restore skips
    them, but its preview reads through them (and counts the lines of what they name)."""
    return tuple(path for path in preview if not os.path.islink(path))
