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

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

import structlog

from agent_rewind.rewind.diffstat import line_counts
from agent_rewind.snapshots.errors import UnsafePath
from agent_rewind.snapshots.files import MODE_SYMLINK, Workspace
from agent_rewind.transcript.entries import RewindPoint
from agent_rewind.transcript.index import ConversationView

log = structlog.get_logger(__name__)

# What a rewind reads of the tracked files to see what it changed (`look`); beyond it, the CLI's
# dry run plans it.
# They are read (and their lines counted) on the event loop: a few files of code, not a dataset.
MAX_LOOKED_AT = 64
MAX_LOOKED_AT_BYTES = 1 << 20  # in all


@dataclass(frozen=True)
class Fix:
    path: Path  # absolute, inside the workspace
    content: bytes | None  # None: the file did not exist before the point


def _inside(path: Path, workspace: Path) -> bool:
    return path == workspace or path.is_relative_to(workspace)


def planned(view: ConversationView, point: RewindPoint, workspace: Path, history: Path) -> list[Fix]:
    """What every file first recorded after `point` was sent (on any branch) held just before it.
    Files the CLI's snapshot at the point tracks it restores right itself."""
    workspace = workspace.resolve()
    fixes = []
    for tracked, name in view.files_before(point).items():
        path = Path(os.path.normpath(workspace / tracked))
        if not _inside(path, workspace):
            continue
        if name is None:
            fixes.append(Fix(path, None))
            continue
        try:
            fixes.append(Fix(path, (history / name).read_bytes()))
        except OSError as err:  # a backup the CLI lost: leave the file as the CLI restored it
            log.warning("a file-history backup is missing", path=str(path), backup=name, error=str(err))
    return fixes


def _holds(path: Path, content: bytes | None) -> bool:
    try:
        return path.read_bytes() == content if not path.is_symlink() else False
    except FileNotFoundError:
        return content is None
    except OSError:
        return False


def needed(fixes: list[Fix]) -> list[Fix]:
    """The fixes whose file does not already hold what it should."""
    return [f for f in fixes if not _holds(f.path, f.content)]


def apply(fixes: list[Fix]) -> None:
    """Writes (or deletes) each file; idempotent, so an interrupted rewind may do it again."""
    for fix in needed(fixes):
        if fix.content is None:
            with contextlib.suppress(FileNotFoundError):
                fix.path.unlink()
            continue
        fix.path.parent.mkdir(parents=True, exist_ok=True)
        if fix.path.is_symlink():
            fix.path.unlink()  # never write through a link
        temporary = fix.path.with_name(f".{fix.path.name}.agent-rewind-tmp")
        temporary.write_bytes(fix.content)
        os.replace(temporary, fix.path)


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
