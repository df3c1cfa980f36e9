"""Planning and applying rewinds, with the rules of API.md.

Both halves are validated before anything is applied; files go first (rewind_files is a
call on the live client the conversation half replaces); a refused files half refuses
the whole rewind; the ledger records the intent before applying, and stores the
conversation cut in the same transaction that marks the rewind applied, before the RPC
returns.
"""

from __future__ import annotations

import enum
import json
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

import structlog

from agent_rewind import faults
from agent_rewind.errors import (
    AgentRewindError,
    CheckpointingDisabled,
    FileCheckpointUnavailable,
    NoConversationAnchor,
    RequestIdReused,
    RewindConflict,
)
from agent_rewind.sessions.worker import SessionWorker
from agent_rewind.store.ledger import Anchor, Ledger, RewindRecord
from agent_rewind.transcript.entries import RewindPoint

log = structlog.get_logger(__name__)


class Mode(enum.Enum):
    FILES = "files"
    CONVERSATION = "conversation"
    BOTH = "both"

    @property
    def files(self) -> bool:
        return self in (Mode.FILES, Mode.BOTH)

    @property
    def conversation(self) -> bool:
        return self in (Mode.CONVERSATION, Mode.BOTH)


@dataclass(frozen=True)
class Refusal:
    """Why one half would be refused: the reason and message of the error Rewind fails with."""

    reason: str
    message: str
    metadata: dict[str, str] = field(default_factory=dict)


def _refuse(err: AgentRewindError) -> Refusal:
    return Refusal(err.reason, err.message, dict(err.metadata))


