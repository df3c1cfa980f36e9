"""When a session's process is let go (sessions/lifecycle.py, over sessions/process.py):
CloseSession, with and without force; DeleteSession's hold (`retiring`); hibernation on the idle
timer or for another session's live slot, never while the session is in use; and a server's
shutdown, which gives a turn its grace and a rewind its time, then ends the process.

The harness (a fake client, a ledger that fails on demand) is in harness.py and conftest.py.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from agent_rewind.errors import (
    AgentUnavailable,
    LiveSessionsExhausted,
    SessionNotFound,
    ShuttingDown,
    StorageUnavailable,
    TurnInFlight,
)
from agent_rewind.sessions.live import LiveSlots
from agent_rewind.sessions.turn_events import ResultEvent
from agent_rewind.sessions.worker import SessionWorker, State
from tests.unit.sessions.harness import SOON, FlakyLedger, MakeWorker, collect, sent, setup, within

# Close


async def test_close_sets_closed_and_closes_the_client(make_worker: MakeWorker, ledger: FlakyLedger) -> None:
    worker, factory = await make_worker()
    await collect(await within(worker.start_turn("hi")))
    client = factory.last

    await within(worker.close())
    assert worker.state == State.CLOSED
    assert client.closed
    record = await ledger.session(worker.session_id)
    assert record is not None and record.closed


async def test_a_prompt_reopens_a_closed_session(make_worker: MakeWorker, ledger: FlakyLedger) -> None:
    worker, factory = await make_worker()
    await collect(await within(worker.start_turn("one")))
    await within(worker.close())
    events = await collect(await within(worker.start_turn("two")))
    assert isinstance(events[-1], ResultEvent)
    assert worker.state == State.IDLE
    record = await ledger.session(worker.session_id)
    assert record is not None and not record.closed
    assert factory.specs[-1].resume and factory.last.prompts == ["two"]


async def test_close_without_force_while_a_turn_runs_is_turn_in_flight(make_worker: MakeWorker) -> None:
    gate = asyncio.Event()
    worker, factory = await make_worker(factory=setup(turn_gate=gate))
    turn = await sent(worker.start_turn("long job"))
    with pytest.raises(TurnInFlight):
        await within(worker.close())
    assert not turn.done and not factory.last.closed and factory.last.interrupts == 0
    gate.set()
    events = await collect(turn)
    assert isinstance(events[-1], ResultEvent) and not events[-1].interrupted
    assert worker.state == State.IDLE


async def test_close_with_force_ends_a_running_turn(make_worker: MakeWorker, ledger: FlakyLedger) -> None:
    never = asyncio.Event()
    worker, factory = await make_worker(factory=setup(turn_gate=never))
    turn = await sent(worker.start_turn("long job"))
    await within(worker.close(force=True))
    assert turn.done
    events = await collect(turn)
    assert isinstance(events[-1], ResultEvent) and events[-1].interrupted
    assert worker.state == State.CLOSED
    assert factory.last.closed and not worker.lock.locked()
    record = await ledger.session(worker.session_id)
    assert record is not None and record.closed


async def test_close_with_force_kills_a_turn_that_ignores_interrupt(make_worker: MakeWorker) -> None:
    never = asyncio.Event()
    worker, factory = await make_worker(
        factory=setup(turn_gate=never, ignore_interrupt=True), interrupt_timeout=0.05
    )
    turn = await sent(worker.start_turn("stuck"))
    await within(worker.close(force=True))
    events = await collect(turn)
    assert isinstance(events[-1], ResultEvent) and events[-1].interrupted
    assert factory.last.killed
    assert worker.state == State.CLOSED


# DeleteSession's hold on a worker (`retiring`)


async def test_retiring_ends_a_running_turn_and_the_process_and_refuses_new_work(
    make_worker: MakeWorker,
) -> None:
    never = asyncio.Event()
    worker, factory = await make_worker(factory=setup(turn_gate=never))
    turn = await sent(worker.start_turn("long job"))
    async with asyncio.timeout(SOON), worker.retiring():
        assert turn.done and worker.lock.locked()
        assert factory.last.closed and not worker.process.alive
        with pytest.raises(SessionNotFound):
            await worker.start_turn("another")
        worker.deleted = True  # the registry's commit
    events = await collect(turn)
    assert isinstance(events[-1], ResultEvent) and events[-1].interrupted
    assert worker.gone and worker.process.stopped and not worker.lock.locked()
    for refused in (worker.start_turn("after"), worker.close(), worker.ensure_client()):
        with pytest.raises(SessionNotFound):
            await refused
    with pytest.raises(SessionNotFound):
        async with worker.exclusive():
            pass
    assert len(factory.clients) == 1, "no process was started for a deleted session"


async def test_a_prompt_accepted_before_the_deletion_never_starts_a_process(make_worker: MakeWorker) -> None:
    worker, factory = await make_worker()
    async with worker.lock:  # a rewind in progress: the prompt waits for the lock
        turn = await within(worker.start_turn("queued"))
        retiring = asyncio.create_task(_retire(worker))
        await asyncio.sleep(0.05)
        assert not retiring.done(), "the deletion waits for the rewind, then for the turn"
    await within(retiring)
    with pytest.raises(SessionNotFound):
        await collect(turn)
    assert factory.clients == []


async def _retire(worker: SessionWorker) -> None:
    async with worker.retiring():
        worker.deleted = True


async def test_a_deletion_that_fails_before_its_commit_leaves_the_session_usable(
    make_worker: MakeWorker,
) -> None:
    worker, _ = await make_worker()
    with pytest.raises(StorageUnavailable):
        async with worker.retiring():
            raise StorageUnavailable("disk full")
    assert not worker.gone and not worker.process.stopped
    turn = await within(worker.start_turn("still here"))
    events = await collect(turn)
    assert isinstance(events[-1], ResultEvent) and not events[-1].is_error


# Hibernation, and the live slots


async def test_idle_timeout_hibernates_and_closes_the_client(make_worker: MakeWorker) -> None:
    worker, factory = await make_worker(idle_timeout=0.05)
    await collect(await within(worker.start_turn("hi")))
    client = factory.last
    await factory.until(lambda: client.closed)
    assert worker.state == State.HIBERNATED
    assert not worker.record.closed

    # It comes back on demand, resuming the transcript.
    await collect(await within(worker.start_turn("again")))
    assert factory.specs[-1].resume is True


async def test_idle_timeout_does_not_hibernate_during_a_turn(make_worker: MakeWorker) -> None:
    gate = asyncio.Event()
    worker, factory = await make_worker(idle_timeout=0.02, factory=setup(turn_gate=gate))
    async with worker.exclusive():
        await worker.ensure_client()  # arms the idle timer when the exclusive block ends
    turn = await within(worker.start_turn("long"))
    await asyncio.sleep(0.1)  # several idle timeouts; nothing to await for what must not happen
    assert worker.state == State.RUNNING
    assert not factory.last.closed
    gate.set()
    await collect(turn)


async def test_an_idle_timeout_of_zero_never_hibernates(make_worker: MakeWorker) -> None:
    worker, factory = await make_worker(idle_timeout=0.0)
    await collect(await within(worker.start_turn("hi")))
    await asyncio.sleep(0.05)  # nothing to await for what must not happen
    assert factory.last.alive and worker.state == State.IDLE


async def test_hibernation_skips_a_session_whose_prompt_is_being_accepted(
    make_worker: MakeWorker, ledger: FlakyLedger
) -> None:
    worker, factory = await make_worker()
    await collect(await within(worker.start_turn("one")))
    client = factory.last
    recording = ledger.gates["begin_request"] = asyncio.Event()
    entered = ledger.entered["begin_request"] = asyncio.Event()
    accepting = asyncio.create_task(worker.start_turn("two", str(uuid.uuid4())))
    await within(entered.wait())
    await within(worker.hibernate())  # the idle timer fires now
    assert client.alive
    recording.set()
    await collect(await within(accepting))
    assert factory.clients == [client] and client.prompts == ["one", "two"]


async def test_a_session_needing_a_live_slot_hibernates_an_idle_one(make_worker: MakeWorker) -> None:
    slots = LiveSlots(1)
    idle, idle_factory = await make_worker(live=slots)
    busy, _ = await make_worker(live=slots)
    await collect(await within(idle.start_turn("one")))
    events = await collect(await within(busy.start_turn("two")))
    assert isinstance(events[-1], ResultEvent)
    assert idle_factory.last.closed and idle.state == State.HIBERNATED
    assert busy.state == State.IDLE


async def test_a_session_running_a_turn_keeps_its_live_slot(make_worker: MakeWorker) -> None:
    slots = LiveSlots(1)
    gate = asyncio.Event()
    running, running_factory = await make_worker(live=slots, factory=setup(turn_gate=gate))
    other, _ = await make_worker(live=slots)
    turn = await sent(running.start_turn("long job"))
    with pytest.raises(LiveSessionsExhausted):
        await collect(await within(other.start_turn("two")))
    assert running_factory.last.alive and not turn.done
    gate.set()
    await collect(turn)


async def test_a_session_holding_its_lock_for_a_rewind_keeps_its_live_slot(make_worker: MakeWorker) -> None:
    """Refused at once: the prompt needing the slot does not wait for the rewind."""
    slots = LiveSlots(1)
    rewinding, factory = await make_worker(live=slots)
    other, _ = await make_worker(live=slots)
    async with rewinding.exclusive():
        await rewinding.ensure_client()
        with pytest.raises(LiveSessionsExhausted):
            await collect(await within(other.start_turn("two")))
        assert factory.last.alive


# Shutdown


async def test_shutdown_waits_for_a_turn_that_ends_within_grace(make_worker: MakeWorker) -> None:
    gate = asyncio.Event()
    worker, factory = await make_worker(factory=setup(turn_gate=gate))
    turn = await sent(worker.start_turn("finishing"))
    asyncio.get_running_loop().call_later(0.1, gate.set)

    started = time.monotonic()
    await within(worker.shutdown(5.0))
    assert time.monotonic() - started < 2.0
    events = await collect(turn)  # ends normally, no error
    assert isinstance(events[-1], ResultEvent)
    assert not factory.last.turn_cancelled
    assert factory.last.closed


async def test_shutdown_cancels_a_turn_still_running_after_grace_and_closes_the_client(
    make_worker: MakeWorker,
) -> None:
    never = asyncio.Event()
    worker, factory = await make_worker(factory=setup(turn_gate=never))
    turn = await sent(worker.start_turn("stuck"))

    started = time.monotonic()
    await within(worker.shutdown(0.2))
    elapsed = time.monotonic() - started
    assert elapsed >= 0.2  # it did wait for the grace period
    assert elapsed < 2.0
    assert factory.last.turn_cancelled
    assert factory.last.closed
    assert factory.last.killed, "killed at once: a process busy with an abandoned turn would not exit"
    assert turn.done
    assert not worker.lock.locked()
    with pytest.raises(AgentUnavailable):
        await collect(turn)


async def test_after_shutdown_no_client_is_started_and_no_prompt_accepted(make_worker: MakeWorker) -> None:
    worker, factory = await make_worker()
    await worker.shutdown(0)
    with pytest.raises(ShuttingDown):
        async with worker.exclusive():
            await worker.ensure_client()
    with pytest.raises(ShuttingDown):
        await within(worker.start_turn("hi"))
    assert factory.clients == []
    assert not worker.turn_running


async def test_a_client_that_finishes_starting_after_shutdown_began_is_closed(
    make_worker: MakeWorker,
) -> None:
    start_gate = asyncio.Event()
    worker, factory = await make_worker(factory=setup(start_gate=start_gate))

    async def use() -> None:
        async with worker.exclusive():
            await worker.ensure_client()

    user = asyncio.create_task(use())
    await factory.until(lambda: bool(factory.starting))
    # The shutdown lets the work holding the lock finish; the process must not outlive it.
    stopping = asyncio.create_task(worker.shutdown(0))
    await asyncio.sleep(0)  # the shutdown has begun
    assert worker.process.stopped
    start_gate.set()
    with pytest.raises(ShuttingDown):
        await within(user)
    await within(stopping)
    assert factory.last.closed
    assert worker.client_pid is None


async def test_shutdown_lets_a_rewind_in_progress_finish_before_ending_the_process(
    make_worker: MakeWorker,
) -> None:
    worker, factory = await make_worker()
    await collect(await within(worker.start_turn("one")))
    client = factory.last
    release, holding = asyncio.Event(), asyncio.Event()

    async def rewind() -> bool:
        async with worker.exclusive():
            holding.set()
            await release.wait()
            return client.alive

    rewinding = asyncio.create_task(rewind())
    await within(holding.wait())
    stopping = asyncio.create_task(worker.shutdown(0))
    with pytest.raises(TimeoutError):  # nothing to await for what must not happen
        await factory.until(lambda: client.closed, 0.1)
    release.set()
    assert await within(rewinding), "the process lived until the rewind ended"
    await within(stopping)
    assert client.closed
