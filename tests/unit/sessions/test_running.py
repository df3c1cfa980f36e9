"""A session's turns as they run (sessions/running.py, over the event log of sessions/turns.py):
one at a time under the lock, run to their end whoever listens, announced once the transcript
holds the prompt, a pending rewind resolved first, interrupted (and killed when they ignore it),
and ended, the lock released, on every failure: the CLI's, the ledger's, a cancellation.

The harness (a fake client, a ledger that fails on demand) is in harness.py and conftest.py.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from agent_rewind.errors import AgentRewindError, AgentUnavailable, StorageUnavailable, TurnInFlight
from agent_rewind.sessions.adapter import AgentError
from agent_rewind.sessions.turn_events import PromptEvent, ResultEvent, TurnEvent
from agent_rewind.sessions.worker import SessionWorker, State
from agent_rewind.testing.fake_agent import FakeClient, FakeFactory
from tests.unit.sessions.harness import (
    SOON,
    FlakyLedger,
    MakeWorker,
    collect,
    first_event,
    kinds,
    sent,
    setup,
    within,
)

# Turns and the lock


async def test_start_turn_while_a_turn_runs_raises_turn_in_flight(make_worker: MakeWorker) -> None:
    gate = asyncio.Event()
    worker, factory = await make_worker(factory=setup(turn_gate=gate))
    turn = await sent(worker.start_turn("first"))
    assert worker.state == State.RUNNING

    with pytest.raises(TurnInFlight) as caught:
        await within(worker.start_turn("second"))
    assert caught.value.metadata == {"session_id": worker.session_id}
    assert factory.last.prompts == ["first"]

    gate.set()
    events = await collect(turn)
    assert isinstance(events[-1], ResultEvent)
    assert worker.state == State.IDLE


async def test_a_second_prompt_while_the_first_is_still_starting_its_client_is_turn_in_flight(
    make_worker: MakeWorker,
) -> None:
    """Same window, seen from a second Prompt: refused at once, never run after the first."""
    start_gate = asyncio.Event()
    worker, factory = await make_worker(factory=setup(start_gate=start_gate))
    first = await within(worker.start_turn("first"))
    await factory.until(lambda: bool(factory.starting))
    with pytest.raises(TurnInFlight):
        await within(worker.start_turn("second"))
    start_gate.set()
    await collect(first)
    assert [c.prompts for c in factory.clients] == [["first"]]


async def test_turn_runs_to_its_end_without_listeners_and_every_listener_replays_all_events(
    make_worker: MakeWorker,
) -> None:
    gate = asyncio.Event()
    worker, factory = await make_worker(factory=setup(turn_gate=gate))
    turn = await within(worker.start_turn("hi"))

    # One listener hangs up after the first event, as a client that goes away would.
    first = await first_event(turn)
    assert isinstance(first, PromptEvent)

    gate.set()
    await within(turn.wait())  # nobody is reading, yet the turn ends
    assert turn.done
    assert worker.state == State.IDLE
    assert not worker.lock.locked()

    replay_a = await collect(turn)
    replay_b = await collect(turn)
    assert replay_a == replay_b
    assert kinds(replay_a) == ["PromptEvent", "AssistantEvent", "ResultEvent"]
    assert replay_a[0] == first
    assert factory.last.prompts == ["hi"]


async def test_listeners_attached_during_a_turn_all_see_every_event(make_worker: MakeWorker) -> None:
    gate = asyncio.Event()
    worker, _ = await make_worker(factory=setup(turn_gate=gate))
    turn = await sent(worker.start_turn("hi"))
    listeners = [asyncio.create_task(collect(turn)) for _ in range(3)]
    gate.set()
    results = await within(asyncio.gather(*listeners))
    assert all(kinds(r) == ["PromptEvent", "AssistantEvent", "ResultEvent"] for r in results)
    assert results[0] == results[1] == results[2]


# The prompt id, and the prompt announced


async def test_a_turns_prompt_event_carries_the_prompt_id_chosen_up_front(
    make_worker: MakeWorker, ledger: FlakyLedger
) -> None:
    start_gate = asyncio.Event()
    worker, factory = await make_worker(factory=setup(start_gate=start_gate))
    request_id = str(uuid.uuid4())
    turn = await within(worker.start_turn("hello", request_id))

    # Known, and recorded with the request, before the CLI has even started.
    chosen = turn.prompt_id
    assert str(uuid.UUID(chosen)) == chosen
    await factory.until(lambda: bool(factory.starting))
    recorded = await ledger.request(request_id)
    assert recorded is not None and not recorded.done
    assert recorded.result == {"prompt_id": chosen}

    start_gate.set()
    events = await collect(turn)
    assert events[0] == PromptEvent(chosen, "hello")
    assert factory.last.prompt_ids == [chosen]
    assert (await worker.view()).points[-1].message_id == chosen
    other = await collect(await within(worker.start_turn("again")))
    assert other[0].message_id != chosen  # type: ignore[union-attr]


async def test_the_prompt_is_announced_from_the_transcript_before_the_clis_echo(
    make_worker: MakeWorker,
) -> None:
    """The rewind point exists once the CLI wrote the prompt, usually long before it answers."""
    gate = asyncio.Event()
    worker, _ = await make_worker(factory=setup(turn_gate=gate, echo=False))
    turn = await within(worker.start_turn("hello"))
    first = await first_event(turn)  # the CLI has not echoed it yet: it waits on the gate
    assert first == PromptEvent(turn.prompt_id, "hello")
    assert not gate.is_set()
    gate.set()
    events = await collect(turn)
    assert kinds(events) == ["PromptEvent", "AssistantEvent", "ResultEvent"], "announced once"


async def test_after_the_clis_echo_the_prompt_waits_for_the_transcript(make_worker: MakeWorker) -> None:
    """The prompt event says its rewind point exists: it is published once the transcript holds
    the prompt, even when the CLI echoes it before writing it."""
    worker, _ = await make_worker(factory=setup(transcript_delay=0.2))
    turn = await within(worker.start_turn("hello"))
    first = await first_event(turn)
    assert first == PromptEvent(turn.prompt_id, "hello")
    assert (await worker.catch_up()).get(turn.prompt_id) is not None, "in the transcript when announced"
    events = await collect(turn)
    assert kinds(events) == ["PromptEvent", "AssistantEvent", "ResultEvent"]


async def test_a_turn_answered_with_a_result_alone_still_opens_with_its_prompt(
    make_worker: MakeWorker,
) -> None:
    """A command the CLI answers without an echo: its prompt is announced (once the transcript
    holds it) before the result."""
    worker, _ = await make_worker(factory=setup(only_result=True, transcript_delay=0.1))
    turn = await within(worker.start_turn("/cost"))
    events = await collect(turn)
    assert kinds(events) == ["PromptEvent", "ResultEvent"]
    assert events[0] == PromptEvent(turn.prompt_id, "/cost")


# resolve_pending


async def test_resolve_pending_is_awaited_under_the_lock_before_every_turn(make_worker: MakeWorker) -> None:
    factory = FakeFactory()
    seen: list[tuple[bool, int]] = []

    async def resolve(worker: SessionWorker) -> None:
        await asyncio.sleep(0)
        seen.append((worker.lock.locked(), sum(len(c.prompts) for c in factory.clients)))

    worker, _ = await make_worker(factory=factory, resolve_pending=resolve)
    await collect(await within(worker.start_turn("one")))
    await collect(await within(worker.start_turn("two")))
    assert seen == [(True, 0), (True, 1)]


async def test_a_turn_does_not_run_when_resolve_pending_fails(make_worker: MakeWorker) -> None:
    failing = True

    async def resolve(worker: SessionWorker) -> None:
        if failing:
            raise AgentUnavailable(worker.session_id, "a pending rewind could not restore its files")

    worker, factory = await make_worker(resolve_pending=resolve)
    turn = await within(worker.start_turn("hi"))
    with pytest.raises(AgentUnavailable, match="pending rewind"):
        await collect(turn)
    assert not turn.sent
    assert all(c.prompts == [] for c in factory.clients)
    assert not worker.lock.locked() and not worker.turn_running

    failing = False
    events = await collect(await within(worker.start_turn("hi")))
    assert isinstance(events[-1], ResultEvent)


# When the CLI fails


async def test_start_turn_with_a_client_that_cannot_start_fails_the_turn_and_releases_the_lock(
    make_worker: MakeWorker,
) -> None:
    fail = True

    def apply(client: FakeClient) -> None:
        if fail:
            client.start_error = AgentError("no cli")

    worker, _ = await make_worker(factory=FakeFactory(apply))
    failed = await within(worker.start_turn("hi"))
    with pytest.raises(AgentUnavailable):
        await collect(failed)  # the turn's log ends with the start failure
    assert not failed.sent
    assert not worker.lock.locked()
    assert not worker.turn_running

    fail = False
    events = await collect(await within(worker.start_turn("hi again")))
    assert isinstance(events[-1], ResultEvent)


async def test_agent_error_during_turn_ends_events_with_agent_unavailable_and_hibernates(
    make_worker: MakeWorker,
) -> None:
    worker, factory = await make_worker(
        factory=setup(turn_error=AgentError("the Claude Code process exited during the turn"))
    )
    turn = await within(worker.start_turn("hi"))

    seen: list[TurnEvent] = []
    with pytest.raises(AgentUnavailable) as caught:
        async with asyncio.timeout(SOON):
            async for event in turn.events():
                seen.append(event)
    assert kinds(seen) == ["PromptEvent"]
    assert "exited during the turn" in caught.value.message
    assert turn.done
    assert worker.state == State.HIBERNATED
    assert not worker.lock.locked()
    await factory.until(lambda: factory.clients[0].closed)
    # Every late listener sees the same ending.
    with pytest.raises(AgentUnavailable):
        await collect(turn)


# Interrupt


async def test_an_interrupt_the_cli_honours_ends_the_turn_as_interrupted(make_worker: MakeWorker) -> None:
    never = asyncio.Event()
    worker, factory = await make_worker(factory=setup(turn_gate=never))
    turn = await sent(worker.start_turn("long job"))
    await within(worker.interrupt())
    events = await collect(turn)
    result = events[-1]
    assert isinstance(result, ResultEvent) and result.interrupted
    assert factory.last.interrupts == 1
    assert not factory.last.killed
    # The process stays for the next turn.
    never.set()
    await collect(await within(worker.start_turn("next")))
    assert len(factory.clients) == 1


async def test_a_turn_that_ignores_interrupt_is_ended_by_killing_its_process(make_worker: MakeWorker) -> None:
    never = asyncio.Event()
    worker, factory = await make_worker(
        factory=setup(turn_gate=never, ignore_interrupt=True), interrupt_timeout=0.1
    )
    turn = await sent(worker.start_turn("stuck"))
    stuck = factory.last
    asked = time.monotonic()
    await within(worker.interrupt())
    assert stuck.interrupts == 1
    events = await collect(turn)
    assert time.monotonic() - asked >= 0.1, "it was given interrupt_timeout to stop"

    result = events[-1]
    assert isinstance(result, ResultEvent)
    assert result.interrupted and result.is_error
    assert stuck.killed
    assert turn.killed and turn.error is None
    assert not worker.lock.locked() and worker.state == State.HIBERNATED

    never.set()
    events = await collect(await within(worker.start_turn("next")))
    assert isinstance(events[-1], ResultEvent) and not events[-1].interrupted
    assert len(factory.clients) == 2 and factory.last is not stuck
    assert factory.last.prompts == ["next"]


async def test_an_interrupt_that_fails_kills_the_process(make_worker: MakeWorker) -> None:
    never = asyncio.Event()
    worker, factory = await make_worker(
        factory=setup(turn_gate=never, interrupt_error=AgentError("interrupt failed: broken pipe"))
    )
    turn = await sent(worker.start_turn("stuck"))
    await within(worker.interrupt())
    events = await collect(turn)
    assert isinstance(events[-1], ResultEvent) and events[-1].interrupted
    assert factory.last.killed


async def test_interrupt_while_the_prompt_is_still_starting_its_client_stops_the_turn(
    make_worker: MakeWorker,
) -> None:
    start_gate = asyncio.Event()
    never = asyncio.Event()
    worker, factory = await make_worker(factory=setup(start_gate=start_gate, turn_gate=never))
    turn = await within(worker.start_turn("hello"))
    await factory.until(lambda: bool(factory.starting))
    assert worker.state == State.RUNNING and not turn.sent
    await within(worker.interrupt())  # nothing to send it to yet
    start_gate.set()
    events = await collect(turn)
    assert factory.last.interrupts == 1, "the interrupt reached the CLI once the prompt was sent"
    assert turn.interrupted
    assert isinstance(events[-1], ResultEvent) and events[-1].interrupted


async def test_an_interrupt_while_the_prompt_is_being_accepted_stops_the_turn(
    make_worker: MakeWorker, ledger: FlakyLedger
) -> None:
    worker, _ = await make_worker()
    recording = asyncio.Event()
    ledger.gates["begin_request"] = recording
    entered = ledger.entered["begin_request"] = asyncio.Event()
    accepting = asyncio.create_task(worker.start_turn("hi", str(uuid.uuid4())))
    await within(entered.wait())
    assert worker.state == State.RUNNING
    await within(worker.interrupt())
    recording.set()
    events = await collect(await within(accepting))
    result = events[-1]
    assert isinstance(result, ResultEvent)
    assert result.interrupted, "the Interrupt was lost"


async def test_an_interrupt_while_a_prompt_is_accepted_reaches_the_live_cli_after_the_prompt(
    make_worker: MakeWorker, ledger: FlakyLedger
) -> None:
    """Sent before the prompt, the CLI would have no turn to stop."""
    worker, factory = await make_worker()
    await collect(await within(worker.start_turn("one")))
    recording = ledger.gates["begin_request"] = asyncio.Event()
    entered = ledger.entered["begin_request"] = asyncio.Event()
    accepting = asyncio.create_task(worker.start_turn("two", str(uuid.uuid4())))
    await within(entered.wait())
    await within(worker.interrupt())
    assert factory.last.interrupted_after == [], "nothing sent yet"
    recording.set()
    events = await collect(await within(accepting))
    assert factory.last.interrupted_after == [2], "sent once the second prompt was"
    result = events[-1]
    assert isinstance(result, ResultEvent) and result.interrupted


async def test_interrupt_without_a_turn_does_nothing(make_worker: MakeWorker) -> None:
    worker, factory = await make_worker()
    await within(worker.interrupt())
    await collect(await within(worker.start_turn("hi")))
    await within(worker.interrupt())
    assert factory.last.interrupts == 0


async def test_a_listener_gone_while_the_cli_starts_does_not_lose_the_prompt(make_worker: MakeWorker) -> None:
    start_gate = asyncio.Event()
    worker, factory = await make_worker(factory=setup(start_gate=start_gate))
    turn = await within(worker.start_turn("keep me"))

    async def listen() -> None:
        async for _ in turn.events():
            pass

    listener = asyncio.create_task(listen())
    await factory.until(lambda: bool(factory.starting))
    listener.cancel()  # the RPC's caller hung up while the CLI was still starting
    start_gate.set()
    events = await collect(turn)
    assert factory.last.prompts == ["keep me"]
    assert isinstance(events[-1], ResultEvent)
    assert worker.state == State.IDLE


# When the ledger fails, or the turn is cancelled


async def test_a_failing_ledger_write_at_the_end_of_a_turn_ends_the_stream_with_an_error(
    make_worker: MakeWorker, ledger: FlakyLedger
) -> None:
    worker, factory = await make_worker()
    async with worker.exclusive():
        await worker.ensure_client()  # started (and recorded so) while the ledger works
    ledger.fail |= {"record_points", "finish_request"}
    ledger.calls.clear()
    request_id = str(uuid.uuid4())
    turn = await within(worker.start_turn("hi", request_id))

    seen: list[TurnEvent] = []
    with pytest.raises(AgentRewindError) as caught:
        async with asyncio.timeout(SOON):
            async for event in turn.events():
                seen.append(event)
    assert kinds(seen) == ["PromptEvent", "AssistantEvent", "ResultEvent"], "the turn itself ran"
    assert isinstance(caught.value, StorageUnavailable)
    assert caught.value.reason == "STORAGE_UNAVAILABLE"
    assert "record_points" in caught.value.message
    assert {"record_points", "finish_request"} <= set(ledger.calls), "every step was tried"
    assert turn.done and not worker.lock.locked() and not worker.turn_running
    assert worker.state == State.IDLE

    ledger.fail.clear()
    events = await collect(await within(worker.start_turn("again")))
    assert isinstance(events[-1], ResultEvent)
    assert factory.last.prompts == ["hi", "again"]


async def test_a_failing_ledger_write_at_acceptance_fails_the_call_and_claims_nothing(
    make_worker: MakeWorker, ledger: FlakyLedger
) -> None:
    worker, factory = await make_worker()
    ledger.fail.add("begin_request")
    with pytest.raises(StorageUnavailable):
        await within(worker.start_turn("hi", str(uuid.uuid4())))
    assert not worker.turn_running and not worker.lock.locked()
    assert factory.clients == []

    ledger.fail.clear()
    events = await collect(await within(worker.start_turn("hi", str(uuid.uuid4()))))
    assert isinstance(events[-1], ResultEvent)


async def test_a_turn_cancelled_while_it_records_itself_still_ends_and_releases_the_lock(
    make_worker: MakeWorker, ledger: FlakyLedger
) -> None:
    worker, _ = await make_worker()
    slow_disk = asyncio.Event()
    ledger.gates["finish_request"] = slow_disk
    entered = ledger.entered["finish_request"] = asyncio.Event()
    turn = await within(worker.start_turn("hi", str(uuid.uuid4())))
    await within(entered.wait())  # the turn has its result and is recording it
    stopping = asyncio.create_task(worker.shutdown(0))
    try:
        await within(turn.wait(), 0.5)
        assert not worker.lock.locked()
    finally:
        slow_disk.set()
        if worker.lock.locked():
            worker.lock.release()  # let the shutdown (and the fixture) go on
        await within(stopping)
    # Its events were all read, but the shutdown cut its recording short: the stream says so.
    with pytest.raises(AgentUnavailable, match="cancelled by a server shutdown"):
        await collect(turn)


async def test_a_turn_cancelled_while_it_waits_for_the_lock_leaves_the_lock_to_its_holder(
    make_worker: MakeWorker,
) -> None:
    worker, _ = await make_worker()
    await worker.lock.acquire()  # a rewind in progress
    try:
        turn = await within(worker.start_turn("queued"))
        stopping = asyncio.create_task(worker.shutdown(0))  # cancels the waiting turn at once
        await within(turn.wait())
        assert worker.lock.locked(), "the rewind still holds the lock"
        assert not worker.turn_running
    finally:
        worker.lock.release()
    await within(stopping)
    with pytest.raises(AgentUnavailable, match="cancelled by a server shutdown"):
        await collect(turn)
