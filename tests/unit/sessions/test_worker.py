"""SessionWorker with a fake AgentClient: locking, turns, request ids, interrupts, the client's
lifecycle, hibernation, close, shutdown, and what happens when the ledger fails.

No CLI process runs here. The fake client (agent_rewind.testing.fake_agent) scripts a turn (its
prompt, then an optional wait on a gate, then an assistant message and a result), writes the
prompt and the reply to the session's transcript as the CLI would, and records how the worker
used it. The ledger is a real SQLite one in tmp_path, behind a wrapper that can make any of its
methods fail or wait.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from agent_rewind.errors import (
    AgentRewindError,
    AgentUnavailable,
    LiveSessionsExhausted,
    RequestIdReused,
    SessionNotFound,
    ShuttingDown,
    StorageUnavailable,
    TurnInFlight,
)
from agent_rewind.sessions.adapter import AgentError
from agent_rewind.sessions.events import (
    ConversationAnswer,
    FilesAnswer,
    PromptEvent,
    ResultEvent,
    TurnEvent,
)
from agent_rewind.sessions.live import LiveSlots
from agent_rewind.sessions.turns import Turn
from agent_rewind.sessions.worker import SessionWorker, State, WorkerContext
from agent_rewind.snapshots import Limits
from agent_rewind.snapshots.taking import Snapshots
from agent_rewind.store.ledger import Anchor, NewEvent, NewRequest, NewRewind, NewSession, RequestRecord
from agent_rewind.store.sqlite import SqliteLedger
from agent_rewind.testing.fake_agent import FakeClient, FakeFactory
from agent_rewind.testing.fake_agent import append as _append
from agent_rewind.testing.fake_agent import prompt_entry as _prompt_entry
from agent_rewind.testing.fake_agent import reply_entry as _reply_entry
from agent_rewind.transcript.paths import transcript_path

# Generous bound on anything that should happen "at once"; a hang fails instead of blocking.
SOON = 2.0
CLI_ENV = {"CLAUDE_CONFIG_DIR": "/state/claude", "HOME": "/state/home"}


class FlakyLedger:
    """The SQLite ledger, with any method made to fail (`fail`) or wait (`gates`) on demand."""

    def __init__(self, inner: SqliteLedger) -> None:
        self.inner = inner
        self.fail: set[str] = set()
        self.gates: dict[str, asyncio.Event] = {}
        self.entered: dict[str, asyncio.Event] = {}
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)
        if not callable(method):
            return method

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            self.entered.setdefault(name, asyncio.Event()).set()
            gate = self.gates.get(name)
            if gate is not None:
                await gate.wait()
            if name in self.fail:
                # What SqliteLedger raises for a disk that is full or failing.
                raise StorageUnavailable(f"disk I/O error ({name})")
            return await method(*args, **kwargs)

        return call


MakeWorker = Callable[..., Awaitable[tuple[SessionWorker, FakeFactory]]]


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[FlakyLedger]:
    inner = await SqliteLedger.open(tmp_path / "ledger.sqlite3")
    yield FlakyLedger(inner)
    await inner.close()


@pytest.fixture
async def make_worker(tmp_path: Path, ledger: FlakyLedger) -> AsyncIterator[MakeWorker]:
    workers: list[SessionWorker] = []

    async def make(
        *,
        options: dict[str, Any] | None = None,
        checkpointing: bool = True,
        idle_timeout: float = 0.0,
        interrupt_timeout: float = 5.0,
        factory: FakeFactory | None = None,
        session_id: str | None = None,
        resolve_pending: Callable[[SessionWorker], Awaitable[None]] | None = None,
        project_settings: bool = False,
        live: LiveSlots | None = None,
        replica_id: str = "",
        snapshots: Snapshots | None = None,
        snapshot_retention: int = 0,
    ) -> tuple[SessionWorker, FakeFactory]:
        sid = session_id or str(uuid.uuid4())
        record = await ledger.session(sid)
        if record is None:
            cwd = tmp_path / "workspaces" / sid
            cwd.mkdir(parents=True, exist_ok=True)
            record = await ledger.add_session(NewSession(sid, str(cwd), options or {}, checkpointing))
        factory = factory or FakeFactory()
        factory.config_dir = tmp_path / "claude"
        extra: dict[str, Any] = {} if resolve_pending is None else {"resolve_pending": resolve_pending}
        ctx = WorkerContext(
            ledger=ledger,  # type: ignore[arg-type]
            client_factory=factory,
            cli_env=CLI_ENV,
            claude_config_dir=tmp_path / "claude",
            idle_timeout=idle_timeout,
            interrupt_timeout=interrupt_timeout,
            project_settings=project_settings,
            live=live,
            replica_id=replica_id,
            snapshots=snapshots,
            snapshot_retention=snapshot_retention,
            **extra,
        )
        worker = SessionWorker(record, ctx)
        workers.append(worker)
        return worker, factory

    yield make
    ledger.fail.clear()
    for gate in ledger.gates.values():
        gate.set()
    for worker in workers:
        await worker.shutdown(0)


async def within(awaitable: Awaitable[Any], seconds: float = SOON) -> Any:
    async with asyncio.timeout(seconds):
        return await awaitable


async def collect(turn: Turn) -> list[TurnEvent]:
    async def run() -> list[TurnEvent]:
        return [e async for e in turn.events()]

    result: list[TurnEvent] = await within(run())
    return result


async def first_event(turn: Turn) -> TurnEvent:
    """The turn's first event (its prompt, published once the prompt reached the CLI)."""
    events = turn.events()
    try:
        event: TurnEvent = await within(anext(events))
    finally:
        await events.aclose()
    return event


