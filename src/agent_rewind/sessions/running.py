"""A session's turns as they run: accepted, run in their own task under the lock, recorded,
announced, interrupted, and killed when they ignore Interrupt.

A turn holds the session (`Status.claimed`) from its acceptance and its lock from the moment its
task starts until its result: starting or resuming the CLI, a prompt's rewind (its prelude), the
prompt, the turn's events. A caller that hangs up loses nothing; every path ends the turn and
releases the lock, a failed ledger write and a cancellation included.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from agent_rewind import faults, retries, tasks, tracing
from agent_rewind.errors import (
    AgentRewindError,
    AgentUnavailable,
    RequestIdReused,
    ShuttingDown,
    StorageUnavailable,
    TurnInFlight,
)
from agent_rewind.sessions.adapter import AgentClient, AgentError
from agent_rewind.sessions.conversation import TranscriptView
from agent_rewind.sessions.points import SessionPoints
from agent_rewind.sessions.state import SessionState
from agent_rewind.sessions.turn_events import PromptEvent, ResultEvent
from agent_rewind.sessions.turns import Prelude, Turn, error_record
from agent_rewind.snapshots.taking import TURN_END, TURN_START, Snapshots
from agent_rewind.store.ledger import Ledger, NewRequest, RequestIdTaken, dumps

# How many recent turns a retried Prompt (same request_id) re-attaches to in memory, per session;
# older ones are replayed from the ledger.
_TURNS_REMEMBERED = 32
# How often a turn looks for its prompt in the transcript, to announce the rewind point early.
_ANNOUNCE_POLL = 0.001
# After the CLI's echo, how long the prompt event may wait for the transcript to show the prompt.
_ECHO_TO_TRANSCRIPT = 5.0
_CANCELLED = "the turn was cancelled by a server shutdown"


async def _nothing_to_admit() -> None:
    return None


@dataclass(frozen=True)
class Settings:
    """What the server sets for every session's turns."""

    ledger: Ledger
    snapshots: Snapshots | None
    # What only older points need may be deleted: a retention pass, in the background
    # (storage/retention.py).
    retain: Callable[[], None]
    # Seconds a turn may ignore Interrupt before its process is killed.
    interrupt_timeout: float
    # Finishes the session's pending rewind intents (under the lock, before the turn runs).
    resolve_pending: Callable[[], Awaitable[None]]
    # Raises (QuotaExceeded) when the session's principal may not start another turn now.
    admit_turn: Callable[[], None]
    # Raises (QUOTA_EXCEEDED) when the session, or its principal's sessions, hold their storage
    # limit or more (storage/usage.py); and what the session holds may have changed.
    admit_storage: Callable[[], Awaitable[None]] = _nothing_to_admit
    storage_changed: Callable[[], None] = lambda: None


class Process(Protocol):
    """What turns ask of the session's process over time (`lifecycle.Lifecycle` is it)."""

    async def ensure_client(self) -> AgentClient: ...

    def cancel_idle_timer(self) -> None: ...

    def arm_idle_timer(self) -> None: ...


