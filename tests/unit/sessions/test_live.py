"""The live-process bound: slots, least-recently-used eviction, exhaustion."""

from __future__ import annotations

import asyncio

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


class _Slow(_Session):
    """A holder whose process takes a while to exit once let go, as a real one settling does;
    `at_once` counts the hibernations in progress together."""

    at_once: list[int] = [0, 0]  # now, most

    async def evict(self) -> bool:
        _Slow.at_once[0] += 1
        _Slow.at_once[1] = max(_Slow.at_once)
        try:
            await asyncio.sleep(0.2)
        finally:
            _Slow.at_once[0] -= 1
        return await super().evict()


async def test_two_calls_hibernate_two_holders_at_once_and_each_gets_the_slot_it_freed() -> None:
    """No lock is held across a hibernation: two slow evictions overlap, and no third call takes
    a slot one of them freed."""
    _Slow.at_once[:] = [0, 0]
    slots = LiveSlots(2)
    a, b = _Slow(slots, "a"), _Slow(slots, "b")
    await a.take()
    await b.take()
    both = asyncio.gather(_Session(slots, "c").take(), _Session(slots, "d").take())
    await asyncio.sleep(0.1)
    with pytest.raises(LiveSessionsExhausted):  # both slots are claimed: none is free for e
        await slots.acquire("e", _Session(slots, "e").evict, wait=False)
    await both
    assert _Slow.at_once[1] == 2, "the two hibernations overlapped"
    assert (a.evicted, b.evicted) == (1, 1) and set(slots._holders) == {"c", "d"}


async def test_a_call_waits_for_a_slot_first_come_first_served() -> None:
    slots = LiveSlots(1, wait=5)
    a = _Session(slots, "a", busy=True)
    await a.take()
    order: list[str] = []

    async def take(name: str) -> None:
        await _Session(slots, name, busy=True).take()
        order.append(name)

    waiting = [asyncio.ensure_future(take(n)) for n in "bcd"]
    await asyncio.sleep(0.05)
    assert slots.waiting == 3 and order == []
    for holder in "abc":  # each holder's turn ends in turn: it hibernates for the next in line
        await asyncio.sleep(0.05)
        slots.release(holder)
        await asyncio.sleep(0.05)
    await asyncio.gather(*waiting)
    assert order == ["b", "c", "d"] and slots.waiting == 0


async def test_a_busy_holder_that_goes_idle_is_hibernated_for_a_waiting_call() -> None:
    """No release wakes the waiting call: its poll sees the holder can hibernate now."""
    slots = LiveSlots(1, wait=5)
    a = _Session(slots, "a", busy=True)
    await a.take()
    b = asyncio.ensure_future(_Session(slots, "b").take())
    await asyncio.sleep(0.25)
    assert not b.done()
    a.busy = False
    await asyncio.wait_for(b, 1)
    assert a.evicted == 1 and set(slots._holders) == {"b"}


async def test_a_wait_is_bounded_in_time_and_in_length_and_a_cancelled_waiter_leaves_the_queue() -> None:
    slots = LiveSlots(1, wait=0.3, max_waiting=2)
    await _Session(slots, "a", busy=True).take()
    started = asyncio.get_running_loop().time()
    first = asyncio.ensure_future(_Session(slots, "b").take())
    second = asyncio.ensure_future(_Session(slots, "c").take())
    await asyncio.sleep(0.05)
    with pytest.raises(LiveSessionsExhausted):  # the queue is full: refused at once
        await _Session(slots, "d").take()
    second.cancel()  # a caller that hung up
    await asyncio.sleep(0.05)
    assert slots.waiting == 1
    with pytest.raises(LiveSessionsExhausted):
        await first
    assert 0.25 < asyncio.get_running_loop().time() - started < 1.0
    assert slots.waiting == 0 and set(slots._holders) == {"a"}


async def test_a_call_that_may_not_wait_is_refused_at_once_and_behind_a_queue_none_barges() -> None:
    slots = LiveSlots(1, wait=5)
    a = _Session(slots, "a", busy=True)
    await a.take()
    with pytest.raises(LiveSessionsExhausted):
        await slots.acquire("b", _Session(slots, "b").evict, wait=False)
    waiting = asyncio.ensure_future(_Session(slots, "c").take())
    await asyncio.sleep(0.05)
    slots.release("a")  # free: but c came first
    late = asyncio.ensure_future(_Session(slots, "d", busy=True).take())
    await asyncio.wait_for(waiting, 1)
    assert set(slots._holders) == {"c"} and not late.done()
    late.cancel()


async def test_what_give_up_raises_ends_a_wait_and_leaves_the_queue() -> None:
    slots = LiveSlots(1, wait=30)
    await _Session(slots, "a", busy=True).take()
    gone = False

    def give_up() -> None:
        if gone:
            raise LookupError("deleted")

    waiting = asyncio.ensure_future(slots.acquire("b", _Session(slots, "b").evict, give_up=give_up))
    await asyncio.sleep(0.15)
    assert not waiting.done() and slots.waiting == 1
    gone = True
    with pytest.raises(LookupError):
        await asyncio.wait_for(waiting, 1)
    assert slots.waiting == 0 and set(slots._holders) == {"a"}
