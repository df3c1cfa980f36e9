"""A rewind's and an undo's files through the session's workspace snapshots (snapshots/taking.py
`Snapshots`; off on a server started without them), for the engine and the undo alike:

- the files half a snapshot serves: planned (`plan`, what rewind/workspace.py says to restore)
  and restored all or nothing (`restore`, which rolls a failed restore back, or leaves the intent
  to be finished again: it is idempotent);
- the workspace before and after a restore recorded as the service's own interval, not an
  outside edit (`record_before`, `record_after`);
- what an undo of a rewind needs of its files, whatever served them: the paths it changes as they
  were (`keep_before`, when it is planned) and as it left them (`keep_after`, when it completes),
  and what a files rewind planned without the CLI changed, seen between the two (`changed`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from agent_rewind.errors import FilesUnavailable, SnapshotUnavailable, StorageUnavailable
from agent_rewind.rewind import revert, workspace
from agent_rewind.rewind.calls import RewindRequest
from agent_rewind.rewind.intent import FilesBefore, Intent
from agent_rewind.rewind.outcome import FilesHalf, refuse
from agent_rewind.snapshots import RestoreError, Snapshot
from agent_rewind.snapshots.taking import REWIND_AFTER, REWIND_BEFORE, Snapshots
from agent_rewind.store.ledger import Ledger, SessionRecord
from agent_rewind.transcript.entries import RewindPoint

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Served:
    """A files half served by workspace snapshots: the half, what it restores (None when
    refused), and the workspace as it was planned against (the rollback)."""

    files: FilesHalf
    restore: workspace.Restore | None
    now: Snapshot | None


# What a failed restore says, of a rewind and of an undo: snapshots off, the restore rolled back,
# the restore neither done nor rolled back.
_SAID = {
    "rewind": (
        "workspace snapshots are off on this server; the rewind cannot be finished",
        "the workspace could not be restored ({err}); nothing was changed",
        "the workspace is partly restored ({err}); the rewind will be finished before the session "
        "runs anything else",
    ),
    "undo": (
        "workspace snapshots are off on this server; the undo cannot be finished",
        "the undo could not put the files back ({err}); nothing was changed",
        "the undo put the files partly back ({err}); it will be finished before the session runs "
        "anything else",
    ),
}


def capture_paths(cwd: str, files_changed: tuple[str, ...]) -> list[str] | None:
    """The workspace-relative paths of a rewind's changed files; None if one lies outside."""
    root = Path(cwd)
    out = []
    for name in files_changed:
        path = Path(name)
        if not path.is_absolute():
            path = root / path
        try:
            out.append(path.relative_to(root).as_posix())
        except ValueError:
            return None
    return sorted(set(out))