class TurnRunner:
    def __init__(
        self,
        state: SessionState,
        view: TranscriptView,
        points: SessionPoints,
        process: Process,
        settings: Settings,
    ) -> None:
        self._state = state
        self._view = view
        self._points = points
        self._process = process
        self._ctx = settings
        self._log = state.log
        # The last turn accepted (running or ended), and the task that runs it.
        self._turn: Turn | None = None
        self._task: asyncio.Task[None] | None = None
        self._by_request: dict[str, Turn] = {}
        # The pid of the process the newest prompt was sent to.
        self.newest_pid: int | None = None

    def forget(self) -> None:
        """Forgets the turns remembered for retries (the ledger still has them)."""
        self._by_request.clear()

    async def start(self, text: str, request_id: str, prelude: Prelude | None, prelude_key: Any) -> Turn:
        """Accepts a prompt and returns its turn (see `worker.SessionWorker.start_turn`)."""
        w = self._state
        w.check_not_deleted()
        request: NewRequest | None = None
        if request_id:
            request = NewRequest(request_id, "Prompt", dumps([text, prelude_key]), w.session_id)
            known = await self._known_turn(request, text)
            if known is not None:
                return known
        # Before anything is claimed: a session at its storage limit starts no turn (a retry of
        # a turn it ran, above, is still answered).
        await self._ctx.admit_storage()
        w.check_not_deleted()  # again: a deletion may have begun while the ledger was read
        w.check_no_turn()
        if w.status.stopping:
            raise ShuttingDown()
        self._ctx.admit_turn()
        turn = Turn(w.session_id, text, request_id=request_id, prelude=prelude)
        # Claimed, and the current turn, before the first await: an Interrupt or a close that
        # comes while the request is being recorded finds it.
        w.status.claim(turn)
        previous, self._turn = self._turn, turn
        try:
            if request is not None:
                # The prompt id is recorded with the request: after a crash it tells whether the
                # prompt reached the transcript (the turn ran) or not (it never did).
                await self._ctx.ledger.begin_request(request, {"prompt_id": turn.prompt_id})
        except RequestIdTaken as taken:
            w.status.release()
            self._turn = previous
            if request is None:
                raise RequestIdReused(request_id) from None
            retries.check(taken.existing, request)
            raise TurnInFlight(w.session_id) from None  # a concurrent retry won the race
        except BaseException:
            w.status.release()
            self._turn = previous
            raise
        if request_id:
            self._by_request[request_id] = turn
            while len(self._by_request) > _TURNS_REMEMBERED:
                self._by_request.pop(next(iter(self._by_request)))
        self._task = tasks.detach(self._traced(turn), name=f"turn-{w.session_id}")
        return turn

    async def _traced(self, turn: Turn) -> None:
        """The turn, in a span of its own (a child of the Prompt that accepted it)."""
        with tracing.span("turn", session_id=turn.session_id, prompt_id=turn.prompt_id) as span:
            try:
                await self._run(turn)
            finally:
                span.set(sent=turn.sent, interrupted=turn.interrupted, killed=turn.killed)
                if turn.error is not None:
                    span.error(turn.error.reason)

    async def _known_turn(self, request: NewRequest, text: str) -> Turn | None:
        """The turn a request id already started, if any (in memory, or recorded)."""
        sid = self._state.session_id
        known = self._by_request.get(request.request_id)
        recorded = await retries.recorded(self._ctx.ledger, request)
        if recorded is None:
            return None
        if known is not None:
            return known
        if recorded.done and recorded.result is not None:
            return await Turn.replayed(sid, text, request.request_id, recorded.result)
        # Accepted by a server that died before the turn ended. If its prompt reached the
        # transcript the turn ran (in part): report it, never run it twice. If not, it never ran:
        # forget the request and run it now.
        prompt_id = str((recorded.result or {}).get("prompt_id") or "")
        if prompt_id and (await self._view.catch_up()).get(prompt_id) is not None:
            cut_short = {
                "prompt_id": prompt_id,
                "error": {
                    "reason": AgentUnavailable.reason,
                    "message": "the server stopped while this turn ran; it will not run again",
                },
            }
            await self._ctx.ledger.finish_request(request.request_id, cut_short)
            return await Turn.replayed(sid, text, request.request_id, cut_short)
        await self._ctx.ledger.forget_request(request.request_id)
        return None

    async def _run(self, turn: Turn) -> None:
        w = self._state
        error: AgentRewindError | None = None
        locked = False
        announcer: asyncio.Task[None] | None = None
        try:
            faults.point("turn.accepted")
            await w.lock.acquire()
            locked = True
            self._process.cancel_idle_timer()
            await self._ctx.resolve_pending()
            if turn.prelude is not None:
                opening = await turn.prelude()
                if opening is not None:
                    await turn.publish(opening)
            client = await self._process.ensure_client()
            if w.record.closed:
                await self._ctx.ledger.touch_session(w.session_id, closed=False)
                w.record = replace(w.record, closed=False)
            await self._snapshot(TURN_START, turn.prompt_id)
            await client.send_prompt(turn.text, turn.prompt_id)
            turn.sent = True
            self.newest_pid = client.pid
            faults.point("turn.prompt_sent")
            if turn.interrupted:  # asked for while the prompt was on its way
                await self._send_interrupt(turn, client)
            announcer = asyncio.create_task(self._announce(turn), name=f"announce-{w.session_id}")
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
            w.process.let_go()
            if turn.killed:
                self._log.warning("turn ended by killing its process after it ignored Interrupt")
                await turn.publish(_killed_result())
            else:
                self._log.error("turn failed", error=str(err))
                error = AgentUnavailable(w.session_id, str(err))
        except asyncio.CancelledError:
            error = AgentUnavailable(w.session_id, _CANCELLED)
            w.process.let_go(now=True)
            raise
        except Exception:  # a bug must not leave the session locked
            self._log.exception("turn crashed")
            w.process.let_go()
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
                bookkeeping = await tasks.shielded(
                    self._record(turn, error), name=f"record-turn-{w.session_id}"
                )
            except asyncio.CancelledError:
                cancelled = True
            except Exception:  # _record reports its own failures; this is a bug
                self._log.exception("recording the turn crashed")
            finally:
                w.status.release()
                if locked:
                    w.lock.release()
                ending = error or bookkeeping
                if ending is None and cancelled:
                    ending = AgentUnavailable(w.session_id, _CANCELLED)
                await tasks.shielded(turn.finish(ending), name=f"end-turn-{w.session_id}")
                if not w.status.stopping:
                    self._process.arm_idle_timer()
            if cancelled:
                raise asyncio.CancelledError

    async def _record(self, turn: Turn, error: AgentRewindError | None) -> AgentRewindError | None:
        """The turn's bookkeeping. A failed write (disk full, database locked) is reported to the
        turn's callers but stops nothing: the lock is released and the stream ends regardless."""
        failure: AgentRewindError | None = None
        steps: list[tuple[str, Callable[[], Awaitable[Any]]]] = []
        if turn.sent:
            steps.append(("snapshot", lambda: self._snapshot(TURN_END, turn.prompt_id)))
            # The session's update_time and its points index, in one transaction.
            steps.append(("points", lambda: self._points.record(touch=True)))
        if turn.request_id and not turn.sent:
            # It never reached the CLI: nothing ran, so a retry with its request id runs it.
            self._by_request.pop(turn.request_id, None)
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
        if turn.sent:
            # Measured again once its end is recorded (its end snapshot is history too), in
            # threads of its own, before the session takes another turn.
            self._ctx.storage_changed()
            self._ctx.retain()
        faults.point("turn.recorded")
        return failure

    async def _snapshot(self, kind: str, prompt_id: str) -> None:
        """Snapshots the workspace at a turn's start or end, when the session has snapshots on.
        A snapshot that fails is recorded as incomplete (or logged): it never fails the turn."""
        w = self._state
        snaps = self._ctx.snapshots
        if snaps is None or not w.record.workspace_snapshots:
            return
        await snaps.take_and_record(w.session_id, w.record.cwd, kind, prompt_id)

    async def _announce(self, turn: Turn, within: float | None = None) -> None:
        """Publishes the prompt as soon as the CLI wrote it to the transcript: the rewind point
        exists, durably, from then on, usually long before the model's first answer (and the CLI's
        echo). After the echo it waits at most `within` seconds for the transcript, then
        announces anyway (the turn's events must not wait behind it)."""
        deadline = None if within is None else asyncio.get_running_loop().time() + within
        while not turn.announced:
            index = await self._view.catch_up()
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
        await tasks.shielded(turn.publish(event), name=f"publish-prompt-{turn.session_id}")
        faults.point("turn.prompt_recorded")

    # Interrupts

    async def interrupt(self) -> None:
        """Stops the turn in flight (see `worker.SessionWorker.interrupt`)."""
        turn, client = self._turn, self._state.process.client
        if turn is None or turn.done:
            return
        turn.interrupted = True
        if not turn.sent or client is None:
            return  # sent as soon as the prompt is (`_run`)
        await self._send_interrupt(turn, client)

    async def _send_interrupt(self, turn: Turn, client: AgentClient) -> None:
        turn.interrupted = True
        if turn.watchdog is None:
            turn.watchdog = tasks.detach(
                self._stop_if_stuck(turn), name=f"interrupt-{self._state.session_id}"
            )
        try:
            # A CLI that does not answer is the watchdog's to end; the caller does not wait for it.
            await asyncio.wait_for(client.interrupt(), self._ctx.interrupt_timeout)
        except TimeoutError:
            self._log.warning("the cli did not answer Interrupt")
        except AgentError as err:
            self._log.warning("interrupt failed; the turn is ended by killing its process", error=str(err))
            turn.killed = True
            await self._state.process.kill()

    async def _stop_if_stuck(self, turn: Turn) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(turn.wait()), self._ctx.interrupt_timeout)
        except TimeoutError:
            self._log.warning("turn ignored Interrupt", seconds=self._ctx.interrupt_timeout)
            turn.killed = True
            await self._state.process.kill()

    async def end(self, grace: float) -> None:
        """At shutdown: gives a running turn `grace` seconds to end, then cancels it."""
        turn, task = self._turn, self._task
        if turn is None or turn.done or task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(turn.wait()), grace)
        except TimeoutError:
            self._log.warning("turn still running at shutdown; stopping it")
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


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
