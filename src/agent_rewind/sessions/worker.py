"""One worker per session: it owns the session's CLI process and serializes all work on it.

Every prompt, rewind and rebuild of the client runs under the worker's lock (API.md rule
4); different sessions have different workers and never wait on each other. A turn holds
the lock until its result; a rewind that finds a turn running is refused at once
(TURN_IN_FLIGHT) rather than queued behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import structlog

from agent_rewind import faults
from agent_rewind.errors import (
    AgentRewindError,
    AgentUnavailable,
    RequestIdReused,
    ShuttingDown,
    TurnInFlight,
)
from agent_rewind.sessions.adapter import AgentClient, AgentError, ClientSpec
from agent_rewind.sessions.events import ConversationAnswer, FilesAnswer, PromptEvent, ResultEvent
from agent_rewind.sessions.turn import Turn
from agent_rewind.store.ledger import Anchor, Ledger, SessionRecord
from agent_rewind.transcript.index import ConversationView, TranscriptIndex
from agent_rewind.transcript.paths import exists as _exists
from agent_rewind.transcript.paths import transcript_path

log = structlog.get_logger(__name__)

ClientFactory = Callable[[ClientSpec], AgentClient]

# How many recent turns a retried Prompt (same request_id) can re-attach to, per session.
_TURNS_REMEMBERED = 32

# Transcript reads larger than this run in a thread (a 5,000-turn transcript is about 35 MB).
_READ_INLINE_BYTES = 1 << 20


class State:
    IDLE = "IDLE"
    RUNNING = "RUNNING"
    HIBERNATED = "HIBERNATED"
    CLOSED = "CLOSED"


@dataclass(frozen=True)
class WorkerContext:
    """What every worker shares: the ledger, how to start a client, and the CLI's environment."""

    ledger: Ledger
    client_factory: ClientFactory
    cli_env: Mapping[str, str]
    claude_config_dir: Path
    idle_timeout: float


