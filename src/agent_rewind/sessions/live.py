"""The bound on live Claude Code processes (--max-live-sessions).

A live CLI process holds about 220 MB, so a host runs only so many. A session takes a slot the
moment it starts a process and gives it back once that process has exited (not when it is let
go: until it exits it still holds its memory). When a session needs a slot and none is free, the
least recently used session that can be hibernated now (no turn running, nothing holding its
lock) gives its process back first; when every slot holds busy sessions, the call waits for one
(--live-session-wait, first come first served), then fails with LIVE_SESSIONS_EXHAUSTED instead of
exceeding the bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog

from agent_rewind.errors import LiveSessionsExhausted

log = structlog.get_logger(__name__)

# What one live CLI process is budgeted, and what the service keeps for itself. `make bench`
# measures a live process (docs/benchmarks.md, "Memory per session"; docs/operations.md quotes the
# last run): 210 to 250 MB resident here, up to 289 MB peak with newer CLIs; 320 MiB leaves room
# for that peak and a little of what the agent's tools take.
PROCESS_BUDGET_BYTES = 320 << 20
SERVICE_RESERVE_BYTES = 512 << 20

# Hibernates a session to free its slot: True once its process has exited, False when it cannot
# be hibernated now (busy).
Evict = Callable[[], Awaitable[bool]]


def memory_limit() -> int:
    """The memory this process may use: its cgroup's limit when it has one, else the machine's."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            return int(text)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_max_live(memory: int | None = None) -> int:
    """As many processes as the memory holds beside the service itself; at least one."""
    available = (memory_limit() if memory is None else memory) - SERVICE_RESERVE_BYTES
    return max(1, available // PROCESS_BUDGET_BYTES)


class LiveSlots:
    """The slots, their holders (least recently used first), and the calls waiting for one.

    No lock is held while a holder hibernates (its process settling, its points written): two
    calls that each need a slot hibernate two holders at once, each slot claimed for the call
    whose eviction frees it, so a third never takes it in between. When no holder can hibernate
    now (every slot runs a turn), a call waits its turn in one first-come, first-served queue for
    at most `wait` seconds (a holder's process exiting wakes it; a turn's end is seen within
    `_POLL`), then fails with LIVE_SESSIONS_EXHAUSTED; so does a call that finds `max_waiting`
    calls queued already, at once."""

    _POLL = 0.1  # seconds between a waiting call's looks for a holder that went idle

    def __init__(self, capacity: int, *, wait: float = 0.0, max_waiting: int = 1000) -> None:
        if capacity < 1:
            raise ValueError("at least one live process is needed")
        self.capacity = capacity
        self.wait = wait
        self.max_waiting = max_waiting
        # Session id -> how to hibernate it; least recently used first.
        self._holders: OrderedDict[str, Evict] = OrderedDict()
        # Holders being hibernated, each for a call that has claimed the slot it frees.
        self._evicting: set[str] = set()
        self._claimed = 0
        # The calls waiting for a slot, first come first: only the first looks for one.
        self._queue: deque[object] = deque()
        self._changed = asyncio.Event()

    @property
    def held(self) -> int:
        return len(self._holders)

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def used(self, session_id: str) -> None:
        """The session was just used: it is the last to be hibernated for a slot."""
        if session_id in self._holders:
            self._holders.move_to_end(session_id)

    async def acquire(
        self, session_id: str, evict: Evict, *, wait: bool = True, give_up: Callable[[], None] | None = None
    ) -> None:
        """A slot for a process `session_id` is about to start (it has none running). `wait`:
        queue for one when every slot is busy (else fail at once). `give_up` is called at each look
        while waiting: what it raises ends the wait (the session is being deleted, the server
        stops), so that nothing waits out the queue for a process that will never start."""
        if session_id in self._holders:
            self._holders.move_to_end(session_id)
            return
        if not self._queue and await self._take(session_id, evict):
            return
        if not wait or self.wait <= 0 or len(self._queue) >= self.max_waiting:
            raise LiveSessionsExhausted(self.capacity)
        ticket = object()
        self._queue.append(ticket)
        deadline = time.monotonic() + self.wait
        started = time.monotonic()
        try:
            while True:
                if give_up is not None:
                    give_up()
                if self._queue[0] is ticket and await self._take(session_id, evict):
                    log.info(
                        "live slot after a wait",
                        session_id=session_id,
                        ms=round((time.monotonic() - started) * 1000),
                    )
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise LiveSessionsExhausted(self.capacity)
                changed = self._changed
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), min(left, self._POLL))
        finally:
            self._queue.remove(ticket)
            self._signal()  # the next in line looks now

    async def _take(self, session_id: str, evict: Evict) -> bool:
        """A slot for `session_id`: a free one, else one a holder that can hibernate now gives
        back; False when every holder is busy."""
        if session_id in self._holders:
            self._holders.move_to_end(session_id)
            return True
        if len(self._holders) + self._claimed < self.capacity:
            self._holders[session_id] = evict
            return True
        for holder, evict_holder in list(self._holders.items()):
            if holder == session_id or holder in self._evicting or holder not in self._holders:
                continue
            self._evicting.add(holder)
            self._claimed += 1
            try:
                freed = await evict_holder()
            finally:
                self._evicting.discard(holder)
                self._claimed -= 1
            if freed:
                log.info("hibernated the least recently used session for a live slot", session_id=holder)
                # Its process has exited; it released the slot then (a release that has not
                # happened means the process outlives the session's let-go: free it here).
                self._holders.pop(holder, None)
                self._holders[session_id] = evict
                return True
        return False

    def release(self, session_id: str) -> None:
        """The session's process has exited."""
        if self._holders.pop(session_id, None) is not None:
            self._signal()

    def _signal(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
