"""A session's process over its life: started on demand, prewarmed after a cut, hibernated when
idle or for another session's live slot, closed, retired by DeleteSession, stopped at shutdown.

The process itself is `process.AgentProcess`'s; this decides when it starts and when it is let
go, and what a hibernated session frees with it (its transcript index, its remembered turns).
What starts or lets go of the process runs under the worker's lock; only a shutdown ends it
without, once a rewind in progress has had its time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agent_rewind import tasks
from agent_rewind.errors import (
    AgentRewindError,
    AgentUnavailable,
    SessionNotFound,
    ShuttingDown,
    TurnInFlight,
)
from agent_rewind.sessions.adapter import AgentClient, AgentError, ClientSpec, pin_leaf
from agent_rewind.sessions.conversation import TranscriptView
from agent_rewind.sessions.points import SessionPoints
from agent_rewind.sessions.state import SessionState
from agent_rewind.sessions.turn_events import ConversationAnswer, FilesAnswer
from agent_rewind.snapshots.taking import Snapshots
from agent_rewind.store.ledger import Ledger
from agent_rewind.transcript import compaction


@dataclass(frozen=True)
class Settings:
    """What the server sets for every session's process."""

    ledger: Ledger
    cli_env: Mapping[str, str]
    project_settings: bool
    idle_timeout: float
    snapshots: Snapshots | None


@dataclass(frozen=True)
class Others:
    """The calls the lifecycle makes of the session's other parts."""

    interrupt: Callable[[], Awaitable[None]]  # the running turn asked to stop (then killed)
    end_turns: Callable[[float], Awaitable[None]]  # a running turn given its grace at shutdown
    forget: Callable[[], None]  # what a hibernated session need not hold, freed


