"""ForkSession: a new session that starts where another one was, and then lives on its own.

The fork gets its own id, workspace, transcript, snapshots and CLI process; nothing is shared
after the call, so prompts and rewinds on one never show in the other.

- Its **conversation** is the source's visible chain up to the fork's leaf (just before the
  point, or the whole conversation): those transcript lines are copied, in order, into the fork's
  own transcript, each re-labelled with the fork's session id and workspace. Hidden branches are
  not copied. The fork's first CLI process resumes at that leaf, as any session does.
- Its **files** are the workspace as it was when the point's turn started (the source's start
  snapshot, which must be complete), or, for a fork of the whole session, the workspace as it is
  (a copy; symlinks are copied as links, never followed).

The fork keeps no file history of the source: its points from before the fork can be rewound in
conversation, and its files only back to where it began.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from agent_rewind.errors import SnapshotUnavailable
from agent_rewind.snapshots import EMPTY_TREE, SnapshotStore
from agent_rewind.store.ledger import SnapshotRecord

_TURN_START = "turn_start"


def start_tree(records: list[SnapshotRecord], message_id: str) -> str:
    """The tree of the workspace when the point's turn started; SNAPSHOT_UNAVAILABLE without a
    complete one."""
    for record in reversed(records):
        if record.kind == _TURN_START and record.ref == message_id:
            if not record.complete or record.tree is None:
                raise SnapshotUnavailable(message_id, "incomplete", record.reason)
            return record.tree
    raise SnapshotUnavailable(message_id, "none", "no workspace snapshot was taken when its turn started")


def _moved(value: Any, old: str, new: str) -> Any:
    """`value` with every mention of the workspace `old` (a path in a tool call, a tool result, the
    CLI's environment notes) naming `new` instead."""
    if isinstance(value, str):
        return value.replace(old, new) if old in value else value
    if isinstance(value, list):
        return [_moved(v, old, new) for v in value]
    if isinstance(value, dict):
        return {k: _moved(v, old, new) for k, v in value.items()}
    return value


def write_transcript(
    source: Path, target: Path, offsets: list[int], session_id: str, cwd: str, source_cwd: str
) -> None:
    """The fork's transcript: the source's lines at `offsets`, in order, with the fork's session
    id, and its workspace wherever the source's was named (so the agent, reading its history,
    works in its own workspace). Written beside its place and renamed in: all there or nothing."""
    lines: list[bytes] = []
    with source.open("rb") as f:
        for offset in offsets:
            f.seek(offset)
            entry = _moved(json.loads(f.readline()), source_cwd.rstrip("/"), cwd.rstrip("/"))
            if "sessionId" in entry:
                entry["sessionId"] = session_id
            lines.append(json.dumps(entry, ensure_ascii=False, separators=(",", ":")).encode())
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = target.with_name(f".{target.name}.fork")
    with scratch.open("wb") as out:
        out.write(b"".join(line + b"\n" for line in lines))
        out.flush()
        os.fsync(out.fileno())
    scratch.replace(target)


def restore_into(store: SnapshotStore, tree: str, workspace: Path) -> None:
    """Writes every path of `tree` into the (empty) fork workspace. `store` is the source's
    repository, opened on the fork's workspace."""
    paths = store.files(tree)
    if paths:
        store.restore(tree, paths, rollback=EMPTY_TREE)


def copy_workspace(source: Path, target: Path) -> None:
    """The source workspace as it is now, symlinks copied as links."""
    shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
