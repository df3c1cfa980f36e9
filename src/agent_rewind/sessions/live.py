"""The bound on live Claude Code processes (--max-live-sessions).

A live CLI process holds about 220 MB, so a host runs only so many. A session takes a slot the
moment it starts a process and gives it back once that process has exited (not when it is let
go: until it exits it still holds its memory). When a session needs a slot and none is free, the
least recently used session that can be hibernated now (no turn running, nothing holding its
lock) gives its process back first; when every slot holds busy sessions, the call fails with
LIVE_SESSIONS_EXHAUSTED instead of exceeding the bound.
"""

from __future__ import annotations

import asyncio
import os
from collections import OrderedDict
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
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("at least one live process is needed")
        self.capacity = capacity
        # Session id -> how to hibernate it; least recently used first.
        self._holders: OrderedDict[str, Evict] = OrderedDict()
        self._lock = asyncio.Lock()

    @property
    def held(self) -> int:
        return len(self._holders)

    def used(self, session_id: str) -> None:
        """The session was just used: it is the last to be hibernated for a slot."""
        if session_id in self._holders:
            self._holders.move_to_end(session_id)

    async def acquire(self, session_id: str, evict: Evict) -> None:
        """A slot for a process `session_id` is about to start (it has none running)."""
        async with self._lock:
            if session_id in self._holders:
                self._holders.move_to_end(session_id)
                return
            while len(self._holders) >= self.capacity:
                if not await self._evict_one(session_id):
                    raise LiveSessionsExhausted(self.capacity)
            self._holders[session_id] = evict

    async def _evict_one(self, needed_by: str) -> bool:
        for holder, evict in list(self._holders.items()):
            if holder == needed_by:
                continue
            if await evict():
                log.info("hibernated the least recently used session for a live slot", session_id=holder)
                # Its process has exited; it released the slot then (a release that has not
                # happened means the process outlives the session's let-go: free it here).
                self._holders.pop(holder, None)
                return True
        return False

    def release(self, session_id: str) -> None:
        """The session's process has exited."""
        self._holders.pop(session_id, None)
