"""What the CLI's checkpoint restore gets wrong across branches, and putting it right.

A files rewind to a point restores every file the CLI's file history records as changed since
the point was sent, by the visible turns and by turns a conversation rewind dropped since, to what
it held just before the point: what the transcript's file history on every branch says (the
dropped branches stay in the file). The CLI itself restores a file to the backup its own chain
holds, which after a conversation rewind can be wrong: a file the dropped turns first created and
a visible turn then changed again is, to the CLI, a file that existed before the point, and it
would be left holding what the dropped turns wrote. The service puts such files right.
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