async def sent(accepting: Awaitable[Turn]) -> Turn:
    """Accepts a prompt and waits until it reached the (fake) CLI."""
    turn: Turn = await within(accepting)
    assert isinstance(await first_event(turn), PromptEvent)
    assert turn.sent
    return turn


def setup(**knobs: Any) -> FakeFactory:
    """A factory whose clients all get these knobs."""

    def apply(client: FakeClient) -> None:
        for name, value in knobs.items():
            setattr(client, name, value)

    return FakeFactory(apply)


def kinds(events: list[TurnEvent]) -> list[str]:
    return [type(e).__name__ for e in events]


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


async def test_exclusive_refuses_at_once_while_a_turn_runs(make_worker: MakeWorker) -> None:
    gate = asyncio.Event()
    worker, _ = await make_worker(factory=setup(turn_gate=gate))
    turn = await within(worker.start_turn("long job"))

    entered = False
    with pytest.raises(TurnInFlight):
        # Refused without waiting for the lock, which the turn holds until its result.
        async with asyncio.timeout(0.5), worker.exclusive():
            entered = True
    assert not entered
    assert not turn.done

    gate.set()
    await collect(turn)
    async with asyncio.timeout(SOON), worker.exclusive():
        entered = True
    assert entered


async def test_exclusive_refuses_at_once_while_a_prompt_is_still_starting_its_client(
    make_worker: MakeWorker,
) -> None:
    """A prompt whose CLI is still starting already owns the session: a rewind is refused with
    TURN_IN_FLIGHT at once instead of queueing behind the whole turn."""
    start_gate = asyncio.Event()
    worker, factory = await make_worker(factory=setup(start_gate=start_gate))
    turn = await within(worker.start_turn("hello"))
    await factory.until(lambda: bool(factory.starting))
    assert not turn.sent and worker.lock.locked()

    entered = False
    try:
        with pytest.raises(TurnInFlight):
            async with asyncio.timeout(0.5), worker.exclusive():
                entered = True
    finally:
        start_gate.set()
        await collect(turn)
    assert not entered


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


async def test_turns_of_two_sessions_run_concurrently(make_worker: MakeWorker) -> None:
    never = asyncio.Event()
    slow, slow_factory = await make_worker(factory=setup(turn_gate=never))
    fast, _ = await make_worker()

    slow_turn = await sent(slow.start_turn("takes forever"))
    assert slow.state == State.RUNNING

    fast_turn = await within(fast.start_turn("quick"), 1.0)
    events = await collect(fast_turn)
    assert isinstance(events[-1], ResultEvent)
    # And exclusive work on the other session is not held up either.
    async with asyncio.timeout(1.0), fast.exclusive():
        pass

    assert slow.state == State.RUNNING
    assert not slow_turn.done
    never.set()
    await collect(slow_turn)
    assert slow_factory.last.prompts == ["takes forever"]


# The prompt id


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


# The client


async def test_first_client_start_is_fresh_and_marks_the_session_started(
    make_worker: MakeWorker, ledger: FlakyLedger
) -> None:
    worker, factory = await make_worker()
    assert worker.state == State.HIBERNATED
    async with worker.exclusive():
        client = await worker.ensure_client()
    assert client is factory.last
    assert factory.specs[0].resume is False
    assert worker.state == State.IDLE
    record = await ledger.session(worker.session_id)
    assert record is not None and record.started
    assert worker.record.started


async def test_ensure_client_reuses_a_live_client(make_worker: MakeWorker) -> None:
    worker, factory = await make_worker()
    async with worker.exclusive():
        first = await worker.ensure_client()
        again = await worker.ensure_client()
    assert again is first
    assert len(factory.clients) == 1


async def test_a_dead_client_is_replaced_by_one_resuming_at_the_visible_leaf(make_worker: MakeWorker) -> None:
    worker, factory = await make_worker()
    await collect(await within(worker.start_turn("one")))
    first = factory.last
    first.die()
    assert worker.state == State.HIBERNATED

    async with worker.exclusive():
        second = await worker.ensure_client()
    assert second is not first
    assert len(factory.clients) == 2
    spec = factory.specs[1]
    assert spec.resume is True
    assert spec.session_id == worker.session_id
    assert spec.resume_session_at == (await worker.view()).leaf == first.leaf
    assert first.closed
    assert worker.state == State.IDLE


async def test_a_prompt_after_the_process_died_resumes_in_a_new_client(make_worker: MakeWorker) -> None:
    worker, factory = await make_worker()
    await collect(await within(worker.start_turn("one")))
    factory.last.die()

    events = await collect(await within(worker.start_turn("two")))
    assert isinstance(events[-1], ResultEvent)
    assert [s.resume for s in factory.specs] == [False, True]
    assert factory.clients[1].prompts == ["two"]
    assert [p.text for p in (await worker.view()).points] == ["one", "two"]


async def test_client_start_failure_raises_agent_unavailable(
    make_worker: MakeWorker, ledger: FlakyLedger
) -> None:
    worker, _ = await make_worker(
        factory=setup(start_error=AgentError("the Claude Code CLI did not start: boom"))
    )
    with pytest.raises(AgentUnavailable) as caught:
        async with worker.exclusive():
            await worker.ensure_client()
    assert "boom" in caught.value.message
    assert caught.value.metadata == {"session_id": worker.session_id}
    assert worker.state == State.HIBERNATED
    record = await ledger.session(worker.session_id)
    assert record is not None and not record.started


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


# When the ledger fails


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


# Request ids