class SessionWorker:
    def __init__(self, record: SessionRecord, ctx: WorkerContext) -> None:
        self._ctx = ctx
        self.record = record
        self.session_id = record.session_id
        self.lock = asyncio.Lock()
        self._client: AgentClient | None = None
        self._closing: set[asyncio.Task[None]] = set()
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
        # Recent turns by the request_id that started them, oldest first.
        self._turns_by_request: dict[str, Turn] = {}
        self._shutting_down = False
        self.update_time: datetime = record.update_time
        self._log = log.bind(session_id=self.session_id)

    # State

    @property
    def state(self) -> str:
        if self.turn_running:
            return State.RUNNING
        if self.record.closed:
            return State.CLOSED
        if self._client is not None and self._client.alive:
            return State.IDLE
        return State.HIBERNATED

    @property
    def turn_running(self) -> bool:
        return self._turn_claimed

    @property
    def client_pid(self) -> int | None:
        return self._client.pid if self._client is not None else None

    # The transcript, as the service shows it

    def _transcript(self) -> TranscriptIndex:
        # Until the CLI has written the file, look again each time: the CLI shortens very long
        # project paths in its own way, which only the file's presence reveals.
        if self._index is None or (self._index.size == 0 and not _exists(self._index.path)):
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
        ledger until a new turn has written it into the transcript itself.
        """
        index = await self.catch_up()
        anchor = self._ctx.ledger.anchor(self.session_id)
        if anchor is None:
            return index.view()
        if self._cut_is_in_transcript(index, anchor):
            self._ctx.ledger.clear_anchor(self.session_id, anchor.anchor_uuid)
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

    # The client

    async def _spec(self) -> ClientSpec:
        anchor = self._ctx.ledger.anchor(self.session_id)
        if anchor is not None:
            await self.view()  # clears the anchor when the transcript already shows the cut
            anchor = self._ctx.ledger.anchor(self.session_id)
        return ClientSpec(
            session_id=self.session_id,
            cwd=Path(self.record.cwd),
            options=self.record.options,
            checkpointing=self.record.checkpointing,
            env=self._ctx.cli_env,
            resume=self.record.started,
            resume_session_at=anchor.anchor_uuid if anchor else None,
            resume_drops_turn=anchor.drops_turn if anchor else None,
            stderr=self._on_stderr,
        )

    def _on_stderr(self, line: str) -> None:
        self._log.debug("cli stderr", line=line.rstrip())

    async def ensure_client(self) -> AgentClient:
        """The live client, started (or resumed from the transcript) if needed. Call under the lock."""
        if self._client is not None and self._client.alive:
            return self._client
        if self._shutting_down:
            raise ShuttingDown()  # no new process once the server is stopping
        if self._client is not None:
            self._log.warning("cli process gone; resuming the session in a new one")
            self._drop_client()
        await self._await_closing()
        spec = await self._spec()
        started = time.perf_counter()
        client = self._ctx.client_factory(spec)
        try:
            await client.start()
        except AgentError as err:
            self._log.error("cli did not start", error=str(err))
            raise AgentUnavailable(self.session_id, str(err)) from err
        if self._shutting_down:
            # The server began to stop while this process started: it must not outlive it.
            await client.close()
            raise ShuttingDown()
        self._client = client
        if not self.record.started:
            self._ctx.ledger.touch_session(self.session_id, started=True)
            self.record = _replace(self.record, started=True)
        self._log.info(
            "cli started",
            pid=client.pid,
            resume=spec.resume,
            resume_session_at=spec.resume_session_at,
            ms=round((time.perf_counter() - started) * 1000),
        )
        return client

    def _drop_client(self) -> None:
        """Lets go of the live client; its process ends in the background."""
        client, self._client = self._client, None
        if client is None:
            return
        task = asyncio.create_task(client.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _await_closing(self) -> None:
        # Two CLI processes must never write one transcript at once.
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    async def cut_conversation(self, target: str) -> None:
        """The conversation was cut just before the prompt `target` (a rewind). Call under the lock.

        A live process still remembers the dropped turns. It is cut in place when the CLI agrees
        (milliseconds, and the next prompt finds the process ready); otherwise it is let go and a
        new one resuming at the cut starts in the background once the caller releases the lock.
        A session without a live process needs nothing: its next start resumes at the cut.
        """
        client = self._client
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
        self._drop_client()
        if not self.record.closed and not self._shutting_down:
            task = asyncio.create_task(self._prewarm(), name=f"prewarm-{self.session_id}")
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _prewarm(self) -> None:
        async with self.lock:
            if self._client is not None or self.record.closed or self._shutting_down:
                return
            try:
                await self.ensure_client()
            except AgentRewindError as err:
                # The next call tries again and reports it; nobody waits on this one.
                self._log.warning("could not start the CLI after a rewind", error=err.message)
                return
            self._arm_idle_timer()

    # Turns

    def check_no_turn(self) -> None:
        if self.turn_running:
            raise TurnInFlight(self.session_id)

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """Holds the session's lock for work that must not wait behind a turn (a rewind).

        A running turn holds the lock until its result, so this checks before waiting for
        the lock as well as after getting it: a rewind is refused at once, never queued.
        """
        self.check_no_turn()
        async with self.lock:
            self.check_no_turn()
            try:
                yield
            finally:
                self.after_exclusive_use()

    async def start_turn(self, text: str, request_id: str = "") -> Turn:
        """Accepts a prompt and returns its turn's event log at once.

        Everything after the acceptance (starting or resuming the CLI, sending the prompt,
        reading the turn) runs in the turn's own task, so a caller that hangs up, even while
        the CLI is still starting, loses nothing: the turn runs on to its end. A failure to
        start ends the log with that error. A `request_id` seen before returns that turn's log
        (a retry re-attaches and replays it from the start); with another text it is refused.
        """
        if request_id:
            known = self._turns_by_request.get(request_id)
            if known is not None:
                if known.text != text:
                    raise RequestIdReused(request_id)
                return known
        self.check_no_turn()
        if self._shutting_down:
            raise ShuttingDown()
        turn = Turn(self.session_id, text)
        self._turn_claimed = True
        self._interrupt_pending = False
        self._turn = turn
        if request_id:
            self._turns_by_request[request_id] = turn
            while len(self._turns_by_request) > _TURNS_REMEMBERED:
                self._turns_by_request.pop(next(iter(self._turns_by_request)))
        self._turn_task = asyncio.create_task(self._run_turn(turn), name=f"turn-{self.session_id}")
        return turn

    async def _run_turn(self, turn: Turn) -> None:
        error: AgentRewindError | None = None
        locked = False
        try:
            faults.point("turn.accepted")
            await self.lock.acquire()
            locked = True
            self._cancel_idle_timer()
            client = await self.ensure_client()
            if self.record.closed:
                self._ctx.ledger.touch_session(self.session_id, closed=False)
                self.record = _replace(self.record, closed=False)
            await client.send_prompt(turn.text)
            turn.sent = True
            faults.point("turn.prompt_sent")
            if self._interrupt_pending:
                turn.interrupted = True
                await client.interrupt()
            async for event in client.receive_turn():
                if isinstance(event, PromptEvent) and not event.parent_tool_use_id and not turn.prompt_id:
                    turn.prompt_id = event.message_id
                    faults.point("turn.prompt_recorded")
                if isinstance(event, ResultEvent):
                    faults.point("turn.result")
                    if turn.interrupted:
                        event = _replace(event, interrupted=True)
                await turn.publish(event)
        except AgentRewindError as err:  # the CLI did not start, or the server is stopping
            error = err
        except AgentError as err:
            self._log.error("turn failed", error=str(err))
            self._drop_client()
            error = AgentUnavailable(self.session_id, str(err))
        except asyncio.CancelledError:
            error = AgentUnavailable(self.session_id, "the turn was cancelled by a server shutdown")
            self._drop_client()
            raise
        except Exception:  # a bug must not leave the session locked
            self._log.exception("turn crashed")
            self._drop_client()
            error = AgentRewindError("the turn failed unexpectedly")
        finally:
            self._turn_claimed = False
            if turn.sent:
                self.update_time = self._ctx.ledger.touch_session(self.session_id)
                with contextlib.suppress(Exception):
                    await self.view()
                faults.point("turn.recorded")
            await turn.finish(error)
            if locked:
                self.lock.release()
            self._arm_idle_timer()

    async def interrupt(self) -> None:
        """Stops the turn in flight; one still starting its CLI is stopped as soon as it is sent."""
        turn, client = self._turn, self._client
        if turn is None or turn.done:
            return
        if not turn.sent or client is None:
            self._interrupt_pending = True
            return
        turn.interrupted = True
        try:
            await client.interrupt()
        except AgentError as err:
            raise AgentUnavailable(self.session_id, str(err)) from err

    # Files

    async def rewind_files(self, message_id: str, *, dry_run: bool) -> FilesAnswer:
        """Asks the CLI to rewind (or preview rewinding) files. Call under the lock."""
        client = await self.ensure_client()
        try:
            return await client.rewind_files(message_id, dry_run=dry_run)
        except AgentError as err:
            self._drop_client()
            raise AgentUnavailable(self.session_id, str(err)) from err

    # Lifecycle

    def after_exclusive_use(self) -> None:
        """Called when a rewind or other exclusive work ends: closed sessions give their process back."""
        if self.record.closed:
            self._drop_client()
        else:
            self._arm_idle_timer()

    async def close(self) -> None:
        """CloseSession: ends the live client. Reads and rewinds still work."""
        async with self.lock:
            self._cancel_idle_timer()
            self._drop_client()
            await self._await_closing()
            self.update_time = self._ctx.ledger.touch_session(self.session_id, closed=True)
            self.record = _replace(self.record, closed=True)

    async def hibernate(self) -> None:
        if self.lock.locked():
            return
        async with self.lock:
            if self._client is not None and not self.turn_running:
                self._log.info("hibernating idle session")
                self._drop_client()
                await self._await_closing()

    def _arm_idle_timer(self) -> None:
        self._cancel_idle_timer()
        if self._ctx.idle_timeout > 0 and not self._shutting_down:
            loop = asyncio.get_running_loop()
            self._idle_timer = loop.call_later(
                self._ctx.idle_timeout, lambda: asyncio.ensure_future(self.hibernate())
            )

    def _cancel_idle_timer(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    async def shutdown(self, grace: float) -> None:
        """Gives a running turn `grace` seconds, then ends the CLI process whatever happens."""
        self._shutting_down = True
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
        # A background start sees the flag and ends its process itself; wait for it.
        await asyncio.gather(*self._background, return_exceptions=True)
        self._drop_client()
        await self._await_closing()


def _replace(obj: Any, **changes: Any) -> Any:
    import dataclasses

    return dataclasses.replace(obj, **changes)