class SnapshotFiles:
    def __init__(self, ledger: Ledger, snapshots: Snapshots | None) -> None:
        self._ledger = ledger
        self.snapshots = snapshots

    async def plan(self, session: SessionRecord, point: RewindPoint, req: RewindRequest) -> Served | None:
        """The files half served by workspace snapshots; None when no snapshot was taken at the
        point (the CLI's checkpoints serve it then). A revert (`req.reverts`) is served by
        snapshots or refused: the CLI's checkpoints cannot take back one turn."""
        snaps = self.snapshots
        sid, cwd = session.session_id, session.cwd
        records = await snaps.records(sid) if snaps is not None and session.workspace_snapshots else []
        first = workspace.start_of(records, point.message_id)
        if snaps is None or first is None:
            if not req.reverts:
                return None
            state = "off" if snaps is None or not session.workspace_snapshots else "none"
            why = "a revert of one turn needs the workspace snapshots of its start and end"
            refusal = refuse(SnapshotUnavailable(point.message_id, state, why))
            return Served(FilesHalf(True, refusal=refusal, source="snapshot"), None, None)
        now = await snaps.take(sid, cwd)
        store = snaps.store(sid, cwd)
        later = list(records[first:])
        plan = revert.revert_for if req.reverts else workspace.restore_for
        try:
            restore = await snaps.run(
                lambda: plan(
                    store,
                    point.message_id,
                    later,
                    now,
                    req.conflict_policy,
                    include_diff=req.include_diff,
                    chosen=req.paths,
                )
            )
        except SnapshotUnavailable as err:
            if session.checkpointing and not req.reverts:
                return None  # no complete snapshot: the CLI's checkpoints serve it, as before
            return Served(FilesHalf(True, refusal=refuse(err), source="snapshot"), None, now)
        half = FilesHalf(
            True,
            restore.refusal is None,
            tuple(str(Path(cwd) / path) for path in restore.changed),
            restore.insertions,
            restore.deletions,
            refusal=refuse(restore.refusal) if restore.refusal is not None else None,
            source="snapshot",
            conflicts=restore.conflicts,
            diffs=restore.diffs,
            diffs_truncated=restore.diffs_truncated,
        )
        return Served(half, restore, now)

    async def record_before(self, session_id: str, rewind_id: str, now: Snapshot) -> None:
        """The workspace as a rewind (or an undo) found it: the rollback, and an interval boundary."""
        if self.snapshots is not None:
            await self.snapshots.record(session_id, REWIND_BEFORE, rewind_id, now)

    async def restore(
        self,
        session: SessionRecord,
        rewind_id: str,
        tree: str,
        paths: Sequence[str],
        rollback: str,
        *,
        of: str = "rewind",
    ) -> None:
        """Makes `paths` as `tree` has them, all or nothing (`rollback`: the same paths before).
        Rolled back, the rewind (or undo, `of`) is abandoned: nothing was applied. Neither done
        nor rolled back, its intent stays and it is restored again (restoring is idempotent)
        before anything else happens on the session."""
        off, rolled_back, partly = _SAID[of]
        snaps = self.snapshots
        if snaps is None:
            raise StorageUnavailable(off)
        store = snaps.store(session.session_id, session.cwd)
        try:
            await snaps.run(lambda: store.restore(tree, paths, rollback=rollback))
        except RestoreError as err:
            if err.rolled_back:  # every path written was put back: nothing was applied
                await self._ledger.abandon_rewind(rewind_id)
                raise FilesUnavailable(rolled_back.format(err=err)) from err
            raise FilesUnavailable(partly.format(err=err)) from err

    async def record_after(
        self,
        session: SessionRecord,
        rewind_id: str,
        whole: str | None,
        restored: str,
        paths: Sequence[str],
    ) -> None:
        """The workspace after a restore of `paths` from the tree `restored`, recorded (the end of
        the service's interval): the whole workspace before it (`whole`) with those paths as
        `restored` has them, computed from the trees (a restore under the lock changes nothing
        else); a new snapshot, scanning the workspace, when that is unknown or fails."""
        snaps = self.snapshots
        if snaps is None:
            return
        sid, cwd = session.session_id, session.cwd
        if whole:
            store = snaps.store(sid, cwd)
            try:
                after = await snaps.run(lambda: store.overlay(whole, restored, paths))
                await snaps.record(sid, REWIND_AFTER, rewind_id, Snapshot(after, True))
                return
            except Exception as err:  # then take it the slow way
                log.error("could not record the workspace after a restore", error=str(err))
        await snaps.take_and_record(sid, cwd, REWIND_AFTER, rewind_id)

    async def keep_before(
        self, session: SessionRecord, files: FilesHalf, restore: workspace.Restore | None
    ) -> FilesBefore | None:
        """What an undo of a rewind needs of the files: the paths it changes, as they are."""
        snaps = self.snapshots
        if snaps is None or not files.can_rewind:
            return None
        if restore is not None:
            return FilesBefore(restore.now, restore.paths)
        paths = capture_paths(session.cwd, files.files_changed)
        if paths is None:
            return None  # a path outside the workspace: that rewind cannot be undone
        store = snaps.store(session.session_id, session.cwd)
        try:
            before = await snaps.run(lambda: store.capture(paths))
        except Exception as err:  # the rewind goes on; it just cannot be undone
            log.error("could not keep the files a rewind changes", error=str(err))
            return None
        return FilesBefore(before, tuple(paths))

    async def keep_after(self, session: SessionRecord, intent: Intent) -> str | None:
        """The same files as the rewind left them (for an undo of it), if they were kept before."""
        kept = intent.files_before
        snaps = self.snapshots
        if kept is None or snaps is None:
            return None
        if intent.snapshot is not None:
            return intent.snapshot.start
        store = snaps.store(session.session_id, session.cwd)
        try:
            return await snaps.run(lambda: store.capture(kept.paths))
        except Exception as err:
            log.error("could not keep the files a rewind left", error=str(err))
            return None

    async def changed(
        self, session: SessionRecord, intent: Intent, after: str | None
    ) -> tuple[tuple[str, ...], int, int] | None:
        """What a rewind changed in the files kept for an undo of it (`keep_before`, `keep_after`):
        the paths, as written, and the lines inserted and deleted; None when they were not kept."""
        snaps, kept = self.snapshots, intent.files_before
        if snaps is None or kept is None or after is None:
            return None
        store = snaps.store(session.session_id, session.cwd)
        changes, (insertions, deletions) = await snaps.run(
            lambda: (store.changes(kept.tree, after), store.numstat(kept.tree, after))
        )
        cwd = Path(session.cwd)
        return tuple(str(cwd / c.path) for c in changes), insertions, deletions