async def test_a_retried_request_id_re_attaches_to_its_turn(make_worker: MakeWorker) -> None:
    gate = asyncio.Event()
    worker, factory = await make_worker(factory=setup(turn_gate=gate))
    request_id = str(uuid.uuid4())
    turn = await sent(worker.start_turn("hi", request_id))
    again = await within(worker.start_turn("hi", request_id))
    assert again is turn  # not TURN_IN_FLIGHT: the same turn
    gate.set()
    events = await collect(again)
    assert await collect(await within(worker.start_turn("hi", request_id))) == events
    assert factory.last.prompts == ["hi"]


async def test_a_request_id_with_other_text_is_request_id_reused(make_worker: MakeWorker) -> None:
    worker, factory = await make_worker()
    request_id = str(uuid.uuid4())
    await collect(await within(worker.start_turn("hi", request_id)))
    with pytest.raises(RequestIdReused) as caught:
        await within(worker.start_turn("something else", request_id))
    assert caught.value.metadata == {"request_id": request_id}
    # A new worker (a restart) knows it from the ledger.
    again, _ = await make_worker(session_id=worker.session_id)
    with pytest.raises(RequestIdReused):
        await within(again.start_turn("something else", request_id))
    # And another session cannot use it either.
    other, _ = await make_worker()
    with pytest.raises(RequestIdReused):
        await within(other.start_turn("hi", request_id))
    assert factory.last.prompts == ["hi"]


async def test_a_finished_turn_is_replayed_from_the_ledger_after_a_restart(make_worker: MakeWorker) -> None:
    worker, _ = await make_worker()
    request_id = str(uuid.uuid4())
    turn = await within(worker.start_turn("hi", request_id))
    original = await collect(turn)

    restarted, factory = await make_worker(session_id=worker.session_id)
    replayed = await within(restarted.start_turn("hi", request_id))
    assert replayed.done
    events = await collect(replayed)
    assert events == [original[0], original[-1]]  # its prompt and its result
    assert events[0] == PromptEvent(turn.prompt_id, "hi")
    assert factory.clients == [], "nothing ran again"
    assert not restarted.turn_running


async def test_a_failed_turn_is_replayed_with_its_error(make_worker: MakeWorker) -> None:
    worker, _ = await make_worker(factory=setup(turn_error=AgentError("the process exited")))
    request_id = str(uuid.uuid4())
    with pytest.raises(AgentUnavailable):
        await collect(await within(worker.start_turn("hi", request_id)))

    restarted, factory = await make_worker(session_id=worker.session_id)
    replayed = await within(restarted.start_turn("hi", request_id))
    seen: list[TurnEvent] = []
    with pytest.raises(AgentRewindError) as caught:
        async for event in replayed.events():
            seen.append(event)
    assert kinds(seen) == ["PromptEvent"]
    assert caught.value.reason == "AGENT_UNAVAILABLE"
    assert "the process exited" in caught.value.message
    assert factory.clients == []


async def _left_by_a_dead_server(ledger: FlakyLedger, request_id: str, snapshot: RequestRecord) -> None:
    """Puts the request back as a server that died mid-turn left it: accepted, not finished."""
    await ledger.forget_request(request_id)
    await ledger.begin_request(
        NewRequest(snapshot.request_id, snapshot.method, snapshot.fingerprint, snapshot.session_id),
        snapshot.result,
    )


async def test_a_turn_cut_short_by_a_dead_server_is_reported_not_run_again(
    make_worker: MakeWorker, ledger: FlakyLedger
) -> None:
    """Its prompt reached the transcript, so it ran (in part): never run it twice."""
    never = asyncio.Event()
    worker, _ = await make_worker(factory=setup(turn_gate=never))
    request_id = str(uuid.uuid4())
    turn = await sent(worker.start_turn("hi", request_id))
    snapshot = await ledger.request(request_id)
    assert snapshot is not None and not snapshot.done
    await worker.shutdown(0)
    await _left_by_a_dead_server(ledger, request_id, snapshot)

    restarted, factory = await make_worker(session_id=worker.session_id)
    for attempt in range(2):
        replayed = await within(restarted.start_turn("hi", request_id))
        seen: list[TurnEvent] = []
        with pytest.raises(AgentRewindError) as caught:
            async for event in replayed.events():
                seen.append(event)
        assert seen == [PromptEvent(turn.prompt_id, "hi")], attempt
        assert caught.value.reason == "AGENT_UNAVAILABLE"
        assert "will not run again" in caught.value.message
    assert factory.clients == []
    recorded = await ledger.request(request_id)
    assert recorded is not None and recorded.done
    assert [p.text for p in (await restarted.view()).points] == ["hi"]


async def test_a_turn_a_dead_server_never_sent_runs_on_retry(
    make_worker: MakeWorker, ledger: FlakyLedger
) -> None:
    """Its prompt is not in the transcript: it never ran, so the retry runs it."""
    never = asyncio.Event()
    worker, dead = await make_worker(factory=setup(start_gate=never))
    request_id = str(uuid.uuid4())
    await within(worker.start_turn("hi", request_id))
    await dead.until(lambda: bool(dead.starting))  # the CLI is starting
    snapshot = await ledger.request(request_id)
    assert snapshot is not None and snapshot.result and snapshot.result["prompt_id"]
    await worker.shutdown(0)
    await _left_by_a_dead_server(ledger, request_id, snapshot)

    restarted, factory = await make_worker(session_id=worker.session_id)
    turn = await within(restarted.start_turn("hi", request_id))
    events = await collect(turn)
    assert isinstance(events[-1], ResultEvent) and events[-1].result == "echo: hi"
    assert factory.last.prompts == ["hi"]
    recorded = await ledger.request(request_id)
    assert recorded is not None and recorded.done
    assert recorded.result is not None and recorded.result["prompt_id"] == turn.prompt_id


