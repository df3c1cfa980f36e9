"""The live-process bound: slots, least-recently-used eviction, exhaustion."""

from __future__ import annotations

import pytest

from agent_rewind.errors import LiveSessionsExhausted
from agent_rewind.sessions.live import (
    PROCESS_BUDGET_BYTES,
    SERVICE_RESERVE_BYTES,
    LiveSlots,
    default_max_live,
)


class _Session:
    """A holder whose eviction (its process exiting) releases its slot, unless it is busy."""

    def __init__(self, slots: LiveSlots, name: str, busy: bool = False) -> None:
        self.slots, self.name, self.busy, self.evicted = slots, name, busy, 0

    async def evict(self) -> bool:
        if self.busy:
            return False
        self.evicted += 1
        self.slots.release(self.name)
        return True

    async def take(self) -> None:
        await self.slots.acquire(self.name, self.evict)


async def test_the_least_recently_used_idle_session_gives_its_slot() -> None:
    slots = LiveSlots(2)
    a, b, c = (_Session(slots, n) for n in "abc")
    await a.take()
    await b.take()
    slots.used("a")  # b is now the least recently used
    await c.take()
    assert (a.evicted, b.evicted, slots.held) == (0, 1, 2)


async def test_busy_sessions_are_skipped_and_all_busy_is_exhausted() -> None:
    slots = LiveSlots(2)
    a, b = _Session(slots, "a", busy=True), _Session(slots, "b")
    await a.take()
    await b.take()
    await _Session(slots, "c", busy=True).take()
    assert (a.evicted, b.evicted) == (0, 1)
    with pytest.raises(LiveSessionsExhausted) as err:
        await _Session(slots, "d").take()
    assert err.value.metadata == {"max_live_sessions": "2"}
    assert slots.held == 2, "a refused call takes nothing"


async def test_a_holder_asking_again_keeps_its_slot_and_a_release_frees_it() -> None:
    slots = LiveSlots(1)
    a = _Session(slots, "a")
    await a.take()
    await a.take()
    assert (slots.held, a.evicted) == (1, 0)
    slots.release("a")
    slots.release("a")  # twice is harmless
    await _Session(slots, "b").take()
    assert slots.held == 1 and a.evicted == 0


def test_the_default_bound_is_what_the_memory_holds_beside_the_service() -> None:
    assert default_max_live(SERVICE_RESERVE_BYTES + 10 * PROCESS_BUDGET_BYTES) == 10
    assert default_max_live(4 << 30) == 11  # a 4 GiB pod: (4096 - 512) MiB / 320 MiB
    assert default_max_live(256 << 20) == 1, "never less than one"
    with pytest.raises(ValueError):
        LiveSlots(0)
