"""One worker per session: its state, its lock, its transcript view, its turns.

Every prompt, rewind and rebuild of the CLI process runs under the worker's lock (API.md rule 4);
different sessions have different workers and never wait on each other. A turn holds the lock
until its result; a rewind that finds a turn running is refused at once (TURN_IN_FLIGHT) rather
than queued behind it. The live process is `process.AgentProcess`'s; a turn's events are a
`turns.Turn`.

No path leaves a session unusable until a restart: every turn ends (on the CLI's result, on an
error, or, when it ignores Interrupt for `interrupt_timeout` seconds, by killing its process),
the lock is released on every path, and a failed write to the ledger fails the call that made it
without wedging the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any

import structlog

from agent_rewind import faults, tasks
from agent_rewind.errors import (
    AgentRewindError,
    AgentUnavailable,
    RequestIdReused,
    SessionNotFound,
    ShuttingDown,
    StorageUnavailable,
    TurnInFlight,
)
from agent_rewind.sessions.adapter import AgentClient, AgentError, ClientSpec, pin_leaf
from agent_rewind.sessions.events import ConversationAnswer, FilesAnswer, PromptEvent, ResultEvent
from agent_rewind.sessions.live import LiveSlots
from agent_rewind.sessions.process import AgentProcess, ClientFactory
from agent_rewind.sessions.snapshotting import TURN_END, TURN_START, Snapshots
from agent_rewind.sessions.turns import Prelude, Turn, error_record
from agent_rewind.store.ledger import Anchor, Ledger, NewRequest, RequestIdTaken, SessionRecord, dumps
from agent_rewind.transcript.index import ConversationView, TranscriptIndex
from agent_rewind.transcript.paths import exists, transcript_path

log = structlog.get_logger(__name__)

# How many recent turns a retried Prompt (same request_id) re-attaches to in memory, per session;
# older ones are replayed from the ledger.
_TURNS_REMEMBERED = 32
# Transcript reads larger than this run in a thread (a 5,000-turn transcript is about 35 MB).
_READ_INLINE_BYTES = 1 << 20
# How often a turn looks for its prompt in the transcript, to announce the rewind point early.
_ANNOUNCE_POLL = 0.001
# After the CLI's echo, how long the prompt event may wait for the transcript to show the prompt.
_ECHO_TO_TRANSCRIPT = 5.0


_NO_SNAPSHOTS: Mapping[str, bool] = MappingProxyType({})


class State:
    IDLE = "IDLE"
    RUNNING = "RUNNING"
    HIBERNATED = "HIBERNATED"
    CLOSED = "CLOSED"


async def _no_pending(worker: SessionWorker) -> None:
    return None


def _any_turn(worker: SessionWorker) -> None:
    return None


@dataclass(frozen=True)
class WorkerContext:
    """What every worker shares: the ledger, how to start a client, the CLI's environment."""

    ledger: Ledger
    client_factory: ClientFactory
    cli_env: Mapping[str, str]
    claude_config_dir: Path
    idle_timeout: float
    # Seconds a turn may ignore Interrupt before its process is killed.
    interrupt_timeout: float = 10.0
    # Finishes a session's pending rewind intents (set by the rewind engine); run under the lock
    # before any prompt or rewind, so nothing runs on a half-applied rewind.
    resolve_pending: Callable[[SessionWorker], Awaitable[None]] = _no_pending
    project_settings: bool = False
    # Raises (QuotaExceeded) when the session's principal may not start another turn now; called
    # in the same step that claims the session for a turn, so two prompts cannot both slip by.
    admit_turn: Callable[[SessionWorker], None] = _any_turn
    # The bound on live CLI processes (--max-live-sessions); None: no bound.
    live: LiveSlots | None = None
    # Workspace snapshots (None: off on this server), and how many points keep theirs (0: all).
    snapshots: Snapshots | None = None
    snapshot_retention: int = 0
    # This replica's id (--replica-id): the owner of the sessions it creates.
    replica_id: str = ""