@pytest.mark.parametrize("restart", [False, True], ids=["same-server", "after-restart"])
async def test_a_retry_of_a_prompt_that_never_reached_the_cli_runs_it(
    make_worker: MakeWorker, restart: bool
) -> None:
    cli_broken = True

    def apply(client: FakeClient) -> None:
        if cli_broken:
            client.start_error = AgentError("the Claude Code CLI did not start")

    worker, _ = await make_worker(factory=FakeFactory(apply))
    request_id = str(uuid.uuid4())
    failed = await within(worker.start_turn("hi", request_id))
    with pytest.raises(AgentUnavailable):
        await collect(failed)
    assert not failed.sent

    cli_broken = False
    retrying, factory = (await make_worker(session_id=worker.session_id)) if restart else (worker, None)
    events = await collect(await within(retrying.start_turn("hi", request_id)))
    assert isinstance(events[-1], ResultEvent)
    assert factory is None or factory.last.prompts == ["hi"]


# Hibernation, shutdown


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


# The ClientSpec


async def test_client_spec_carries_stored_options_verbatim_and_checkpointing(make_worker: MakeWorker) -> None:
    options = {
        "model": "claude-test",
        "max_turns": 5,
        "allowed_tools": ["Read", "Bash"],
        "system_prompt": {"type": "preset", "preset": "claude_code", "append": "be brief"},
    }
    worker, factory = await make_worker(options=options, checkpointing=False)
    async with worker.exclusive():
        await worker.ensure_client()
    spec = factory.specs[0]
    assert spec.options == options
    assert spec.checkpointing is False
    assert spec.session_id == worker.session_id
    assert spec.cwd == Path(worker.record.cwd)
    assert dict(spec.env) == CLI_ENV
    assert spec.project_settings is False
    assert spec.stderr is not None


async def test_client_spec_keeps_checkpointing_on_when_stored(make_worker: MakeWorker) -> None:
    worker, factory = await make_worker(checkpointing=True)
    async with worker.exclusive():
        await worker.ensure_client()
    assert factory.specs[0].checkpointing is True


async def test_client_spec_follows_the_operators_project_settings(make_worker: MakeWorker) -> None:
    worker, factory = await make_worker(project_settings=True)
    async with worker.exclusive():
        await worker.ensure_client()
    assert factory.specs[0].project_settings is True


async def test_without_a_conversation_in_the_transcript_the_cli_starts_fresh_under_the_session_id(
    make_worker: MakeWorker, ledger: FlakyLedger
) -> None:
    """Even a session whose CLI ran before: with no conversation to resume, resuming would fail."""
    worker, factory = await make_worker()
    await ledger.touch_session(worker.session_id, started=True)
    async with worker.exclusive():
        await worker.ensure_client()
    spec = factory.specs[0]
    assert spec.resume is False
    assert spec.resume_session_at is None
    assert spec.session_id == worker.session_id


async def test_a_resume_is_pinned_at_the_visible_leaf(make_worker: MakeWorker) -> None:
    """Not a plain resume: a crash that kept the CLI from marking its newest leaf must never
    bring back turns the service does not show."""
    worker, factory = await make_worker()
    await collect(await within(worker.start_turn("one")))
    await collect(await within(worker.start_turn("two")))
    leaf = (await worker.view()).leaf
    assert leaf == factory.last.leaf
    await within(worker.hibernate())
    await collect(await within(worker.start_turn("three")))
    assert factory.specs[-1].resume is True
    assert factory.specs[-1].resume_session_at == leaf
    assert [p.text for p in (await worker.view()).points] == ["one", "two", "three"]


async def _cut_recorded(ledger: FlakyLedger, sid: str, anchor: Anchor) -> None:
    await ledger.begin_rewind(NewRewind(anchor.rewind_id, sid, anchor.target_message_id, "conversation", {}))
    await ledger.complete_rewind(anchor.rewind_id, {}, anchor, NewEvent("REWOUND", sid, anchor.rewind_id))


async def test_client_spec_resumes_at_a_pending_ledger_anchor(
    make_worker: MakeWorker, ledger: FlakyLedger, tmp_path: Path
) -> None:
    sid = str(uuid.uuid4())
    cwd = tmp_path / "workspaces" / sid
    cwd.mkdir(parents=True)
    await ledger.add_session(NewSession(sid, str(cwd), {"model": "m"}, True))
    await ledger.touch_session(sid, started=True)
    p1, a1, p2, a2 = (str(uuid.uuid4()) for _ in range(4))
    path = transcript_path(tmp_path / "claude", str(cwd), sid)
    _append(path, _prompt_entry(p1, None, "one"), _reply_entry(a1, p1, "1"))
    _append(path, _prompt_entry(p2, a1, "two"), _reply_entry(a2, p2, "2"))
    # A conversation rewind to "two": the conversation ends at the entry before it.
    anchor = Anchor(sid, a1, p2, path.stat().st_size, None, "rewind-1")
    await _cut_recorded(ledger, sid, anchor)

    worker, factory = await make_worker(session_id=sid)
    assert (await worker.view()).last_message_id == a1  # the cut shows before any client runs
    async with worker.exclusive():
        await worker.ensure_client()
    spec = factory.specs[0]
    assert spec.resume is True
    assert spec.resume_session_at == a1
    assert spec.options == {"model": "m"}
    assert await ledger.anchor(sid) == anchor  # still pending: no new turn has written the cut yet

    # The next turn writes the cut into the transcript itself: the ledger lets it go.
    await collect(await within(worker.start_turn("three")))
    assert await ledger.anchor(sid) is None
    assert [p.text for p in (await worker.view()).points] == ["one", "three"]


