"""What the CLI's checkpoint restore gets wrong across branches, and putting it right.

The CLI restores a file to the backup its own conversation chain holds. After a conversation
rewind that dropped turns, a file those turns first created (or changed) and a visible turn then
changed again is, to the CLI, a file that existed before the point: a files rewind to the point
leaves it holding what the dropped turns wrote. Its history on every branch (the transcript keeps
the dropped ones) says what it held just before the point; the service restores that, for the
files the visible turns from the point on edited (the only files a checkpoint restore covers).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

import structlog

from agent_rewind.transcript.entries import RewindPoint
from agent_rewind.transcript.index import ConversationView

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Fix:
    path: Path  # absolute, inside the workspace
    content: bytes | None  # None: the file did not exist before the point


def _inside(path: Path, workspace: Path) -> bool:
    return path == workspace or path.is_relative_to(workspace)


def planned(view: ConversationView, point: RewindPoint, workspace: Path, history: Path) -> list[Fix]:
    """The content before `point` of every file the visible turns since it edited and whose first
    record after it is not on the conversation's own chain."""
    workspace = workspace.resolve()
    edited = {Path(os.path.normpath(workspace / p)) for p in view.edited_since(point)}
    fixes = []
    for tracked, name in view.files_before(point).items():
        path = Path(os.path.normpath(workspace / tracked))
        if path not in edited or not _inside(path, workspace):
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
