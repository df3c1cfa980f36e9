"""Files rewinds from workspace snapshots: what to restore, and what someone else changed.

The ledger holds a session's snapshots in the order they were taken: a turn's start and end, a
files rewind's before and after. Between a start and its end (or a rewind's before and after) the
workspace was the agent's (or the service's); between an end and the next start it was anyone's.
So, for a rewind to the point P (the prompt whose turn-start snapshot is S):

- the paths to restore are those changed in the agent's intervals from S on, on every branch
  (turns a conversation rewind dropped changed files too), and by earlier rewinds;
- the external changes are the paths changed in the other intervals from S on, and since the last
  snapshot (the workspace now, snapshotted by the rewind itself);
- a path in both is a conflict, for `conflict_policy` to decide; a path only others changed is
  never touched.

Every path restored gets its content at S: created, changed or deleted as needed. Every snapshot
from S on must be complete, or the rewind is refused (SNAPSHOT_UNAVAILABLE) rather than restoring
part of the workspace.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent_rewind.errors import AgentRewindError, ExternalChanges, SnapshotUnavailable
from agent_rewind.rewind.paths import narrowed
from agent_rewind.snapshots import Snapshot, SnapshotStore
from agent_rewind.snapshots.taking import REWIND_BEFORE, TURN_START
from agent_rewind.store.ledger import SnapshotRecord

REFUSE = "refuse"
SKIP = "skip"
OVERWRITE = "overwrite"
RESOLUTIONS = {REFUSE: "refused", SKIP: "skipped", OVERWRITE: "overwritten"}

# Bounds of a dry run's diffs: per path, and in all.
DIFF_PATH_BYTES = 64 * 1024
DIFF_TOTAL_BYTES = 1024 * 1024

# Kinds of record after which the workspace is the agent's (or the service's) until the next one.
_OURS = (TURN_START, REWIND_BEFORE)


@dataclass(frozen=True)
class Restore:
    """What a files rewind served by the snapshots restores, and what it finds changed by others."""

    start: str  # what is restored: the tree at P's turn start (a revert: the merged workspace)
    now: str  # the workspace when the rewind was planned: the rollback
    paths: tuple[str, ...]  # relative paths to make equal to `start` (after the policy) ...
    changed: tuple[str, ...]  # ... that differ now: the same, as written
    insertions: int
    deletions: int
    conflicts: tuple[tuple[str, str], ...]  # (path, resolution)
    diffs: tuple[dict[str, Any], ...] = ()
    diffs_truncated: bool = False
    # EXTERNAL_CHANGES (a rewind) or REVERT_CONFLICT (a revert), under the REFUSE policy.
    refusal: AgentRewindError | None = field(default=None, compare=False)


def start_of(records: list[SnapshotRecord], message_id: str) -> int | None:
    """The index of the turn-start snapshot of the prompt `message_id`, if one was taken."""
    for i in range(len(records) - 1, -1, -1):
        if records[i].kind == TURN_START and records[i].ref == message_id:
            return i
    return None


def _state(record: SnapshotRecord) -> str:
    """snapshot_state for a record that cannot serve: pruned, timeout, too_large or failed."""
    reason = record.reason.lower()
    if reason == "pruned":
        return "pruned"
    if "timeout" in reason or "timed out" in reason:
        return "timeout"
    if "over" in reason or "bytes" in reason or "large" in reason:
        return "too_large"
    return "incomplete"


def check_complete(message_id: str, records: list[SnapshotRecord], now: Snapshot) -> None:
    """SNAPSHOT_UNAVAILABLE unless every snapshot from P's start on, and now, is complete."""
    for record in records:
        if not record.complete or record.tree is None:
            which = "the point's own" if record is records[0] else f"a later ({record.kind})"
            raise SnapshotUnavailable(message_id, _state(record), f"{which} snapshot: {record.reason}")
    if not now.complete or now.tree is None:
        raise SnapshotUnavailable(message_id, "incomplete", f"the workspace now: {now.reason}")


def restore_for(
    store: SnapshotStore,
    message_id: str,
    records: list[SnapshotRecord],
    now: Snapshot,
    policy: str,
    *,
    include_diff: bool = False,
    chosen: tuple[str, ...] = (),
) -> Restore:
    """What a files rewind to the first record's point restores (blocking: run it in the snapshot
    threads). `records`: the session's snapshots from P's turn start on; `chosen`: the paths it
    is narrowed to (rewind/paths.py; empty: all). Raises SnapshotUnavailable."""
    check_complete(message_id, records, now)
    assert now.tree is not None
    trees = [r.tree for r in records] + [now.tree]
    start = trees[0]
    assert start is not None
    pairs: list[tuple[str, str]] = [(str(trees[i]), str(trees[i + 1])) for i in range(len(records))]
    # Every interval, and now against the point, in one git process.
    *intervals, differences = store.changes_many([*pairs, (now.tree, start)])
    ours: set[str] = set()
    theirs: set[str] = set()
    for record, changes in zip(records, intervals, strict=True):
        (ours if record.kind in _OURS else theirs).update(narrowed(chosen, (c.path for c in changes)))
    conflicted = sorted(ours & theirs)
    restored = sorted(ours - set(conflicted)) if policy == SKIP else sorted(ours)
    refusal = ExternalChanges(conflicted) if conflicted and policy == REFUSE else None
    differing = {c.path for c in differences}
    # Only the paths that differ now are written (the others already hold P's content).
    changed = tuple(p for p in restored if p in differing)
    insertions, deletions = store.numstat(now.tree, start, changed) if changed else (0, 0)
    diffs, truncated = diffs_of(store, now.tree, start, changed) if include_diff else ((), False)
    return Restore(
        start=start,
        now=now.tree,
        paths=changed,
        changed=changed,
        insertions=insertions,
        deletions=deletions,
        conflicts=tuple((p, RESOLUTIONS[policy]) for p in conflicted),
        diffs=diffs,
        diffs_truncated=truncated,
        refusal=refusal,
    )


def diffs_of(
    store: SnapshotStore, a: str, b: str, paths: tuple[str, ...]
) -> tuple[tuple[dict[str, Any], ...], bool]:
    """A dry run's diffs of `paths` from tree `a` to tree `b`, within its bounds, and whether
    some were left out."""
    diffs: list[dict[str, Any]] = []
    if not paths:
        return (), False
    total = 0
    for diff in store.diff(a, b, paths, DIFF_PATH_BYTES):
        size = len(diff.unified_diff)
        if total + size > DIFF_TOTAL_BYTES:
            return tuple(diffs), True
        total += size
        diffs.append(
            {
                "path": diff.path,
                "change": diff.change,
                "unified_diff": diff.unified_diff,
                "binary": diff.binary,
                "truncated": diff.truncated,
            }
        )
    return tuple(diffs), False
