"""UndoRewind: files and conversation back exactly as they were just before a rewind.

Only the session's latest rewind can be undone, and only while no turn ran after it (its
`last_message_id` is still the session's). What the undo needs was captured when the rewind was
planned: the files it would change, as they were then (its intent's `files_before`, a tree of the
snapshot store; a rewind served by workspace snapshots has the whole workspace there anyway), and
the leaf of the conversation it cut (`planned_leaf`). When the rewind completed, the same files as
it left them were captured too (`Applied.files_after`): a path that differs from that now was
changed since, by someone else, and `conflict_policy` decides about it.

An undo is recorded like a rewind (an intent of kind "undo" first, finished by recovery if the
server dies midway), idempotent by request id, and emits an UNDONE event naming the rewind it
undid. The conversation comes back through the ledger's cut: a pending cut at the old leaf, which
every read honours and the next start of the CLI resumes at (the dropped turns are still in the
transcript, on their branch). An undo cannot itself be undone; a new rewind may follow it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import structlog

from agent_rewind import faults
from agent_rewind.errors import ExternalChanges, UndoUnavailable
from agent_rewind.rewind import workspace
from agent_rewind.rewind.calls import UndoRequest
from agent_rewind.rewind.intent import Applied, Intent, UndoFiles, UndoIntent
from agent_rewind.rewind.outcome import SINCE, ConversationHalf, FilesHalf, RewindOutcome, event_data
from agent_rewind.rewind.session import RewindSession
from agent_rewind.rewind.snapshot_files import SnapshotFiles
from agent_rewind.storage.retention import is_pruned
from agent_rewind.store.ledger import (
    Anchor,
    EventRecord,
    Ledger,
    NewEvent,
    NewRewind,
    RewindRecord,
    SessionRecord,
)
from agent_rewind.transcript.index import Reading

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class _Plan:
    """What an undo will do: the rewind it undoes, the files it puts back, the leaf it restores."""

    target: RewindRecord
    files: UndoFiles | None
    leaf: str | None
    # The transcript as the plan read it.
    reading: Reading


class Undo:
    """Plans and applies undos; the rewind engine hands it requests and pending undo intents."""

    def __init__(self, ledger: Ledger, snapshot_files: SnapshotFiles, publish: Any) -> None:
        self._ledger = ledger
        self._snapshot_files = snapshot_files
        self._publish = publish

    async def _target(self, worker: RewindSession, req: UndoRequest) -> tuple[RewindRecord, Reading]:
        applied = [r for r in await self._ledger.rewinds(worker.session_id) if r.state == "applied"]
        target = next((r for r in applied if r.rewind_id == req.rewind_id), None)
        if target is None:
            raise UndoUnavailable(req.rewind_id, "the session has no such applied rewind")
        latest = applied[-1]
        if latest is not target:
            if latest.kind == "undo" and UndoIntent.of(latest).undoes == target.rewind_id:
                raise UndoUnavailable(req.rewind_id, "it was undone already (an undo cannot be undone)")
            raise UndoUnavailable(req.rewind_id, "it is not the session's latest rewind")
        if target.kind != "rewind":
            raise UndoUnavailable(req.rewind_id, "an undo cannot be undone")
        assert target.result is not None
        reading = await worker.transcript()
        if reading.view.last_message_id != Applied.from_json(target.result).outcome.last_message_id:
            raise UndoUnavailable(req.rewind_id, "a turn ran after it")
        return target, reading

    async def _plan(self, worker: RewindSession, session: SessionRecord, req: UndoRequest) -> _Plan:
        """What undoing the request's rewind does; raises UNDO_UNAVAILABLE or EXTERNAL_CHANGES."""
        target, reading = await self._target(worker, req)
        assert target.result is not None
        applied = Applied.from_json(target.result)
        intent = Intent.of(target)
        done = applied.outcome
        files = None
        if done.files.requested and done.files.can_rewind:
            await self._check_kept(session, req, intent, reading)
            files = await self._files(session, req, intent, applied)
        leaf = None
        if done.conversation.rewound:
            leaf = intent.planned_leaf
            if not leaf:
                raise UndoUnavailable(req.rewind_id, "it was made by an older version, which kept no leaf")
        return _Plan(target, files, leaf, reading)

    async def _check_kept(
        self, session: SessionRecord, req: UndoRequest, intent: Intent, reading: Reading
    ) -> None:
        """UNDO_UNAVAILABLE once retention may have deleted the files the rewind saved: the point
        it rewound to is files_pruned (storage/retention.py keeps them only while it is kept)."""
        found = await self._ledger.usage(session.session_id)
        entry = reading.index.get(intent.target)
        if found is not None and is_pruned(entry.create_time if entry else None, found.files_pruned_before):
            raise UndoUnavailable(
                req.rewind_id,
                "retention deleted the files it saved (the point it rewound to is files_pruned)",
            )

    async def _files(
        self, session: SessionRecord, req: UndoRequest, intent: Intent, applied: Applied
    ) -> UndoFiles:
        snaps = self._snapshot_files.snapshots
        kept, after = intent.files_before, applied.files_after
        if snaps is None or kept is None or not kept.tree or not after:
            raise UndoUnavailable(req.rewind_id, "what its files were before it was not captured")
        before, paths = kept.tree, kept.paths
        store = snaps.store(session.session_id, session.cwd)

        def compare() -> tuple[str, list[str], list[str], int, int]:
            now = store.capture(paths)
            since = sorted({c.path for c in store.changes(after, now)} & set(paths))
            restore = (
                sorted(set(paths) - set(since)) if req.conflict_policy == workspace.SKIP else list(paths)
            )
            differing = {c.path for c in store.changes(now, before)}
            changed = [p for p in restore if p in differing]
            ins, dels = store.numstat(now, before, changed) if changed else (0, 0)
            return now, since, changed, ins, dels

        now, since, changed, insertions, deletions = await snaps.run(compare)
        if since and req.conflict_policy == workspace.REFUSE:
            raise ExternalChanges(since)
        return UndoFiles(
            before=before,
            now=now,
            paths=tuple(changed),
            insertions=insertions,
            deletions=deletions,
            conflicts=tuple((p, workspace.RESOLUTIONS[req.conflict_policy]) for p in since),
            source=applied.outcome.files.source,
        )

    def _outcome(self, session: SessionRecord, plan: _Plan) -> RewindOutcome:
        """The result an undo reports: the rewind it undid, what it put back."""
        files: FilesHalf = FilesHalf()
        if (f := plan.files) is not None:
            files = FilesHalf(
                True,
                True,
                tuple(str(Path(session.cwd) / p) for p in f.paths),
                f.insertions,
                f.deletions,
                source=f.source,
                conflicts=f.conflicts,
            )
        conversation: ConversationHalf = ConversationHalf()
        last = plan.reading.index.view(plan.leaf).last_message_id if plan.leaf else ""
        if plan.leaf:
            conversation = ConversationHalf(True, True, False, 0)
        return RewindOutcome(plan.target.rewind_id, files, conversation, last)

    async def apply(self, worker: RewindSession, session: SessionRecord, req: UndoRequest) -> RewindOutcome:
        """Under the session's lock (`session`: its record as the hold gave it), pending intents
        resolved."""
        plan = await self._plan(worker, session, req)
        target, files = plan.target, plan.files
        outcome = self._outcome(session, plan)
        if plan.leaf and not req.validate_only:
            outcome = replace(outcome, conversation=replace(outcome.conversation, rewound=True))
        if not outcome.last_message_id:
            outcome = replace(outcome, last_message_id=plan.reading.view.last_message_id)
        if req.validate_only:
            return outcome
        undo_id = str(uuid.uuid4())
        snaps = self._snapshot_files.snapshots
        if files is not None and files.paths and session.workspace_snapshots and snaps:
            # The session's snapshot history must show the undo's change as the service's, not as
            # an outside edit: the workspace before it, recorded like a rewind's.
            whole = await snaps.take(worker.session_id, session.cwd)
            await self._snapshot_files.record_before(worker.session_id, undo_id, whole)
            files = replace(files, whole=whole.tree if whole.complete else None)
        intent = UndoIntent(undoes=target.rewind_id, files=files, leaf=plan.leaf, outcome=outcome)
        await self._ledger.begin_rewind(
            NewRewind(
                rewind_id=undo_id,
                session_id=worker.session_id,
                message_id=target.message_id,
                mode=target.mode,
                plan=intent.to_json(),
                principal=req.principal,
                request=req.request(),
                kind="undo",
            )
        )
        faults.point("undo.intent_recorded")
        record = await self._ledger.rewind(undo_id)
        assert record is not None
        return await self.finish(worker, record, session)

    async def finish(
        self, worker: RewindSession, record: RewindRecord, session: SessionRecord | None = None
    ) -> RewindOutcome:
        """Applies a recorded undo: files, then the conversation. Idempotent (recovery runs it).
        `session`: the session's record as the plan read it; None when recovering."""
        session = session if session is not None else worker.record
        intent = UndoIntent.of(record)
        outcome = intent.outcome
        files = intent.files
        if files is not None and files.paths and not record.files_applied:
            await self._snapshot_files.restore(
                session, record.rewind_id, files.before, files.paths, files.now, of="undo"
            )
            if session.workspace_snapshots:
                await self._snapshot_files.record_after(
                    session, record.rewind_id, files.whole, files.before, files.paths
                )
            faults.point("undo.files_restored")
            if intent.leaf:
                await self._ledger.mark_files_applied(record.rewind_id)
        anchor = None
        if intent.leaf:
            reading = await worker.transcript()
            anchor = Anchor(
                session_id=worker.session_id,
                anchor_uuid=intent.leaf,
                target_message_id="",
                transcript_size=reading.index.size,
                drops_turn=None,
                rewind_id=record.rewind_id,
            )
        # The event tells what the rewind it undoes was narrowed to, and its scope.
        undone = await self._ledger.rewind(intent.undoes)
        told = Intent.of(undone) if undone is not None else None
        event = NewEvent(
            kind="UNDONE",
            session_id=worker.session_id,
            rewind_id=intent.undoes,
            principal=record.principal,
            data=event_data(
                record.message_id,
                record.mode,
                outcome,
                owner=session.principal,
                paths=told.paths if told is not None else (),
                scope=told.scope if told is not None else SINCE,
            ),
        )
        # The points index as the restored conversation has it, in the same transaction.
        async with worker.cutting(anchor.anchor_uuid if anchor else None) as points:
            committed: EventRecord = await self._ledger.complete_rewind(
                record.rewind_id, outcome.to_json(), anchor, event, points
            )
        if self._publish is not None:
            self._publish(committed)
        faults.point("undo.completed")
        if anchor is not None:
            # The live process still has the cut: a new one resumes at the old leaf.
            worker.conversation_restored()
        log.info(
            "rewind undone", undo_id=record.rewind_id, rewind_id=intent.undoes, session_id=worker.session_id
        )
        return outcome
