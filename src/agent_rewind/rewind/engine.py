"""Planning and applying rewinds, with the rules of API.md.

Both halves are validated before anything is applied (the plan: what the rewind will do); files
go first (rewind_files is a call on the live client the conversation half replaces); a refused
half refuses the whole rewind. The ledger records the intent (rewind/intent.py) before anything is
applied, and that record is the commit point: from then on the rewind is finished, never left half
done, by the call, or before anything else happens on the session, or at the next start
(`resolve_pending`). The cut and the rewind's event are stored in the same transaction that marks
it applied, before the RPC returns. The apply phase runs in a task of its own, so a caller that
hangs up does not cut it short.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

import structlog

from agent_rewind import faults, metrics, tasks, tracing, workspace_paths
from agent_rewind.errors import (
    AgentRewindError,
    FileCheckpointUnavailable,
    FilesPruned,
    NoConversationAnchor,
    RewindConflict,
    WorkspaceOutsideRoot,
)
from agent_rewind.rewind import checkpoints, side_effects, workspace
from agent_rewind.rewind import paths as rewind_paths
from agent_rewind.rewind.calls import RewindRequest, UndoRequest, recorded
from agent_rewind.rewind.checkpoint_files import CheckpointFiles
from agent_rewind.rewind.intent import Applied, Intent, SnapshotRestore
from agent_rewind.rewind.outcome import (
    ConversationHalf,
    FilesHalf,
    RefusedHalf,
    RewindOutcome,
    event_data,
    refuse,
)
from agent_rewind.rewind.session import RewindSession
from agent_rewind.rewind.side_effects import SideEffect
from agent_rewind.rewind.snapshot_files import SnapshotFiles
from agent_rewind.rewind.undo import Undo
from agent_rewind.snapshots import Snapshot
from agent_rewind.snapshots.taking import Snapshots
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
from agent_rewind.transcript.entries import RewindPoint
from agent_rewind.transcript.index import ConversationView, TranscriptIndex

log = structlog.get_logger(__name__)

# How long the start may spend finishing one session's interrupted rewinds (`recover`).
RECOVERY_SECONDS = 60.0


@dataclass(frozen=True)
class _Plan:
    """What a rewind will do: the point, both halves, and what it was planned against."""

    # The session's record, read once for the rewind (its workspace, its settings, its owner).
    session: SessionRecord
    point: RewindPoint
    files: FilesHalf
    conversation: ConversationHalf
    last_message_id: str
    # A files half served by snapshots: what it restores, and the workspace as it was planned
    # against.
    restore: workspace.Restore | None = None
    now: Snapshot | None = None
    # The leaf of the conversation before the rewind (what an undo brings back).
    leaf: str | None = None
    # What the turns it takes back did that no rewind undoes.
    side_effects: tuple[SideEffect, ...] = ()
    # A files half from checkpoints planned without the CLI: the files it may change, as they
    # were (what it changed is seen after it, against these).
    looked: checkpoints.Files | None = None
    # The transcript as the plan read it (other leaves' views; its size, the cut's bound).
    index: TranscriptIndex | None = None


# A rewind's side effects read this many transcript lines at most on the event loop (more: in a thread).
_INLINE_READS = 16

# Errors that mean the rewind was tried and could not be carried out (the others refuse it
# before anything is applied).
_FAILURES = frozenset({"AGENT_UNAVAILABLE", "STORAGE_UNAVAILABLE", "INTERNAL"})


class _MovedOn(AgentRewindError):
    """The conversation moved on since the intent was recorded: cutting now would drop turns
    nobody asked to drop."""


Publish = Callable[[EventRecord], None]


class RewindEngine:
    def __init__(
        self, ledger: Ledger, publish: Publish | None = None, snapshots: Snapshots | None = None
    ) -> None:
        self._ledger = ledger
        # Told of every event this engine commits (the event hub), after the commit.
        self._publish = publish
        self._snapshot_files = SnapshotFiles(ledger, snapshots)
        self._checkpoint_files = CheckpointFiles(ledger)
        self._undo = Undo(ledger, self._snapshot_files, publish)

    async def undo(self, worker: RewindSession, req: UndoRequest) -> RewindOutcome:
        """UndoRewind (or its preview): all or nothing, durable, idempotent by request id; run
        in a task of its own like a rewind, so a caller that hangs up does not cut it short."""
        previous = await recorded(self._ledger, req)
        if previous is not None and previous.state == "applied" and not req.validate_only:
            assert previous.result is not None
            return RewindOutcome.from_json(previous.result)

        async def run() -> RewindOutcome:
            async with worker.exclusive() as session:
                await self.resolve_pending(worker)
                again = await recorded(self._ledger, req)
                if again is not None and not req.validate_only:
                    assert again.result is not None
                    return RewindOutcome.from_json(again.result)
                return await self._undo.apply(worker, session, req)

        return await tasks.shielded(run(), name=f"undo-{worker.session_id}")

    async def _plan(
        self, worker: RewindSession, session: SessionRecord, req: RewindRequest, *, preview: bool = False
    ) -> _Plan:
        """`session`: its record as the hold gave it; `preview`: a dry run, whose files half from
        checkpoints is the CLI's own preview."""
        reading = await worker.transcript()
        view = reading.view
        # Before resolving: a target dropped by a rewind the caller did not see is a conflict too.
        if req.expected_last_message_id is not None and req.expected_last_message_id != view.last_message_id:
            raise RewindConflict(req.expected_last_message_id, view.last_message_id)
        point = view.resolve(req.message_id)
        files = FilesHalf()
        restore: workspace.Restore | None = None
        now: Snapshot | None = None
        looked: checkpoints.Files | None = None
        intact = not req.mode.files or workspace_paths.intact(session.cwd)
        if intact and req.mode.files and req.paths:
            await asyncio.to_thread(rewind_paths.check_links, session.cwd, req.paths)
        # Retention deleted what a files rewind to the point needs (storage/retention.py).
        pruned = req.mode.files and is_pruned(point.create_time, await self._pruned_before(session))
        served = (
            await self._snapshot_files.plan(session, point, req)
            if req.mode.files and intact and not pruned
            else None
        )
        if pruned:
            files = FilesHalf(True, refusal=refuse(FilesPruned(point.message_id)))
        elif not intact:
            # The workspace (or a directory on the way) was replaced by a link: a restore would
            # write wherever it leads.
            cwd = session.cwd
            why = f"the workspace {cwd!r} is no longer a directory of its own: it, or a directory on the way, is a link"
            files = FilesHalf(True, refusal=refuse(WorkspaceOutsideRoot(cwd, [], why)))
        elif served is not None:
            files, restore, now = served.files, served.restore, served.now
        elif req.mode.files:
            files, looked = await self._checkpoint_files.plan(
                worker, session, view, point, req, preview=preview
            )
        conversation = ConversationHalf()
        if req.mode.conversation:
            if not point.resume_at_message_id:
                conversation = ConversationHalf(True, refusal=refuse(NoConversationAnchor(point.message_id)))
            else:
                conversation = ConversationHalf(True, True, messages_dropped=view.messages_from(point))
        effects = await self._side_effects(worker, view, point)
        return _Plan(
            session,
            point,
            files,
            conversation,
            view.last_message_id,
            restore,
            now,
            view.leaf,
            effects,
            looked,
            reading.index,
        )

    async def _pruned_before(self, session: SessionRecord) -> datetime | None:
        """The session's retention mark: points sent before it are files_pruned."""
        found = await self._ledger.usage(session.session_id)
        return found.files_pruned_before if found is not None else None

    async def _side_effects(
        self, worker: RewindSession, view: ConversationView, point: RewindPoint
    ) -> tuple[SideEffect, ...]:
        """What the turns from `point` on did that no rewind undoes. Their few lines are read on
        the loop; many, in a thread."""
        reached = await worker.egress()
        egress = []
        if reached:
            dropped = {p.message_id for p in view.points[point.index :]}
            # (Once each: a record written while the list was first read may be in it twice.)
            egress = [
                side_effects.Egress(r.prompt_id, r.host, r.port)
                for r in dict.fromkeys(reached)
                if r.prompt_id in dropped
            ]
        wanted = side_effects.to_read(view, point)
        if len(wanted) > _INLINE_READS:
            return await asyncio.to_thread(side_effects.collect, view, point, egress, wanted)
        return side_effects.collect(view, point, egress, wanted)

    async def dry_run(self, worker: RewindSession, req: RewindRequest) -> RewindOutcome:
        """Previews a rewind; refusals are reported inside the result."""
        async with worker.exclusive() as session:
            await self.resolve_pending(worker)
            plan = await self._plan(worker, session, req, preview=True)
            last = plan.last_message_id
            if plan.conversation.can_rewind:
                assert plan.index is not None
                last = plan.index.view(plan.point.anchor).last_message_id
        return RewindOutcome("", plan.files, plan.conversation, last, plan.side_effects)

    async def rewind(self, worker: RewindSession, req: RewindRequest) -> RewindOutcome:
        """Applies a rewind, all of it or nothing.

        The work runs in a task of its own: a caller that hangs up mid-way does not stop it (the
        files may already be restored), and a retry with the same request_id gets its result.
        """
        # A retry of an applied rewind gets its result whatever the session does now.
        previous = await recorded(self._ledger, req)
        if previous is not None and previous.state == "applied":
            assert previous.result is not None
            return RewindOutcome.from_json(previous.result)
        return await tasks.shielded(self._rewind_exclusive(worker, req), name=f"rewind-{worker.session_id}")

    async def rewind_before_prompt(self, worker: RewindSession, req: RewindRequest) -> RewindOutcome:
        """PromptRequest.rewind: applies the rewind from the turn's own task, under the session
        lock the turn holds, so no other prompt can slip in between (a refusal raises, and the
        turn sends nothing)."""
        return await self._rewind_exclusive(worker, req, held=True)

    async def _rewind_exclusive(
        self, worker: RewindSession, req: RewindRequest, held: bool = False
    ) -> RewindOutcome:
        """`held`: the caller holds the session's lock already (a prompt's rewind)."""
        started = time.perf_counter()
        outcome = "failed"
        source = "checkpoint" if req.mode.files else "none"
        with tracing.span("rewind", session_id=worker.session_id, mode=req.mode.value) as span:
            try:
                async with contextlib.nullcontext(worker.record) if held else worker.exclusive() as session:
                    await self.resolve_pending(worker)
                    previous = await recorded(self._ledger, req)
                    if previous is not None:  # finished just now by resolve_pending, or before
                        assert previous.result is not None
                        outcome = "retried"
                        return RewindOutcome.from_json(previous.result)
                    result = await self._rewind_locked(worker, session, req)
                    outcome = "applied"
                    if req.mode.files:
                        source = result.files.source
                    metrics.REWIND_SECONDS.labels(req.mode.value).observe(time.perf_counter() - started)
                    span.set(rewind_id=result.rewind_id)
                    return result
            except AgentRewindError as err:
                outcome = "failed" if err.reason in _FAILURES else "refused"
                raise
            finally:
                span.set(outcome=outcome, files_source=source)
                if outcome != "retried":
                    metrics.REWINDS.labels(req.mode.value, outcome, source).inc()

    async def _rewind_locked(
        self, worker: RewindSession, session: SessionRecord, req: RewindRequest
    ) -> RewindOutcome:
        with tracing.span("rewind.plan") as span:
            plan = await self._plan(worker, session, req)
            span.set(
                files_changed=len(plan.files.files_changed),
                messages_dropped=plan.conversation.messages_dropped,
            )
            for half in (plan.files, plan.conversation):
                if half.refusal is not None:
                    raise RefusedHalf(half.refusal)
        faults.point("rewind.planned")
        rewind_id = str(uuid.uuid4())
        if plan.restore is not None and plan.now is not None:
            await self._snapshot_files.record_before(worker.session_id, rewind_id, plan.now)
        before = (
            await self._snapshot_files.keep_before(plan.session, plan.files, plan.restore)
            if req.mode.files
            else None
        )
        anchor = None
        if req.mode.conversation:
            anchor = Anchor(
                session_id=worker.session_id,
                anchor_uuid=plan.point.anchor,
                target_message_id=plan.point.message_id,
                transcript_size=plan.index.size if plan.index is not None else 0,
                drops_turn=None,
                rewind_id=rewind_id,
            )
        restore = plan.restore
        snapshot = SnapshotRestore(restore.start, restore.now, restore.paths) if restore is not None else None
        intent = Intent(
            target=plan.point.message_id,
            restores_files=req.mode.files,
            outcome=RewindOutcome(rewind_id, plan.files, plan.conversation, "", plan.side_effects),
            anchor=anchor,
            snapshot=snapshot,
            files_before=before,
            planned_leaf=plan.leaf,
            planned_last_message_id=plan.last_message_id,
            planned_transcript_size=plan.index.size if plan.index is not None else 0,
            observed=plan.looked is not None,
            paths=req.paths,
            scope=req.scope,
        )
        with tracing.span("rewind.intent", rewind_id=rewind_id):
            await self._ledger.begin_rewind(
                NewRewind(
                    rewind_id=rewind_id,
                    session_id=worker.session_id,
                    message_id=req.message_id,
                    mode=req.mode.value,
                    plan=intent.to_json(),
                    principal=req.principal,
                    request=req.request(),
                )
            )
        faults.point("rewind.intent_recorded")
        log.info(
            "rewind intent recorded", rewind_id=rewind_id, session_id=worker.session_id, mode=req.mode.value
        )
        record = await self._ledger.rewind(rewind_id)
        assert record is not None
        return await self._finish(worker, record, plan.looked, plan.session)

    async def _finish(
        self,
        worker: RewindSession,
        record: RewindRecord,
        looked: checkpoints.Files | None = None,
        session: SessionRecord | None = None,
    ) -> RewindOutcome:
        """Applies a recorded intent: files, then the conversation cut. Under the session's lock.
        `looked`, `session`: the files and the session's record as the plan read them; None when
        recovering."""
        intent = Intent.of(record)
        session = session if session is not None else worker.record
        files = intent.outcome.files
        anchor = replace(intent.anchor, drops_turn=None) if intent.anchor is not None else None
        reading = await worker.transcript()  # also catches up with the transcript, after a restart
        view = reading.view
        current = anchor is None or self._still_current(view, intent, anchor)
        if not current and not record.files_applied:
            # Nothing applied yet, and the cut would drop turns nobody asked to drop: drop it all.
            await self._ledger.abandon_rewind(record.rewind_id)
            log.error("dropping a rewind intent the conversation has moved past", rewind_id=record.rewind_id)
            raise _MovedOn("the rewind could not be finished; the conversation has changed since")
        if intent.restores_files and not record.files_applied and intent.snapshot is not None:
            with tracing.span("rewind.files", rewind_id=record.rewind_id, files_source="snapshot"):
                restore = intent.snapshot
                await self._snapshot_files.restore(
                    session, record.rewind_id, restore.start, restore.paths, restore.now
                )
                await self._snapshot_files.record_after(
                    session, record.rewind_id, restore.now, restore.start, restore.paths
                )
                faults.point("rewind.files_restored")
                if anchor is not None:
                    await self._ledger.mark_files_applied(record.rewind_id)
                    faults.point("rewind.files_recorded")
        elif intent.restores_files and not record.files_applied:
            with tracing.span("rewind.files", rewind_id=record.rewind_id, files_source="checkpoint"):
                files = await self._checkpoint_files.restore(worker, session, record, intent, view)
                faults.point("rewind.files_restored")
                if anchor is not None:
                    # Only a rewind with a conversation half needs this mark: it must be finished even
                    # if the conversation moves on. A files-only rewind interrupted here is restored
                    # again on recovery (restoring is idempotent), which saves a synced commit.
                    await self._ledger.mark_files_applied(record.rewind_id)
                    faults.point("rewind.files_recorded")
        conversation = intent.outcome.conversation
        last = view.last_message_id
        if anchor is not None and current:
            conversation = ConversationHalf(True, True, True, conversation.messages_dropped)
            last = reading.index.view(anchor.anchor_uuid).last_message_id
        elif anchor is not None:
            # The files were restored before the conversation moved on (it cannot while an intent
            # is pending, but a CLI that starts turns of its own could): the files half stands,
            # and the result says the conversation was not cut.
            log.error(
                "a rewind's conversation moved on after its files were restored", rewind_id=record.rewind_id
            )
            conversation = ConversationHalf(True, False, False, 0)
            anchor = None
        after = await self._snapshot_files.keep_after(session, intent) if files.can_rewind else None
        if intent.observed and intent.restores_files:
            files = await self._seen(session, intent, files, looked, after)
        final = RewindOutcome(record.rewind_id, files, conversation, last, intent.outcome.side_effects)
        event = NewEvent(
            kind="REWOUND",
            session_id=worker.session_id,
            rewind_id=record.rewind_id,
            principal=record.principal,
            data=event_data(
                intent.target,
                record.mode,
                final,
                owner=session.principal,
                paths=intent.paths,
                scope=intent.scope,
            ),
        )
        # The cut and the event, committed together with the rewind marked applied, and the points
        # index as the cut leaves it, in the same transaction.
        with tracing.span("rewind.completion", rewind_id=record.rewind_id, cut=anchor is not None):
            result = Applied(final, files_after=after).to_json()
            async with worker.cutting(anchor.anchor_uuid if anchor else None) as points:
                committed = await self._ledger.complete_rewind(
                    record.rewind_id, result, anchor, event, points
                )
            if self._publish is not None:
                self._publish(committed)
        faults.point("rewind.completed")
        if anchor is not None:
            # The live process remembers the dropped turns: cut them there too.
            with tracing.span("rewind.conversation", rewind_id=record.rewind_id):
                await worker.cut_conversation(anchor.target_message_id)
        log.info(
            "rewind applied",
            rewind_id=record.rewind_id,
            session_id=worker.session_id,
            files_changed=len(files.files_changed),
            messages_dropped=conversation.messages_dropped,
        )
        return final

    async def _seen(
        self,
        session: SessionRecord,
        intent: Intent,
        files: FilesHalf,
        looked: checkpoints.Files | None,
        after: str | None,
    ) -> FilesHalf:
        """What a files rewind planned without the CLI changed (`Intent.observed`): against the
        files as the plan read them; when recovering, against the trees kept for an undo. Neither
        known: the files it may have changed, with no line counts."""
        cwd = Path(session.cwd)
        found = await asyncio.to_thread(checkpoints.seen, cwd, looked) if looked is not None else None
        if found is None:
            found = await self._snapshot_files.changed(session, intent, after)
        if found is None:
            log.warning("what a files rewind changed could not be seen", session_id=session.session_id)
            return files
        changed, insertions, deletions = found
        return replace(files, files_changed=changed, insertions=insertions, deletions=deletions)

    @staticmethod
    def _still_current(view: ConversationView, intent: Intent, anchor: Anchor) -> bool:
        planned = intent.planned_last_message_id
        if planned is not None:
            return bool(view.last_message_id == planned)
        # An intent recorded by an older version: the anchor and the target are still visible.
        return bool(view.contains(anchor.anchor_uuid) and view.contains(anchor.target_message_id))

    async def resolve_pending(self, worker: RewindSession) -> None:
        """Finishes the session's recorded, unfinished rewinds. Call under the session's lock;
        runs before any prompt or rewind, so nothing ever runs on half a rewind."""
        for record in await self._ledger.pending_rewinds(worker.session_id):
            log.warning("finishing an interrupted rewind", rewind_id=record.rewind_id, kind=record.kind)
            try:
                if record.kind == "undo":
                    await self._undo.finish(worker, record)
                    continue
                await self._finish(worker, record)
            except _MovedOn:
                continue
            except FileCheckpointUnavailable as err:
                log.error(
                    "an interrupted rewind could not restore its files",
                    rewind_id=record.rewind_id,
                    error=err.message,
                )

    async def recover(self, workers: Mapping[str, RewindSession]) -> None:
        """Finishes rewinds a crash interrupted, before the server admits any call. Each session
        gets at most RECOVERY_SECONDS: one whose rewind cannot be finished (its CLI hangs, its
        files cannot be read) keeps the rewind pending, is logged, and is tried again before its
        next prompt or rewind; the server serves the rest."""
        for session_id in {r.session_id for r in await self._ledger.pending_rewinds()}:
            worker = workers.get(session_id)
            if worker is None:
                continue
            try:
                async with asyncio.timeout(RECOVERY_SECONDS), worker.exclusive():
                    await self.resolve_pending(worker)
            except AgentRewindError as err:
                log.error("could not finish an interrupted rewind", session_id=session_id, error=err.message)
            except TimeoutError:
                log.error(
                    "could not finish an interrupted rewind in time; it stays pending",
                    session_id=session_id,
                    seconds=RECOVERY_SECONDS,
                )
            except Exception as err:  # one session's failure must not keep the server from serving
                log.exception("could not finish an interrupted rewind", session_id=session_id, error=str(err))