class Lifecycle:
    def __init__(
        self,
        state: SessionState,
        view: TranscriptView,
        points: SessionPoints,
        settings: Settings,
        others: Others,
    ) -> None:
        self._state = state
        self._view = view
        self._points = points
        self._ctx = settings
        self._others = others
        self._log = state.log
        self._idle_timer: asyncio.TimerHandle | None = None
        # This session's detached work (a prewarm, an idle hibernation): awaited at its shutdown.
        self.background: set[asyncio.Task[None]] = set()

    # Starting the process

    async def _spec(self) -> ClientSpec:
        """How to start the CLI now: resumed at the leaf the service shows, or fresh."""
        w = self._state
        view = await self._view.view()
        leaf = view.leaf
        return ClientSpec(
            session_id=w.session_id,
            cwd=Path(w.record.cwd),
            options=w.record.options,
            checkpointing=w.record.checkpointing,
            env=self._ctx.cli_env,
            # A session never prompted has no conversation to resume: it starts fresh, under its id.
            resume=leaf is not None,
            resume_session_at=leaf,
            stderr=self._on_stderr,
            project_settings=self._ctx.project_settings,
        )

    def _on_stderr(self, line: str) -> None:
        self._log.debug("cli stderr", line=line.rstrip())

    async def ensure_client(self, *, wait: bool = True) -> AgentClient:
        """The live client, started (or resumed) if needed. Call under the lock. `wait`: queue
        for a live slot when every one is busy, rather than fail at once."""
        w = self._state
        w.check_not_deleted()
        client = w.process.client
        if client is not None and client.alive:
            w.process.used()
            return client
        if w.status.stopping:
            raise ShuttingDown()

        async def ready(spec: ClientSpec) -> ClientSpec:
            """Run once the process has its slot (and no process of the session writes its
            transcript): a start refused for want of a slot writes nothing."""
            if not (spec.resume and spec.resume_session_at):
                return spec
            # A leaf before the CLI's newest compaction is resumed through a copy of its
            # conversation (transcript/compaction.py), written now, before the CLI reads.
            at = await self._view.resume_point(spec.resume_session_at)
            await asyncio.to_thread(pin_leaf, self._view.index().path, w.session_id, at)
            return replace(spec, resume_session_at=at)

        def give_up() -> None:
            """Ends a wait for a slot once no process of the session may start: it is being
            deleted (SESSION_NOT_FOUND), or the server stops."""
            w.check_not_deleted()
            if w.status.stopping:
                raise ShuttingDown()

        client = await w.process.start(await self._spec(), ready=ready, wait=wait, give_up=give_up)
        if not w.record.started:
            await self._ctx.ledger.touch_session(w.session_id, started=True)
            w.record = replace(w.record, started=True)
        return client

    async def rewind_files(self, message_id: str, *, dry_run: bool) -> FilesAnswer:
        """Asks the CLI to rewind (or preview rewinding) files. Call under the lock."""
        client = await self.ensure_client()
        try:
            return await client.rewind_files(message_id, dry_run=dry_run)
        except AgentError as err:
            self._state.process.let_go()
            raise AgentUnavailable(self._state.session_id, str(err)) from err

    async def cut_conversation(self, target: str) -> None:
        """Cuts the live process's conversation before `target` in place, or lets it go and
        prewarms a new one resuming at the cut (see `worker.SessionWorker.cut_conversation`)."""
        w = self._state
        client = w.process.client
        if client is None or not client.alive:
            return
        # The CLI knows its own entries: a copy's uuid, not the id a client sees; and it no longer
        # holds a prompt from before its newest compaction (it refuses; a new process resumes).
        view = self._view.index().view()
        newest = view.points
        cut = view.find(target)
        newest_entry = view.find(newest[-1].message_id) if newest else None
        if cut is not None and not compaction.resumable(await self._view.catch_up(), cut.parent_uuid):
            self._log.info("cut to before a compaction: resuming a new process", target=target)
            self.replace_process()
            return
        try:
            answer = await client.rewind_conversation(
                cut.uuid if cut is not None else target,
                newest_entry.uuid if newest_entry is not None else target,
            )
        except AgentError as err:
            answer = ConversationAnswer(False, "error", str(err))
        if answer.rewound:
            self._log.info("conversation cut in the live process", target=target)
            return
        self._log.info("cli refused the cut in place; resuming a new process", reason=answer.reason)
        self.replace_process()

    def replace_process(self) -> None:
        """Lets the live process go; a new one starts in the background once the lock is free."""
        w = self._state
        w.process.let_go()
        if not w.record.closed and not w.status.stopping:
            self._in_background(self._prewarm(), f"prewarm-{w.session_id}")

    def _in_background(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = tasks.detach(work, name=name)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def _prewarm(self) -> None:
        w = self._state
        async with w.lock:
            if w.process.client is not None or w.record.closed or w.status.stopping or w.gone:
                return
            try:
                await self.ensure_client()
            except AgentRewindError as err:
                # The next call tries again and reports it; nobody waits on this one.
                self._log.warning("could not start the CLI after a rewind", error=err.message)
                return
            self.arm_idle_timer()

    # Giving the process back

    def after_exclusive_use(self) -> None:
        """Called when a rewind or other exclusive work ends: closed sessions give their process back."""
        if self._state.record.closed:
            self._state.process.let_go()
        else:
            self.arm_idle_timer()

    async def close(self, *, force: bool) -> None:
        """CloseSession (see `worker.SessionWorker.close`)."""
        w = self._state
        w.check_not_deleted()
        turn = w.status.claimed
        if turn is not None:
            if not force:
                raise TurnInFlight(w.session_id)
            await self._others.interrupt()
            await turn.wait()
        async with w.lock:
            w.check_not_deleted()
            self.cancel_idle_timer()
            w.process.let_go()
            await w.process.settle()
            w.update_time = await self._ctx.ledger.touch_session(w.session_id, closed=True)
            w.record = replace(w.record, closed=True)
            await self._points.current_quietly()

    @contextlib.asynccontextmanager
    async def retiring(self) -> AsyncIterator[None]:
        """DeleteSession's hold on the session (see `worker.SessionWorker.retiring`)."""
        w = self._state
        w.status.retire()
        try:
            turn = w.status.claimed
            if turn is not None:
                await self._others.interrupt()
                await turn.wait()
            async with w.lock:
                self.cancel_idle_timer()
                if w.deleted:
                    raise SessionNotFound(w.session_id)  # another deletion got here first
                await self._let_go_and_forget()
                yield
        finally:
            w.status.retired()

    async def hibernate(self) -> None:
        """Gives the process back (the idle timer). Skipped when the session is in use."""
        w = self._state
        if w.lock.locked():
            return
        async with w.lock:
            if w.process.client is not None and not w.turn_running:
                self._log.info("hibernating idle session")
                await self._let_go_and_forget()

    async def evict(self) -> bool:
        """Hibernates the session now for another's live slot: True once its process has exited,
        False when it is busy (a turn running, a rewind holding the lock)."""
        w = self._state
        if w.lock.locked() or w.turn_running:
            return False
        async with w.lock:  # free, so taken at once
            self.cancel_idle_timer()
            await self._let_go_and_forget()
        return True

    async def _let_go_and_forget(self) -> None:
        """Ends the process and frees what a hibernated session need not hold: its transcript
        index and remembered turns come back from the disk and the ledger when next needed."""
        w = self._state
        w.process.let_go()
        await w.process.settle()
        await self._points.current_quietly()  # what the process wrote at exit; it holds nothing now
        self._others.forget()
        if self._ctx.snapshots is not None:
            self._ctx.snapshots.forget(w.session_id)

    def arm_idle_timer(self) -> None:
        self.cancel_idle_timer()
        if self._ctx.idle_timeout > 0 and not self._state.status.stopping:
            loop = asyncio.get_running_loop()
            self._idle_timer = loop.call_later(
                self._ctx.idle_timeout,
                lambda: self._in_background(self.hibernate(), f"hibernate-{self._state.session_id}"),
            )

    def cancel_idle_timer(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    async def shutdown(self, grace: float) -> None:
        """Gives a running turn `grace` seconds and a rewind in progress its time to finish, then
        ends the CLI process whatever happens."""
        w = self._state
        w.status.stop()
        self.cancel_idle_timer()
        await self._others.end_turns(grace)
        # A rewind holds the lock while it applies: let it finish (its control requests are bounded).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace + 35):
                await w.lock.acquire()
                w.lock.release()
        await asyncio.gather(*self.background, return_exceptions=True)
        w.process.let_go()
        await w.process.settle()
