"""A revert of one turn (REWIND_SCOPE_TURN): what the turn changed in files, taken back, and
what changed them since kept.

The turn's workspace snapshots bound what it changed: its start (the workspace just before the
prompt was sent) and its end. Each path that differs between them is merged three ways against
the workspace now (`snapshots/merge.py`): base the file after the turn, ours the file now, theirs
the file before it. The result is planned as a files rewind served by snapshots is (a
`workspace.Restore`, whose tree is the merged workspace), so it is recorded, applied, rolled back,
finished after a crash, and undone exactly as one.

Conflicts follow `conflict_policy`: REFUSE refuses the revert (REVERT_CONFLICT), SKIP leaves those
files as they are, OVERWRITE puts them back as they were before the turn (but a path where a
directory stands now, or a file on its way, which is left and listed as skipped: putting it back
would remove what the turn did not make). A path that only other
turns or people changed is never touched: it is not one the turn changed.
"""

from __future__ import annotations

from agent_rewind.errors import RevertConflict, SnapshotUnavailable
from agent_rewind.rewind.paths import narrowed
from agent_rewind.rewind.workspace import (
    OVERWRITE,
    REFUSE,
    RESOLUTIONS,
    SKIP,
    Restore,
    check_complete,
    diffs_of,
)
from agent_rewind.snapshots import Snapshot, SnapshotStore
from agent_rewind.snapshots.taking import TURN_END
from agent_rewind.store.ledger import SnapshotRecord


def revert_for(
    store: SnapshotStore,
    message_id: str,
    records: list[SnapshotRecord],
    now: Snapshot,
    policy: str,
    *,
    include_diff: bool,
    chosen: tuple[str, ...],
) -> Restore:
    """What a revert of the turn of the prompt `message_id` writes (blocking: run it in the
    snapshot threads). `records`: the session's snapshots from the turn's start on; `chosen`:
    the paths it is narrowed to. Raises SnapshotUnavailable when the turn's start, its end or
    the workspace now has no complete snapshot."""
    end = next((r for r in records[1:] if r.kind == TURN_END and r.ref == message_id), None)
    if end is None:
        raise SnapshotUnavailable(message_id, "incomplete", "the turn has no snapshot of its end")
    check_complete(message_id, [records[0], end], now)
    before, after, current = records[0].tree, end.tree, now.tree
    assert before and after and current  # gremlin: pardon[equivalent] check_complete saw to it
    turned = narrowed(chosen, (change.path for change in store.changes(before, after)))
    reverted = store.revert(before, after, current, turned, overwrite=policy == OVERWRITE)
    conflicts = list(reverted.conflicts)
    refusal = RevertConflict(conflicts) if conflicts and policy == REFUSE else None
    changed = reverted.changed
    insertions, deletions = store.numstat(current, reverted.tree, changed) if changed else (0, 0)
    diffs, truncated = diffs_of(store, current, reverted.tree, changed) if include_diff else ((), False)
    return Restore(
        start=reverted.tree,
        now=current,
        paths=changed,
        changed=changed,
        insertions=insertions,
        deletions=deletions,
        conflicts=tuple((path, RESOLUTIONS[SKIP if path in reverted.kept else policy]) for path in conflicts),
        diffs=diffs,
        diffs_truncated=truncated,
        refusal=refusal,
    )