class RefusedHalf(AgentRewindError):
    """Raised by Rewind for a refused half; carries the refusal's own reason."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message, metadata=refusal.metadata)
        self.reason = refusal.reason


@dataclass(frozen=True)
class FilesHalf:
    requested: bool = False
    can_rewind: bool = False
    files_changed: tuple[str, ...] = ()
    insertions: int = 0
    deletions: int = 0
    skipped_links: int = 0
    refusal: Refusal | None = None


@dataclass(frozen=True)
class ConversationHalf:
    requested: bool = False
    can_rewind: bool = False
    rewound: bool = False
    messages_dropped: int = 0
    refusal: Refusal | None = None


@dataclass(frozen=True)
class RewindOutcome:
    rewind_id: str
    files: FilesHalf
    conversation: ConversationHalf
    last_message_id: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RewindOutcome:
        def refusal(raw: dict[str, Any]) -> Refusal | None:
            return Refusal(**raw["refusal"]) if raw.get("refusal") else None

        files = data["files"]
        conversation = data["conversation"]
        return cls(
            rewind_id=data["rewind_id"],
            files=FilesHalf(
                **{**files, "files_changed": tuple(files["files_changed"]), "refusal": refusal(files)}
            ),
            conversation=ConversationHalf(**{**conversation, "refusal": refusal(conversation)}),
            last_message_id=data["last_message_id"],
        )


@dataclass(frozen=True)
class RewindRequest:
    session_id: str
    message_id: str
    mode: Mode
    expected_last_message_id: str | None = None
    request_id: str | None = None
    principal: str = ""

    def fingerprint(self) -> str:
        return json.dumps([self.session_id, self.message_id, self.mode.value, self.expected_last_message_id])


@dataclass(frozen=True)
class _Plan:
    point: RewindPoint
    files: FilesHalf
    conversation: ConversationHalf
    turns_dropped: int
    last_message_id: str


class RewindEngine:
    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    async def _plan(self, worker: SessionWorker, req: RewindRequest) -> _Plan:
        view = await worker.view()
        # Before resolving: a target dropped by a rewind the caller did not see is a conflict too.
        if req.expected_last_message_id is not None and req.expected_last_message_id != view.last_message_id:
            raise RewindConflict(req.expected_last_message_id, view.last_message_id)
        point = view.resolve(req.message_id)
        files = FilesHalf()
        if req.mode.files:
            if not worker.record.checkpointing:
                files = FilesHalf(True, refusal=_refuse(CheckpointingDisabled(worker.session_id)))
            else:
                answer = await worker.rewind_files(point.message_id, dry_run=True)
                if answer.can_rewind:
                    files = FilesHalf(
                        True,
                        True,
                        answer.files_changed,
                        answer.insertions,
                        answer.deletions,
                        answer.skipped_links,
                    )
                else:
                    err = FileCheckpointUnavailable(
                        point.message_id, answer.error or "the CLI cannot rewind files"
                    )
                    files = FilesHalf(True, refusal=_refuse(err))
        conversation = ConversationHalf()
        if req.mode.conversation:
            if not point.resume_at_message_id:
                conversation = ConversationHalf(True, refusal=_refuse(NoConversationAnchor(point.message_id)))
            else:
                conversation = ConversationHalf(True, True, messages_dropped=view.messages_from(point))
        # The CLI checks resume_drops_turn against the transcript, which may still hold turns an
        # earlier, not yet written, cut dropped: count those too.
        turns_after = len(worker.transcript_view().points) - point.index
        return _Plan(point, files, conversation, turns_after, view.last_message_id)

    async def dry_run(self, worker: SessionWorker, req: RewindRequest) -> RewindOutcome:
        """Previews a rewind; refusals are reported inside the result."""
        async with worker.exclusive():
            plan = await self._plan(worker, req)
            last = plan.last_message_id
            if plan.conversation.can_rewind:
                last = worker.view_at(plan.point.resume_at_message_id).last_message_id
        return RewindOutcome("", plan.files, plan.conversation, last)

    async def rewind(self, worker: SessionWorker, req: RewindRequest) -> RewindOutcome:
        """Applies a rewind, all of it or nothing."""
        if req.request_id:
            # A retry of an applied rewind gets its result whatever the session does now.
            previous = self._ledger.rewind_by_request(req.request_id)
            if previous is not None and previous.state == "applied":
                if previous.fingerprint != req.fingerprint():
                    raise RequestIdReused(req.request_id)
                assert previous.result is not None
                return RewindOutcome.from_json(previous.result)
        async with worker.exclusive():
            return await self._rewind_locked(worker, req)

    async def _rewind_locked(self, worker: SessionWorker, req: RewindRequest) -> RewindOutcome:
        if req.request_id:
            previous = self._ledger.rewind_by_request(req.request_id)
            if previous is not None:
                if previous.fingerprint != req.fingerprint():
                    raise RequestIdReused(req.request_id)
                if previous.state == "pending":
                    return await self._finish(worker, previous)
                assert previous.result is not None
                return RewindOutcome.from_json(previous.result)
        plan = await self._plan(worker, req)
        for half in (plan.files, plan.conversation):
            if half.refusal is not None:
                raise RefusedHalf(half.refusal)
        faults.point("rewind.planned")
        rewind_id = str(uuid.uuid4())
        anchor = None
        if req.mode.conversation:
            anchor = Anchor(
                session_id=worker.session_id,
                anchor_uuid=plan.point.resume_at_message_id,
                target_message_id=plan.point.message_id,
                transcript_size=worker.transcript_size(),
                drops_turn=plan.point.message_id if plan.turns_dropped == 1 else None,
                rewind_id=rewind_id,
            )
        self._ledger.begin_rewind(
            rewind_id=rewind_id,
            session_id=worker.session_id,
            request_id=req.request_id or None,
            fingerprint=req.fingerprint(),
            message_id=req.message_id,
            mode=req.mode.value,
            plan={
                "target": plan.point.message_id,
                "files": req.mode.files,
                "anchor": asdict(anchor) if anchor else None,
                "outcome": RewindOutcome(rewind_id, plan.files, plan.conversation, "").to_json(),
            },
            principal=req.principal,
        )
        faults.point("rewind.intent_recorded")
        log.info(
            "rewind intent recorded", rewind_id=rewind_id, session_id=worker.session_id, mode=req.mode.value
        )
        record = self._ledger.rewind(rewind_id)
        assert record is not None
        return await self._finish(worker, record)

    async def _finish(self, worker: SessionWorker, record: RewindRecord) -> RewindOutcome:
        """Applies a recorded intent: files, then the conversation cut. Also used after a crash.

        Until the files are restored nothing has changed, so any failure drops the intent (a
        retry plans afresh). Once they are, the ledger says so, and the intent is finished,
        here or by the recovery at the next start.
        """
        plan = record.plan
        outcome = RewindOutcome.from_json(plan["outcome"])
        files = outcome.files
        if plan["files"] and not record.files_applied:
            try:
                answer = await worker.rewind_files(plan["target"], dry_run=False)
                if not answer.can_rewind:
                    raise FileCheckpointUnavailable(
                        plan["target"], answer.error or "the CLI cannot rewind files"
                    )
            except BaseException:
                self._ledger.abandon_rewind(record.rewind_id)
                raise
            faults.point("rewind.files_restored")
            self._ledger.mark_files_applied(record.rewind_id)
            faults.point("rewind.files_recorded")
            files = FilesHalf(
                True, True, files.files_changed, files.insertions, files.deletions, answer.skipped_links
            )
        anchor = Anchor(**plan["anchor"]) if plan["anchor"] else None
        conversation = outcome.conversation
        view = await worker.view()  # also catches up with the transcript, after a restart
        last = view.last_message_id
        if anchor is not None:
            if not (view.contains(anchor.anchor_uuid) and view.contains(anchor.target_message_id)):
                # The conversation moved on since the intent was recorded: cutting now would
                # drop turns nobody asked to drop.
                self._ledger.abandon_rewind(record.rewind_id)
                log.error(
                    "dropping a rewind intent the conversation has moved past", rewind_id=record.rewind_id
                )
                raise AgentRewindError("the rewind could not be finished; the conversation has changed since")
            conversation = ConversationHalf(True, True, True, conversation.messages_dropped)
            last = worker.view_at(anchor.anchor_uuid).last_message_id
        final = RewindOutcome(record.rewind_id, files, conversation, last)
        self._ledger.complete_rewind(record.rewind_id, final.to_json(), anchor)
        faults.point("rewind.completed")
        if anchor is not None:
            # The live process remembers the dropped turns: cut them there too.
            await worker.cut_conversation(anchor.target_message_id)
        log.info(
            "rewind applied",
            rewind_id=record.rewind_id,
            session_id=worker.session_id,
            files_changed=len(files.files_changed),
            messages_dropped=conversation.messages_dropped,
        )
        return final

    async def recover(self, workers: dict[str, SessionWorker]) -> None:
        """Finishes rewinds whose intent was recorded but that a crash interrupted."""
        for record in self._ledger.pending_rewinds():
            worker = workers.get(record.session_id)
            if worker is None:
                continue
            log.warning("finishing an interrupted rewind", rewind_id=record.rewind_id)
            try:
                async with worker.exclusive():
                    await self._finish(worker, record)
            except AgentRewindError as err:
                log.error(
                    "could not finish an interrupted rewind", rewind_id=record.rewind_id, error=err.message
                )
