"""The live Claude Code process of one session: started or resumed, let go, killed.

A session has at most one process at a time, and two processes never write one transcript at
once: a new one starts only after the one let go before it has exited. Each process holds a slot
of the live-process bound (`live.LiveSlots`) from before it starts until it has exited.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from agent_rewind import metrics, tasks
from agent_rewind.errors import AgentUnavailable, ShuttingDown
from agent_rewind.sessions.adapter import AgentClient, AgentError, ClientSpec
from agent_rewind.sessions.live import Evict, LiveSlots

ClientFactory = Callable[[ClientSpec], AgentClient]
# Readies the session's files for the process about to start; returns the spec it starts with.
Ready = Callable[[ClientSpec], Awaitable[ClientSpec]]


class AgentProcess:
    def __init__(
        self,
        session_id: str,
        factory: ClientFactory,
        log: Any,
        slots: LiveSlots | None = None,
        evict: Evict | None = None,
    ) -> None:
        self._session_id = session_id
        self._factory = factory
        self._log = log
        self._slots = slots
        self._evict = evict
        # The client whose process holds this session's slot (until it has exited).
        self._slot_holder: AgentClient | None = None
        self.client: AgentClient | None = None
        self._closing: set[asyncio.Task[None]] = set()
        # Set when the server stops: no process may start from then on.
        self.stopped = False
        self.starts = 0  # processes started, over the session's life in this server

    @property
    def alive(self) -> bool:
        return self.client is not None and self.client.alive

    @property
    def pid(self) -> int | None:
        return self.client.pid if self.client is not None else None

    async def start(
        self,
        spec: ClientSpec,
        *,
        ready: Ready | None = None,
        wait: bool = True,
        give_up: Callable[[], None] | None = None,
    ) -> AgentClient:
        """A new process for `spec`, after any process let go before it has exited. `ready`
        readies the session's files for it and may change the spec: run once the process has its
        slot, so that a start refused for want of one changes nothing. `wait`: queue for a slot
        when every one is busy; `give_up` raises to stop waiting (`LiveSlots.acquire`)."""
        if self.stopped:
            raise ShuttingDown()
        if self.client is not None:
            self._log.warning("cli process gone; resuming the session in a new one")
            self.let_go()
        await self.settle()
        slots = self._slots if self._evict is not None else None
        if slots is not None and self._evict is not None:
            # LIVE_SESSIONS_EXHAUSTED
            await slots.acquire(self._session_id, self._evict, wait=wait, give_up=give_up)
        try:
            if ready is not None:
                spec = await ready(spec)
            started = time.perf_counter()
            client = self._factory(spec)
        except BaseException:
            if slots is not None:  # no process holds it
                slots.release(self._session_id)
            raise
        self._slot_holder = client
        try:
            await client.start()
        except AgentError as err:
            self._log.error("cli did not start", error=str(err))
            metrics.CLI_START_FAILURES.inc()
            await self._ended(client)
            raise AgentUnavailable(self._session_id, str(err)) from err
        except BaseException:
            await self._ended(client)
            raise
        if self.stopped:
            # The server began to stop while this process started: it must not outlive it.
            await self._ended(client)
            raise ShuttingDown()
        self.client = client
        self.starts += 1
        metrics.CLI_STARTS.inc()
        metrics.CLI_START_SECONDS.observe(time.perf_counter() - started)
        self._log.info(
            "cli started",
            pid=client.pid,
            resume=spec.resume,
            resume_session_at=spec.resume_session_at,
            ms=round((time.perf_counter() - started) * 1000),
        )
        return client

    def used(self) -> None:
        """The session used its process: the last to be hibernated for a slot."""
        if self._slots is not None:
            self._slots.used(self._session_id)

    def let_go(self, *, now: bool = False) -> None:
        """Lets go of the process; it ends in the background (`settle` waits for it). `now`: it
        is killed, not closed: busy with a turn that was abandoned, it would not end at the end
        of its input (the SDK waits 5 s for that, then 5 more after SIGTERM)."""
        client, self.client = self.client, None
        if client is None:
            return
        task = tasks.detach(self._ended(client, now), name=f"close-cli-{self._session_id}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _ended(self, client: AgentClient, now: bool = False) -> None:
        """Closes `client` (killed if it does not exit in time; at once if `now`) and frees its
        slot once it has exited."""
        try:
            await (client.kill() if now else client.close())
        finally:
            self._free_slot(client)

    def _free_slot(self, client: AgentClient) -> None:
        if self._slot_holder is client:
            self._slot_holder = None
            if self._slots is not None:
                self._slots.release(self._session_id)

    async def kill(self) -> None:
        """Ends the process now (SIGKILL) and waits until it has."""
        client = self.client
        if client is None:
            return
        self._log.warning("killing the cli process", pid=client.pid)
        await client.kill()
        metrics.CLI_KILLS.inc()
        self._free_slot(client)
        if self.client is client:
            self.client = None

    async def settle(self) -> None:
        """Waits until every process let go has exited."""
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