async def test_a_large_transcript_is_read_off_the_event_loop(
    make_worker: MakeWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long session's first read must not stall every other session on the loop."""
    import agent_rewind.sessions.view as worker_module

    worker, _factory = await make_worker()
    path = transcript_path(worker._ctx.claude_config_dir, worker.record.cwd, worker.session_id)
    _append(path, _prompt_entry(str(uuid.uuid4()), None, "hello"))

    calls: list[str] = []
    real_to_thread = asyncio.to_thread

    async def spy(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        calls.append(getattr(fn, "__name__", repr(fn)))
        return await real_to_thread(fn, *args, **kwargs)

    monkeypatch.setattr(worker_module.asyncio, "to_thread", spy)
    monkeypatch.setattr(worker_module, "READ_INLINE_BYTES", 10)
    view = await worker.view()
    assert len(view.points) == 1
    assert "refresh" in calls, "the read ran in a thread"


async def test_a_small_transcript_is_read_inline(
    make_worker: MakeWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agent_rewind.sessions.view as worker_module

    worker, _factory = await make_worker()
    path = transcript_path(worker._ctx.claude_config_dir, worker.record.cwd, worker.session_id)
    _append(path, _prompt_entry(str(uuid.uuid4()), None, "hello"))
    calls: list[str] = []
    real_to_thread = asyncio.to_thread

    async def spy(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        calls.append(getattr(fn, "__name__", repr(fn)))
        return await real_to_thread(fn, *args, **kwargs)

    monkeypatch.setattr(worker_module.asyncio, "to_thread", spy)
    assert len((await worker.view()).points) == 1
    assert "refresh" not in calls


# Conversation cuts


async def test_a_cut_the_live_process_accepts_keeps_the_process(make_worker: MakeWorker) -> None:
    worker, factory = await make_worker()
    await collect(await within(worker.start_turn("first")))
    client = factory.last
    async with worker.exclusive():
        await worker.view()
        await within(worker.cut_conversation("prompt-x"))
    assert client.cut_calls == [("prompt-x", client.prompt_ids[-1])], "told the newest prompt it has seen"
    assert worker.client_pid == client.pid and not client.closed
    assert len(factory.clients) == 1


async def test_a_cut_the_live_process_refuses_resumes_a_new_one_in_the_background(
    make_worker: MakeWorker,
) -> None:
    worker, factory = await make_worker()
    await collect(await within(worker.start_turn("first")))
    old = factory.last
    old.cut_answer = ConversationAnswer(False, "turn_running", "busy")
    async with worker.exclusive():
        await within(worker.cut_conversation("prompt-x"))
        assert worker.client_pid is None, "let go at once"
    await factory.until(lambda: len(factory.clients) == 2 and factory.last.alive and old.closed)
    assert factory.last.spec.resume


async def test_a_cut_without_a_live_process_starts_none(make_worker: MakeWorker) -> None:
    worker, factory = await make_worker()
    async with worker.exclusive():
        await within(worker.cut_conversation("prompt-x"))
    await asyncio.sleep(0.05)  # nothing to await for what must not happen
    assert factory.clients == []


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


async def _pending_cut(ledger: FlakyLedger, tmp_path: Path) -> tuple[str, Path, Anchor, list[str]]:
    """A session of two turns whose conversation was cut back to the first (pending in the ledger)."""
    sid = str(uuid.uuid4())
    cwd = tmp_path / "workspaces" / sid
    cwd.mkdir(parents=True)
    await ledger.add_session(NewSession(sid, str(cwd), {}, True))
    await ledger.touch_session(sid, started=True)
    ids = [str(uuid.uuid4()) for _ in range(4)]
    p1, a1, p2, a2 = ids
    path = transcript_path(tmp_path / "claude", str(cwd), sid)
    _append(path, _prompt_entry(p1, None, "one"), _reply_entry(a1, p1, "1"))
    _append(path, _prompt_entry(p2, a1, "two"), _reply_entry(a2, p2, "2"))
    anchor = Anchor(sid, a1, p2, path.stat().st_size, None, "rewind-1")
    await _cut_recorded(ledger, sid, anchor)
    return sid, path, anchor, ids


async def test_8_the_cut_is_let_go_only_after_the_transcript_holding_it_is_fsynced(
    make_worker: MakeWorker, ledger: FlakyLedger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger's cut is what keeps a rewind durable until the transcript itself holds it on
    disk: clearing it before the transcript's fsync, a crash could bring the dropped turn back."""
    sid, path, _anchor, _ = await _pending_cut(ledger, tmp_path)
    # What happened to the transcript, in order: each fsync with the size it made durable.
    order: list[tuple[str, int]] = []
    real_fsync, real_clear = os.fsync, ledger.clear_anchor

    def fsync(fd: int) -> None:
        if os.path.realpath(f"/proc/self/fd/{fd}") == str(path):
            order.append(("fsync", os.fstat(fd).st_size))
        real_fsync(fd)

    async def clear(session_id: str, anchor_uuid: str) -> None:
        order.append(("clear cut", path.stat().st_size))
        await real_clear(session_id, anchor_uuid)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(ledger, "clear_anchor", clear)
    worker, _ = await make_worker(session_id=sid)
    await collect(await within(worker.start_turn("three")))
    await worker.view()
    assert await ledger.anchor(sid) is None
    (cleared,) = [i for i, (what, _) in enumerate(order) if what == "clear cut"]
    size = order[cleared][1]
    assert ("fsync", size) in order[:cleared], (
        f"the transcript as it holds the cut was fsynced first: {order}"
    )


async def test_9_the_cut_stays_until_a_whole_new_turn_is_written_past_it(
    make_worker: MakeWorker, ledger: FlakyLedger, tmp_path: Path
) -> None:
    """Bookkeeping the CLI writes on resume, even a prompt without its turn, does not put the cut
    in the transcript: only a new turn's prompt chained through the anchor does."""
    sid, path, anchor, (_p1, a1, p2, _a2) = await _pending_cut(ledger, tmp_path)
    worker, _ = await make_worker(session_id=sid)
    # Entries appended after the cut that are not a turn: a last-prompt record, an attachment.
    _append(path, {"type": "last-prompt", "leafUuid": a1, "sessionId": sid})
    _append(path, {"type": "attachment", "uuid": str(uuid.uuid4()), "parentUuid": a1, "sessionId": sid})
    assert (await worker.view()).last_message_id == a1
    assert await ledger.anchor(sid) == anchor, "no new turn yet: the cut stays in the ledger"
    # The dropped prompt written again past the cut (a resumed CLI replaying it) is not a new turn.
    _append(path, _prompt_entry(p2, a1, "two"))
    await worker.view()
    assert await ledger.anchor(sid) == anchor
    # A new turn's prompt chained through the anchor is.
    p3 = str(uuid.uuid4())
    _append(path, _prompt_entry(p3, a1, "three"), _reply_entry(str(uuid.uuid4()), p3, "3"))
    assert [p.text for p in (await worker.view()).points] == ["one", "three"]
    assert await ledger.anchor(sid) is None


async def test_a_cut_is_let_go_once_a_new_prompt_alone_is_written_past_it(
    make_worker: MakeWorker, ledger: FlakyLedger, tmp_path: Path
) -> None:
    """The CLI writes a turn's prompt before its answer: that prompt, chained through the anchor
    and the first entry past the cut, already puts the cut in the transcript."""
    sid, path, _anchor, (_p1, a1, _p2, _a2) = await _pending_cut(ledger, tmp_path)
    worker, _ = await make_worker(session_id=sid)
    p3 = str(uuid.uuid4())
    _append(path, _prompt_entry(p3, a1, "three"))
    assert [p.text for p in (await worker.view()).points] == ["one", "three"]
    assert await ledger.anchor(sid) is None


async def test_a_prompt_past_the_cut_that_does_not_continue_from_its_anchor_leaves_the_cut(
    make_worker: MakeWorker, ledger: FlakyLedger, tmp_path: Path
) -> None:
    """A new conversation root written past the cut does not hold the cut: the ledger keeps it."""
    sid, path, anchor, (_p1, a1, _p2, _a2) = await _pending_cut(ledger, tmp_path)
    worker, _ = await make_worker(session_id=sid)
    root = str(uuid.uuid4())
    _append(path, _prompt_entry(root, None, "elsewhere"), _reply_entry(str(uuid.uuid4()), root, "x"))
    assert (await worker.view()).last_message_id == a1
    assert await ledger.anchor(sid) == anchor


async def test_a_transcript_the_cli_writes_under_a_directory_of_its_own_is_found_later(
    make_worker: MakeWorker, tmp_path: Path
) -> None:
    """Looked for before the CLI wrote it (under a name of its own for a long project path),
    the transcript is found once it exists."""
    worker, _ = await make_worker()
    assert len((await worker.view()).points) == 0
    computed = worker.transcript_file
    assert not computed.exists()
    path = tmp_path / "claude" / "projects" / "shortened-by-the-cli" / f"{worker.session_id}.jsonl"
    _append(path, _prompt_entry(str(uuid.uuid4()), None, "hello"))
    assert [p.text for p in (await worker.view()).points] == ["hello"]
    assert worker.transcript_file == path != computed


def _reads_in_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records what runs in a thread (asyncio.to_thread) from here on."""
    calls: list[str] = []
    real_to_thread = asyncio.to_thread

    async def spy(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        calls.append(getattr(fn, "__name__", repr(fn)))
        return await real_to_thread(fn, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", spy)
    return calls


async def test_a_small_append_to_a_large_transcript_already_read_is_read_inline(
    make_worker: MakeWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What decides is the unread part, not the file's size."""
    import agent_rewind.sessions.view as worker_module

    worker, _ = await make_worker()
    path = transcript_path(worker._ctx.claude_config_dir, worker.record.cwd, worker.session_id)
    _append(path, *(_prompt_entry(str(uuid.uuid4()), None, f"prompt {i}") for i in range(4)))
    calls = _reads_in_threads(monkeypatch)
    monkeypatch.setattr(worker_module, "READ_INLINE_BYTES", path.stat().st_size // 2)
    assert len((await worker.view()).points) == 1
    assert calls.count("refresh") == 1, "the large first read ran in a thread"
    _append(path, _prompt_entry(str(uuid.uuid4()), None, "small"))
    assert [p.text for p in (await worker.view()).points] == ["small"]
    assert calls.count("refresh") == 1, "the small append was read inline"


async def test_an_unread_part_of_exactly_the_inline_bound_is_read_inline(
    make_worker: MakeWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agent_rewind.sessions.view as worker_module

    worker, _ = await make_worker()
    path = transcript_path(worker._ctx.claude_config_dir, worker.record.cwd, worker.session_id)
    _append(path, _prompt_entry(str(uuid.uuid4()), None, "hello"))
    calls = _reads_in_threads(monkeypatch)
    monkeypatch.setattr(worker_module, "READ_INLINE_BYTES", path.stat().st_size)
    assert len((await worker.view()).points) == 1
    assert "refresh" not in calls


async def test_the_transcript_accessors_read_what_the_last_view_caught_up_with(
    make_worker: MakeWorker,
) -> None:
    worker, _ = await make_worker()
    await collect(await within(worker.start_turn("one")))
    await collect(await within(worker.start_turn("two")))
    reading = await worker.transcript()
    view = reading.view
    first = view.points[0]
    assert reading.index.size == worker.transcript_file.stat().st_size > 0
    assert worker.transcript_view().leaf == view.leaf == reading.index.view().leaf
    at_first = worker.view_at(first.message_id)
    assert [p.text for p in at_first.points] == ["one"]
    assert at_first.leaf == first.message_id


async def test_a_worker_tells_its_replica_and_its_file_history(
    make_worker: MakeWorker, tmp_path: Path
) -> None:
    worker, _ = await make_worker(replica_id="replica-b")
    assert worker.replica == "replica-b"
    assert worker.file_history == tmp_path / "claude" / "file-history" / worker.session_id


async def test_only_the_process_that_ran_the_newest_prompt_holds_its_checkpoint(
    make_worker: MakeWorker,
) -> None:
    worker, factory = await make_worker()
    assert not worker.holds_newest_checkpoint, "no prompt yet"
    await collect(await within(worker.start_turn("one")))
    assert worker.holds_newest_checkpoint
    await within(worker.hibernate())
    assert not worker.holds_newest_checkpoint, "no process"
    async with worker.exclusive():
        await worker.ensure_client()  # a new process (a rewind's): it has not run that prompt
    assert worker.process.alive and not worker.holds_newest_checkpoint
    await collect(await within(worker.start_turn("two")))
    assert worker.holds_newest_checkpoint and len(factory.clients) == 2


async def test_a_worker_context_is_shared_unchanged_and_off_by_default(
    tmp_path: Path, ledger: FlakyLedger
) -> None:
    """One context serves every worker: it cannot be changed, and project settings are off
    unless the operator turns them on."""
    ctx = WorkerContext(
        ledger=ledger,
        client_factory=FakeFactory(),
        cli_env=CLI_ENV,
        claude_config_dir=tmp_path / "claude",
        idle_timeout=0.0,
    )
    assert ctx.project_settings is False
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.idle_timeout = 1.0  # type: ignore[misc]


async def test_a_cut_that_fails_in_the_live_process_resumes_a_new_one(make_worker: MakeWorker) -> None:
    worker, factory = await make_worker()
    await collect(await within(worker.start_turn("first")))
    old = factory.last
    old.cut_error = AgentError("broken pipe")
    async with worker.exclusive():
        await within(worker.cut_conversation("prompt-x"))
        assert worker.client_pid is None, "let go at once"
    await factory.until(lambda: len(factory.clients) == 2 and factory.last.alive and old.closed)
    assert factory.last.spec.resume


async def test_an_undo_lets_the_live_process_go_and_resumes_a_new_one_in_the_background(
    make_worker: MakeWorker,
) -> None:
    worker, factory = await make_worker()
    await collect(await within(worker.start_turn("first")))
    old = factory.last
    async with worker.exclusive():
        worker.conversation_restored()
        assert worker.client_pid is None, "let go at once"
    await factory.until(lambda: len(factory.clients) == 2 and factory.last.alive and old.closed)
    assert factory.last.spec.resume


async def test_an_undo_without_a_live_process_starts_none(make_worker: MakeWorker) -> None:
    worker, factory = await make_worker()
    async with worker.exclusive():
        worker.conversation_restored()
    await asyncio.sleep(0.05)  # nothing to await for what must not happen
    assert factory.clients == []


async def test_a_session_closed_before_its_background_resume_runs_gets_no_process(
    make_worker: MakeWorker,
) -> None:
    worker, factory = await make_worker()
    await collect(await within(worker.start_turn("first")))
    factory.last.cut_answer = ConversationAnswer(False, "turn_running", "busy")
    async with worker.exclusive():
        await within(worker.cut_conversation("prompt-x"))
    await within(worker.close())  # before the background resume had the lock
    await within(asyncio.gather(*worker._background))
    assert len(factory.clients) == 1
    assert worker.state == State.CLOSED


async def test_rewind_files_gives_the_clis_answer_and_a_failure_lets_the_process_go(
    make_worker: MakeWorker,
) -> None:
    worker, factory = await make_worker()
    async with worker.exclusive():
        assert await worker.rewind_files("prompt-x", dry_run=True) == FilesAnswer(can_rewind=True)

        async def broken(message_id: str, *, dry_run: bool) -> FilesAnswer:
            raise AgentError("broken pipe")

        factory.last.rewind_files = broken  # type: ignore[method-assign]
        with pytest.raises(AgentUnavailable, match="broken pipe"):
            await worker.rewind_files("prompt-x", dry_run=False)
        assert worker.client_pid is None


async def _racing_for_one_request_id(
    ledger: FlakyLedger, monkeypatch: pytest.MonkeyPatch, workers: list[SessionWorker], request_id: str
) -> list[Turn | BaseException]:
    """Two prompts with one request id, both past their ledger lookup before either recorded it."""
    real = ledger.begin_request
    arrived: list[str] = []
    both, release = asyncio.Event(), asyncio.Event()

    async def begin_request(request: NewRequest, result: dict[str, Any]) -> None:
        arrived.append(request.session_id)
        if len(arrived) == len(workers):
            both.set()
        await release.wait()
        await real(request, result)

    monkeypatch.setattr(ledger, "begin_request", begin_request)
    racing = [asyncio.create_task(w.start_turn("hi", request_id)) for w in workers]
    await within(both.wait())
    release.set()
    return list(await within(asyncio.gather(*racing, return_exceptions=True)))


async def test_a_prompt_that_loses_a_request_id_to_another_session_leaves_its_session_free(
    make_worker: MakeWorker, ledger: FlakyLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    (first, _), (second, _) = await make_worker(), await make_worker()
    got = await _racing_for_one_request_id(ledger, monkeypatch, [first, second], str(uuid.uuid4()))
    winners = [g for g in got if isinstance(g, Turn)]
    losers = [w for w, g in zip((first, second), got, strict=True) if isinstance(g, RequestIdReused)]
    assert len(winners) == 1 and len(losers) == 1, got
    await collect(winners[0])
    loser = losers[0]
    assert not loser.turn_running and loser.state == State.HIBERNATED
    events = await collect(await within(loser.start_turn("mine", str(uuid.uuid4()))))
    assert isinstance(events[-1], ResultEvent)


async def test_a_retry_that_loses_the_race_for_its_request_id_is_turn_in_flight(
    make_worker: MakeWorker, ledger: FlakyLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same call twice at once (two workers of one session): one runs it, the other is
    TURN_IN_FLIGHT, not REQUEST_ID_REUSED, and claims nothing."""
    first, _ = await make_worker()
    twin, _ = await make_worker(session_id=first.session_id)
    got = await _racing_for_one_request_id(ledger, monkeypatch, [first, twin], str(uuid.uuid4()))
    winners = [g for g in got if isinstance(g, Turn)]
    losers = [w for w, g in zip((first, twin), got, strict=True) if isinstance(g, TurnInFlight)]
    assert len(winners) == 1 and len(losers) == 1, got
    await collect(winners[0])
    assert not losers[0].turn_running


async def test_the_32_newest_turns_are_re_attached_to_in_memory_older_ones_replayed(
    make_worker: MakeWorker,
) -> None:
    """A turn re-attached to in memory replays every event; one replayed from the ledger only its
    prompt and result."""
    worker, factory = await make_worker()
    ids = [str(uuid.uuid4()) for _ in range(33)]
    for i, request_id in enumerate(ids):
        await collect(await within(worker.start_turn(f"turn {i}", request_id)))
    oldest = await collect(await within(worker.start_turn("turn 0", ids[0])))
    assert kinds(oldest) == ["PromptEvent", "ResultEvent"], "replayed from the ledger"
    remembered = await collect(await within(worker.start_turn("turn 1", ids[1])))
    assert kinds(remembered) == ["PromptEvent", "AssistantEvent", "ResultEvent"], "re-attached to"
    assert len(factory.last.prompts) == 33, "nothing ran again"


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


async def test_an_idle_timeout_of_zero_never_hibernates(make_worker: MakeWorker) -> None:
    worker, factory = await make_worker(idle_timeout=0.0)
    await collect(await within(worker.start_turn("hi")))
    await asyncio.sleep(0.05)  # nothing to await for what must not happen
    assert factory.last.alive and worker.state == State.IDLE


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


# Workspace snapshots


@pytest.fixture
async def snapshots(tmp_path: Path, ledger: FlakyLedger) -> AsyncIterator[Snapshots]:
    found = Snapshots(tmp_path / "snapshots", ledger, Limits())
    yield found
    found.close()


async def _snapshotted_session(ledger: FlakyLedger, tmp_path: Path, on: bool = True) -> str:
    sid = str(uuid.uuid4())
    cwd = tmp_path / "workspaces" / sid
    cwd.mkdir(parents=True)
    (cwd / "notes.txt").write_text("hello")
    await ledger.add_session(NewSession(sid, str(cwd), {}, True, workspace_snapshots=on))
    return sid


async def test_without_snapshots_on_the_server_a_session_has_none(make_worker: MakeWorker) -> None:
    worker, _ = await make_worker()
    await collect(await within(worker.start_turn("hi")))
    assert await worker.snapshot_bytes() == 0
    assert await worker.snapshot_availability() == {}


async def test_a_turn_of_a_session_with_snapshots_is_snapshotted(
    make_worker: MakeWorker, ledger: FlakyLedger, tmp_path: Path, snapshots: Snapshots
) -> None:
    sid = await _snapshotted_session(ledger, tmp_path)
    worker, _ = await make_worker(session_id=sid, snapshots=snapshots)
    turn = await within(worker.start_turn("hi"))
    await collect(turn)
    assert await worker.snapshot_availability() == {turn.prompt_id: True}
    assert await worker.snapshot_bytes() > 0
    assert [r.kind for r in await ledger.snapshots(sid)] == ["turn_start", "turn_end"]


async def test_a_session_with_snapshots_off_is_not_snapshotted_on_a_server_with_them(
    make_worker: MakeWorker, ledger: FlakyLedger, tmp_path: Path, snapshots: Snapshots
) -> None:
    sid = await _snapshotted_session(ledger, tmp_path, on=False)
    worker, _ = await make_worker(session_id=sid, snapshots=snapshots)
    await collect(await within(worker.start_turn("hi")))
    assert await worker.snapshot_availability() == {}
    assert await ledger.snapshots(sid) == []


async def test_snapshot_retention_keeps_the_newest_turns_snapshots(
    make_worker: MakeWorker, ledger: FlakyLedger, tmp_path: Path, snapshots: Snapshots
) -> None:
    sid = await _snapshotted_session(ledger, tmp_path)
    worker, _ = await make_worker(session_id=sid, snapshots=snapshots, snapshot_retention=1)
    first = await within(worker.start_turn("one"))
    await collect(first)
    second = await within(worker.start_turn("two"))
    await collect(second)
    available = await worker.snapshot_availability()
    assert available.get(second.prompt_id) is True
    assert available.get(first.prompt_id) is not True


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