class SessionWorker:
    def __init__(self, record: SessionRecord, ctx: WorkerContext) -> None:
        self._ctx = ctx
        self.record = record
        self.session_id = record.session_id
        self.lock = asyncio.Lock()
        self._log = log.bind(session_id=self.session_id)
        self.process = AgentProcess(self.session_id, ctx.client_factory, self._log, ctx.live, self._evict)
        self._background: set[asyncio.Task[None]] = set()
        self._turn: Turn | None = None
        # Claimed from the moment a prompt is accepted (before its CLI may still be starting)
        # until its turn ends: rewinds and second prompts are refused for all of that time.
        self._turn_claimed = False
        self._interrupt_pending = False
        self._turn_task: asyncio.Task[None] | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._index: TranscriptIndex | None = None
        self._read_lock = asyncio.Lock()
        self._turns_by_request: dict[str, Turn] = {}
        self._shutting_down = False
        self._newest_turn_pid: int | None = None
        self.update_time: datetime = record.update_time
        # The RPC layer's last page of points, encoded, with what it was made from (it is the
        # same bytes while none of that changes); dropped with the index on hibernation.
        self.page_cache: tuple[Any, ...] | None = None
        # DeleteSession: `_retiring` while it ends the session's work (undone if it fails before
        # the ledger's commit), `deleted` from that commit on. Either way nothing new may run.
        self._retiring = False
        self.deleted = False

    # State

    @property
    def replica(self) -> str:
        """The replica that owns the session: this one. A replica holds workers only for the
        sessions it owns (`SessionRegistry.load`); the others forward calls here."""
        return self._ctx.replica_id

    @property
    def state(self) -> str:
        if self.turn_running:
            return State.RUNNING
        if self.record.closed:
            return State.CLOSED
        if self.process.alive:
            return State.IDLE
        return State.HIBERNATED

    @property
    def turn_running(self) -> bool:
        return self._turn_claimed

    @property
    def client_pid(self) -> int | None:
        return self.process.pid

    @property
    def holds_newest_checkpoint(self) -> bool:
        """Whether the live process ran the newest prompt: then it holds that prompt's file
        checkpoint even before the CLI writes it to the transcript."""
        return self.process.alive and self.process.pid == self._newest_turn_pid

    @property
    def file_history(self) -> Path:
        """Where the CLI keeps this session's file backups (its checkpoints' content)."""
        return self._ctx.claude_config_dir / "file-history" / self.session_id

    # The transcript, as the service shows it

    def _transcript(self) -> TranscriptIndex:
        # Until the CLI has written the file, look again each time: the CLI shortens very long
        # project paths in its own way, which only the file's presence reveals.
        if self._index is None or (self._index.size == 0 and not exists(self._index.path)):
            path = transcript_path(self._ctx.claude_config_dir, self.record.cwd, self.session_id)
            if self._index is None or path != self._index.path:
                self._index = TranscriptIndex(path)
        return self._index

    async def catch_up(self) -> TranscriptIndex:
        """Reads what the CLI appended to the transcript since the last read.

        A large read (a long session's first) runs in a thread so the event loop, and every
        other session, never waits on it. Reads of one session are serialized.
        """
        index = self._transcript()
        async with self._read_lock:
            try:
                unread = index.path.stat().st_size - index.size
            except OSError:
                unread = 0
            if unread > _READ_INLINE_BYTES:
                await asyncio.to_thread(index.refresh)
            else:
                index.refresh()
        return index

    async def view(self) -> ConversationView:
        """The visible conversation: the transcript's own, cut at a pending rewind anchor if any.

        A conversation rewind is durable the moment it returns because the cut lives in the
        ledger until a new turn has written it into the transcript itself (and that write is on
        disk: the transcript is fsynced before the ledger lets the cut go).
        """
        index = await self.catch_up()
        anchor = await self._ctx.ledger.anchor(self.session_id)
        if anchor is None:
            return index.view()
        if self._cut_is_in_transcript(index, anchor):
            await asyncio.to_thread(_fsync, index.path)
            await self._ctx.ledger.clear_anchor(self.session_id, anchor.anchor_uuid)
            self._log.info("rewind cut now in transcript", anchor=anchor.anchor_uuid)
            return index.view()
        return index.view(anchor.anchor_uuid)

    # The three below read what the last `view()` caught up with.

    def transcript_view(self) -> ConversationView:
        """The conversation as the transcript alone shows it, ignoring a pending cut."""
        return self._transcript().view()

    def view_at(self, leaf: str) -> ConversationView:
        """The conversation as it would be after a cut at `leaf`."""
        return self._transcript().view(leaf)

    @property
    def transcript_file(self) -> Path:
        """Where the CLI writes this session's transcript."""
        return self._transcript().path

    def transcript_size(self) -> int:
        size: int = self._transcript().size
        return size

    @staticmethod
    def _cut_is_in_transcript(index: TranscriptIndex, anchor: Anchor) -> bool:
        leaf = index.leaf
        entry = index.get(leaf) if leaf else None
        if entry is None or entry.offset < anchor.transcript_size:
            return False
        view = index.view(leaf)
        if not view.contains(anchor.anchor_uuid) or view.contains(anchor.target_message_id):
            return False
        # A whole new turn, not just bookkeeping written on resume.
        return any(
            p.message_id != anchor.target_message_id
            and (e := index.get(p.message_id)) is not None
            and e.offset >= anchor.transcript_size
            for p in view.points[-1:]
        )

    # The process

    async def _spec(self) -> ClientSpec:
        """How to start the CLI now: resumed at the leaf the service shows, or fresh."""
        view = await self.view()
        leaf = view.leaf
        return ClientSpec(
            session_id=self.session_id,
            cwd=Path(self.record.cwd),
            options=self.record.options,
            checkpointing=self.record.checkpointing,
            env=self._ctx.cli_env,
            # A session never prompted has no conversation to resume: it starts fresh, under its id.
            resume=leaf is not None,
            resume_session_at=leaf,
            stderr=self._on_stderr,
            project_settings=self._ctx.project_settings,
        )

    def _on_stderr(self, line: str) -> None:
        self._log.debug("cli stderr", line=line.rstrip())

    async def ensure_client(self) -> AgentClient:
        """The live client, started (or resumed) if needed. Call under the lock."""
        self.check_not_deleted()
        client = self.process.client
        if client is not None and client.alive:
            self.process.used()
            return client
        if self._shutting_down:
            raise ShuttingDown()
        spec = await self._spec()
        if spec.resume and spec.resume_session_at:
            await self.process.settle()  # no process of the session writes its transcript now
            await asyncio.to_thread(
                pin_leaf, self._transcript().path, self.session_id, spec.resume_session_at
            )
        client = await self.process.start(spec)
        if not self.record.started:
            await self._ctx.ledger.touch_session(self.session_id, started=True)
            self.record = replace(self.record, started=True)
        return client

    async def cut_conversation(self, target: str) -> None:
        """The conversation was cut just before the prompt `target` (a rewind). Call under the lock.

        A live process still remembers the dropped turns. It is cut in place when the CLI agrees
        (milliseconds, and the next prompt finds the process ready); otherwise it is let go and a
        new one resuming at the cut starts in the background once the caller releases the lock.
        A session without a live process needs nothing: its next start resumes at the cut.
        """
        client = self.process.client
        if client is None or not client.alive:
            return
        newest = self.transcript_view().points
        try:
            answer = await client.rewind_conversation(target, newest[-1].message_id if newest else target)
        except AgentError as err:
            answer = ConversationAnswer(False, "error", str(err))
        if answer.rewound:
            self._log.info("conversation cut in the live process", target=target)
            return
        self._log.info("cli refused the cut in place; resuming a new process", reason=answer.reason)
        self.process.let_go()
        if not self.record.closed and not self._shutting_down:
            self._in_background(self._prewarm(), f"prewarm-{self.session_id}")

    def conversation_restored(self) -> None:
        """An undo brought dropped turns back into the conversation the service shows. The live
        process cannot un-cut itself: it is let go, and a new one resuming at the restored leaf
        starts in the background once the caller releases the lock. Call under the lock."""
        if self.process.client is None:
            return
        self.process.let_go()
        if not self.record.closed and not self._shutting_down:
            self._in_background(self._prewarm(), f"prewarm-{self.session_id}")

    def _in_background(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = tasks.detach(work, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _prewarm(self) -> None:
        async with self.lock:
            if self.process.client is not None or self.record.closed or self._shutting_down or self.gone:
                return
            try:
                await self.ensure_client()
            except AgentRewindError as err:
                # The next call tries again and reports it; nobody waits on this one.
                self._log.warning("could not start the CLI after a rewind", error=err.message)
                return
            self._arm_idle_timer()

    # Exclusive work (rewinds)

    def check_no_turn(self) -> None:
        if self.turn_running:
            raise TurnInFlight(self.session_id)

    @property
    def gone(self) -> bool:
        """Being deleted, or deleted: nothing new runs on the session."""
        return self._retiring or self.deleted

    def check_not_deleted(self) -> None:
        """SESSION_NOT_FOUND for work that reached the session while it was being deleted."""
        if self.gone:
            raise SessionNotFound(self.session_id)

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """Holds the session's lock for work that must not wait behind a turn (a rewind).

        A running turn holds the lock until its result, so this checks before waiting for
        the lock as well as after getting it: a rewind is refused at once, never queued.
        """
        self.check_not_deleted()
        self.check_no_turn()
        async with self.lock:
            self.check_not_deleted()
            self.check_no_turn()
            try:
                yield
            finally:
                self.after_exclusive_use()

    async def rewind_files(self, message_id: str, *, dry_run: bool) -> FilesAnswer:
        """Asks the CLI to rewind (or preview rewinding) files. Call under the lock.

        AgentUnavailable when the process failed: then whether the files were restored is not
        known, and the caller must find out (restoring again is idempotent).
        """
        client = await self.ensure_client()
        try:
            return await client.rewind_files(message_id, dry_run=dry_run)
        except AgentError as err:
            self.process.let_go()
            raise AgentUnavailable(self.session_id, str(err)) from err

    # Turns

    async def start_turn(
        self, text: str, request_id: str = "", prelude: Prelude | None = None, prelude_key: Any = None
    ) -> Turn:
        """Accepts a prompt and returns its turn's event log at once.

        Everything after the acceptance (a rewind first, for PromptRequest.rewind; starting or
        resuming the CLI; sending the prompt; reading the turn) runs in the turn's own task, so a
        caller that hangs up, even while the CLI is still starting, loses nothing. A request_id
        seen before returns that turn (a retry re-attaches to it, or gets it replayed from the
        ledger after a restart); with other arguments it is REQUEST_ID_REUSED.
        """
        self.check_not_deleted()
        request: NewRequest | None = None
        if request_id:
            request = NewRequest(request_id, "Prompt", dumps([text, prelude_key]), self.session_id)
            known = await self._known_turn(request, text)
            if known is not None:
                return known
        self.check_not_deleted()  # again: a deletion may have begun while the ledger was read
        self.check_no_turn()
        if self._shutting_down:
            raise ShuttingDown()
        self._ctx.admit_turn(self)
        turn = Turn(self.session_id, text, request_id=request_id, prelude=prelude)
        # Claimed, and the current turn, before the first await: an Interrupt or a close that
        # comes while the request is being recorded finds it.
        self._turn_claimed = True
        self._interrupt_pending = False
        previous, self._turn = self._turn, turn
        try:
            if request is not None:
                # The prompt id is recorded with the request: after a crash it tells whether the
                # prompt reached the transcript (the turn ran) or not (it never did).
                await self._ctx.ledger.begin_request(request, {"prompt_id": turn.prompt_id})
        except RequestIdTaken as taken:
            self._turn_claimed, self._turn = False, previous
            if request is None or not taken.existing.same_call(request):
                raise RequestIdReused(request_id) from None
            raise TurnInFlight(self.session_id) from None  # a concurrent retry won the race
        except BaseException:
            self._turn_claimed, self._turn = False, previous
            raise
        if request_id:
            self._turns_by_request[request_id] = turn
            while len(self._turns_by_request) > _TURNS_REMEMBERED:
                self._turns_by_request.pop(next(iter(self._turns_by_request)))
        self._turn_task = asyncio.create_task(self._run_turn(turn), name=f"turn-{self.session_id}")
        return turn

    async def _known_turn(self, request: NewRequest, text: str) -> Turn | None:
        """The turn a request id already started, if any (in memory, or recorded)."""
        known = self._turns_by_request.get(request.request_id)
        recorded = await self._ctx.ledger.request(request.request_id)
        if recorded is None:
            return None
        if not recorded.same_call(request):
            raise RequestIdReused(request.request_id)
        if known is not None:
            return known
        if recorded.done and recorded.result is not None:
            return await Turn.replayed(self.session_id, text, request.request_id, recorded.result)
        # Accepted by a server that died before the turn ended. If its prompt reached the
        # transcript the turn ran (in part): report it, never run it twice. If not, it never ran:
        # forget the request and run it now.
        prompt_id = str((recorded.result or {}).get("prompt_id") or "")
        if prompt_id and (await self.catch_up()).get(prompt_id) is not None:
            cut_short = {
                "prompt_id": prompt_id,
                "error": {
                    "reason": AgentUnavailable.reason,
                    "message": "the server stopped while this turn ran; it will not run again",
                },
            }
            await self._ctx.ledger.finish_request(request.request_id, cut_short)
            return await Turn.replayed(self.session_id, text, request.request_id, cut_short)
        await self._ctx.ledger.forget_request(request.request_id)
        return None

    async def _run_turn(self, turn: Turn) -> None:
        error: AgentRewindError | None = None
        locked = False
        announcer: asyncio.Task[None] | None = None
        try:
            faults.point("turn.accepted")
            await self.lock.acquire()
            locked = True
            self._cancel_idle_timer()
            await self._ctx.resolve_pending(self)
            if turn.prelude is not None:
                opening = await turn.prelude()
                if opening is not None:
                    await turn.publish(opening)
            client = await self.ensure_client()
            if self.record.closed:
                await self._ctx.ledger.touch_session(self.session_id, closed=False)
                self.record = replace(self.record, closed=False)
            await self._snapshot(TURN_START, turn.prompt_id)
            await client.send_prompt(turn.text, turn.prompt_id)
            turn.sent = True
            self._newest_turn_pid = client.pid
            faults.point("turn.prompt_sent")
            if self._interrupt_pending:
                await self._send_interrupt(turn, client)
            announcer = asyncio.create_task(self._announce(turn), name=f"announce-{self.session_id}")
            async for event in client.receive_turn(turn.prompt_id):
                if isinstance(event, PromptEvent) and not event.parent_tool_use_id:
                    # The CLI's echo: the prompt is announced once it is in the transcript.
                    announcer.cancel()
                    await self._announce(turn, within=_ECHO_TO_TRANSCRIPT)
                    continue
                if isinstance(event, ResultEvent):
                    if not turn.announced:  # a command the CLI answered without an echo
                        announcer.cancel()
                        await self._announce(turn, within=_ECHO_TO_TRANSCRIPT)
                    faults.point("turn.result")
                    if turn.interrupted:
                        event = replace(event, interrupted=True)
                await turn.publish(event)
        except AgentRewindError as err:  # the CLI did not start, a pending rewind failed, ...
            error = err
        except AgentError as err:
            self.process.let_go()
            if turn.killed:
                self._log.warning("turn ended by killing its process after it ignored Interrupt")
                await turn.publish(_killed_result())
            else:
                self._log.error("turn failed", error=str(err))
                error = AgentUnavailable(self.session_id, str(err))
        except asyncio.CancelledError:
            error = AgentUnavailable(self.session_id, "the turn was cancelled by a server shutdown")
            self.process.let_go(now=True)
            raise
        except Exception:  # a bug must not leave the session locked
            self._log.exception("turn crashed")
            self.process.let_go()
            error = AgentRewindError("the turn failed unexpectedly")
        finally:
            if announcer is not None:
                announcer.cancel()
            if turn.watchdog is not None:
                turn.watchdog.cancel()
            # Whatever happens here (a cancellation by shutdown included), the turn ends, its
            # stream with it, and the lock is released.
            cancelled = False
            bookkeeping: AgentRewindError | None = None
            try:
                bookkeeping = await asyncio.shield(self._record_turn(turn, error))
            except asyncio.CancelledError:
                cancelled = True
            except Exception:  # _record_turn reports its own failures; this is a bug
                self._log.exception("recording the turn crashed")
            finally:
                self._turn_claimed = False
                if locked:
                    self.lock.release()
                ending = error or bookkeeping
                if ending is None and cancelled:
                    ending = AgentUnavailable(self.session_id, "the turn was cancelled by a server shutdown")
                await asyncio.shield(turn.finish(ending))
                if not self._shutting_down:
                    self._arm_idle_timer()
            if cancelled:
                raise asyncio.CancelledError

    async def _record_turn(self, turn: Turn, error: AgentRewindError | None) -> AgentRewindError | None:
        """The turn's bookkeeping. A failed write (disk full, database locked) is reported to the
        turn's callers but stops nothing: the lock is released and the stream ends regardless."""
        failure: AgentRewindError | None = None
        steps: list[tuple[str, Callable[[], Awaitable[Any]]]] = []
        if turn.sent:
            steps.append(("snapshot", lambda: self._snapshot(TURN_END, turn.prompt_id)))
            steps.append(("touch", self._touch))
            steps.append(("view", self.view))
        if turn.request_id and not turn.sent:
            # It never reached the CLI: nothing ran, so a retry with its request id runs it.
            self._turns_by_request.pop(turn.request_id, None)
            steps.append(("request", lambda: self._ctx.ledger.forget_request(turn.request_id)))
        elif turn.request_id:
            snapshot = _Recorded(turn, error)
            steps.append(
                ("request", lambda: self._ctx.ledger.finish_request(turn.request_id, snapshot.record()))
            )
        for name, step in steps:
            try:
                await step()
            except Exception as err:
                self._log.error("could not record the turn", step=name, error=str(err))
                failure = failure or StorageUnavailable(f"the turn ran, but it could not be recorded ({err})")
        faults.point("turn.recorded")
        return failure

    async def snapshot_bytes(self) -> int:
        """Bytes the session's workspace snapshots hold on disk (0 when it has none)."""
        snaps = self._ctx.snapshots
        if snaps is None:
            return 0
        return await snaps.disk_bytes(self.session_id)

    async def snapshot_availability(self) -> Mapping[str, bool]:
        """Per prompt id whose turn started with a snapshot: whether snapshots can serve a files
        rewind to it. The same object while nothing changed (callers may cache on it)."""
        snaps = self._ctx.snapshots
        if snaps is None or not self.record.workspace_snapshots:
            return _NO_SNAPSHOTS
        return await snaps.availability(self.session_id)

    async def _snapshot(self, kind: str, prompt_id: str) -> None:
        """Snapshots the workspace at a turn's start or end, when the session has snapshots on.
        A snapshot that fails is recorded as incomplete (or logged): it never fails the turn."""
        snaps = self._ctx.snapshots
        if snaps is None or not self.record.workspace_snapshots:
            return
        await snaps.take_and_record(self.session_id, self.record.cwd, kind, prompt_id)
        if kind == TURN_END and self._ctx.snapshot_retention:
            try:
                await snaps.retain(self.session_id, self.record.cwd, self._ctx.snapshot_retention)
            except Exception as err:  # collected next time
                self._log.error("could not collect old workspace snapshots", error=str(err))

    async def _touch(self) -> None:
        self.update_time = await self._ctx.ledger.touch_session(self.session_id)

    async def _announce(self, turn: Turn, within: float | None = None) -> None:
        """Publishes the prompt as soon as the CLI wrote it to the transcript: the rewind point
        exists, durably, from then on, usually long before the model's first answer (and the CLI's
        echo). After the echo it waits at most `within` seconds for the transcript, then
        announces anyway (the turn's events must not wait behind it)."""
        deadline = None if within is None else asyncio.get_running_loop().time() + within
        while not turn.announced:
            index = await self.catch_up()
            late = deadline is not None and asyncio.get_running_loop().time() > deadline
            if index.get(turn.prompt_id) is not None or late:
                if late:
                    self._log.warning("the cli echoed a prompt it has not written to the transcript")
                await self._announce_now(turn, PromptEvent(turn.prompt_id, turn.text))
                return
            await asyncio.sleep(_ANNOUNCE_POLL)

    async def _announce_now(self, turn: Turn, event: PromptEvent) -> None:
        if turn.announced:
            return
        turn.announced = True
        # Shielded: the announcer may be cancelled (the echo came), but never mid-publish.
        await asyncio.shield(turn.publish(event))
        faults.point("turn.prompt_recorded")

    async def interrupt(self) -> None:
        """Stops the turn in flight: asks the CLI, and kills its process if the turn has not
        ended `interrupt_timeout` seconds later. A turn still starting its CLI is stopped as soon
        as its prompt is sent."""
        turn, client = self._turn, self.process.client
        if turn is None or turn.done:
            return
        turn.interrupted = True
        if not turn.sent or client is None:
            self._interrupt_pending = True
            return
        await self._send_interrupt(turn, client)

    async def _send_interrupt(self, turn: Turn, client: AgentClient) -> None:
        turn.interrupted = True
        if turn.watchdog is None:
            turn.watchdog = asyncio.create_task(
                self._stop_if_stuck(turn), name=f"interrupt-{self.session_id}"
            )
        try:
            # A CLI that does not answer is the watchdog's to end; the caller does not wait for it.
            await asyncio.wait_for(client.interrupt(), self._ctx.interrupt_timeout)
        except TimeoutError:
            self._log.warning("the cli did not answer Interrupt")
        except AgentError as err:
            self._log.warning("interrupt failed; the turn is ended by killing its process", error=str(err))
            turn.killed = True
            await self.process.kill()

    async def _stop_if_stuck(self, turn: Turn) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(turn.wait()), self._ctx.interrupt_timeout)
        except TimeoutError:
            self._log.warning("turn ignored Interrupt", seconds=self._ctx.interrupt_timeout)
            turn.killed = True
            await self.process.kill()

    # Lifecycle

    def after_exclusive_use(self) -> None:
        """Called when a rewind or other exclusive work ends: closed sessions give their process back."""
        if self.record.closed:
            self.process.let_go()
        else:
            self._arm_idle_timer()

    async def close(self, *, force: bool = False) -> None:
        """CloseSession: ends the live process. With `force`, a running turn is ended first (as an
        Interrupt that escalates to a kill); without, a running turn is TURN_IN_FLIGHT."""
        self.check_not_deleted()
        turn = self._turn
        if self.turn_running and turn is not None:
            if not force:
                raise TurnInFlight(self.session_id)
            await self.interrupt()
            await turn.wait()
        async with self.lock:
            self.check_not_deleted()
            self._cancel_idle_timer()
            self.process.let_go()
            await self.process.settle()
            self.update_time = await self._ctx.ledger.touch_session(self.session_id, closed=True)
            self.record = replace(self.record, closed=True)

    @contextlib.asynccontextmanager
    async def retiring(self) -> AsyncIterator[None]:
        """DeleteSession's hold on the session. From the first moment nothing new is accepted (a
        prompt, a rewind, a start of the CLI: SESSION_NOT_FOUND); a running turn is ended as
        CloseSession(force) ends it (Interrupt, then a kill); a rewind in progress finishes; the
        CLI process exits. Yields holding the lock, with no process, for the erasure. Should the
        body fail before the registry marked the worker `deleted`, the session is usable again."""
        self._retiring = True
        try:
            turn = self._turn
            if self.turn_running and turn is not None:
                await self.interrupt()
                await turn.wait()
            async with self.lock:
                self._cancel_idle_timer()
                if self.deleted:
                    raise SessionNotFound(self.session_id)  # another deletion got here first
                await self._let_go_and_forget()
                yield
        finally:
            self._retiring = False
            if self.deleted:
                self.process.stopped = True  # no process of this session ever starts again

    async def hibernate(self) -> None:
        """Gives the process back (the idle timer). Skipped when the session is in use."""
        if self.lock.locked():
            return
        async with self.lock:
            if self.process.client is not None and not self.turn_running:
                self._log.info("hibernating idle session")
                await self._let_go_and_forget()

    async def _evict(self) -> bool:
        """Hibernates the session now for another's live slot: True once its process has exited,
        False when it is busy (a turn running, a rewind holding the lock)."""
        if self.lock.locked() or self.turn_running:
            return False
        async with self.lock:  # free, so taken at once
            self._cancel_idle_timer()
            await self._let_go_and_forget()
        return True

    async def _let_go_and_forget(self) -> None:
        """Ends the process and frees what a hibernated session need not hold: its transcript
        index and remembered turns come back from the disk and the ledger when next needed."""
        self.process.let_go()
        await self.process.settle()
        self._index = None
        self.page_cache = None
        self._turns_by_request.clear()
        if self._ctx.snapshots is not None:
            self._ctx.snapshots.forget(self.session_id)

    def _arm_idle_timer(self) -> None:
        self._cancel_idle_timer()
        if self._ctx.idle_timeout > 0 and not self._shutting_down:
            loop = asyncio.get_running_loop()
            self._idle_timer = loop.call_later(
                self._ctx.idle_timeout,
                lambda: self._in_background(self.hibernate(), f"hibernate-{self.session_id}"),
            )

    def _cancel_idle_timer(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    async def shutdown(self, grace: float) -> None:
        """Gives a running turn `grace` seconds and a rewind in progress its time to finish, then
        ends the CLI process whatever happens."""
        self._shutting_down = True
        self.process.stopped = True
        self._cancel_idle_timer()
        turn, task = self._turn, self._turn_task
        if turn is not None and not turn.done and task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(turn.wait()), grace)
            except TimeoutError:
                self._log.warning("turn still running at shutdown; stopping it")
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        # A rewind holds the lock while it applies: let it finish (its control requests are bounded).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace + 35):
                await self.lock.acquire()
                self.lock.release()
        await asyncio.gather(*self._background, return_exceptions=True)
        self.process.let_go()
        await self.process.settle()


@dataclass
class _Recorded:
    turn: Turn
    error: AgentRewindError | None

    def record(self) -> dict[str, Any]:
        out = self.turn.record()
        if self.error is not None and "error" not in out:
            out["error"] = error_record(self.error)
        return out


def _killed_result() -> ResultEvent:
    return ResultEvent(
        subtype="error_during_execution",
        is_error=True,
        num_turns=0,
        duration_ms=0,
        total_cost_usd=0.0,
        result="the turn did not stop when interrupted; its Claude Code process was ended",
        stop_reason="",
        interrupted=True,
    )


def _fsync(path: Path) -> None:
    """Makes the CLI's appends to a file durable (its own writes may still be in the page cache)."""
    with contextlib.suppress(FileNotFoundError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
