"""SessionWorker with a fake AgentClient: locking, turns, client lifecycle, hibernation, shutdown.

No CLI process runs here. The fake client scripts a turn (a prompt, then an optional wait on a
gate, then an assistant message and a result) and records how the worker used it. The ledger is
a real one in tmp_path; the transcript lives under tmp_path and is absent unless a test writes it
(an absent transcript is an empty conversation).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from agent_rewind.errors import AgentUnavailable, ShuttingDown, TurnInFlight
from agent_rewind.sessions.adapter import AgentError, ClientSpec
from agent_rewind.sessions.events import (
    AssistantEvent,
    ConversationAnswer,
    FilesAnswer,
    PromptEvent,
    ResultEvent,
    TurnEvent,
)
from agent_rewind.sessions.turn import Turn
from agent_rewind.sessions.worker import SessionWorker, State, WorkerContext
from agent_rewind.store.ledger import Anchor, Ledger
from agent_rewind.transcript.paths import transcript_path

# Generous bound on anything that should happen "at once"; a hang fails instead of blocking.
SOON = 2.0


class FakeClient:
    """An AgentClient whose process is a few flags."""

    _next_pid = 1000

    def __init__(self, spec: ClientSpec) -> None:
        FakeClient._next_pid += 1
        self.spec = spec
        self._pid = FakeClient._next_pid
        self._alive = False
        self.started = False
        self.closed = False
        self.prompts: list[str] = []
        self.interrupts = 0
        # Behaviour knobs, set by a test (or the factory's setup) before use.
        self.start_error: AgentError | None = None
        self.start_gate: asyncio.Event | None = None
        self.turn_gate: asyncio.Event | None = None  # the turn waits here after its prompt
        self.turn_error: AgentError | None = None  # raised after the prompt (and the gate)
        self.turn_cancelled = False
        self.cut_answer = ConversationAnswer(True)  # what an in-place conversation cut answers
        self.cuts: list[tuple[str, str]] = []

    @property
    def alive(self) -> bool:
        return self._alive

    @property
    def pid(self) -> int | None:
        return self._pid if self.started else None

    def die(self) -> None:
        """The CLI process exits on its own."""
        self._alive = False

    async def start(self) -> None:
        if self.start_gate is not None:
            await self.start_gate.wait()
        if self.start_error is not None:
            raise self.start_error
        self.started = True
        self._alive = True

    async def send_prompt(self, text: str) -> None:
        if not self._alive:
            raise AgentError("not running")
        self.prompts.append(text)

    async def receive_turn(self) -> AsyncIterator[TurnEvent]:
        n = len(self.prompts)
        text = self.prompts[-1]
        yield PromptEvent(f"prompt-{self._pid}-{n}", text)
        try:
            if self.turn_gate is not None:
                await self.turn_gate.wait()
        except asyncio.CancelledError:
            self.turn_cancelled = True
            raise
        if self.turn_error is not None:
            raise self.turn_error
        yield AssistantEvent(f"assistant-{self._pid}-{n}", f"msg_{self._pid}_{n}", f"echo: {text}")
        yield ResultEvent("success", False, 1, 5, 0.0, f"echo: {text}", "end_turn")

    async def interrupt(self) -> None:
        self.interrupts += 1

    async def rewind_files(self, message_id: str, *, dry_run: bool) -> FilesAnswer:
        return FilesAnswer(can_rewind=True)

    async def rewind_conversation(self, target: str, newest_prompt: str) -> ConversationAnswer:
        self.cuts.append((target, newest_prompt))
        return self.cut_answer

    async def close(self) -> None:
        self.closed = True
        self._alive = False


class FakeFactory:
    """The WorkerContext.client_factory: records every spec and client it made."""

    def __init__(self, setup: Callable[[FakeClient], None] | None = None) -> None:
        self.setup = setup
        self.specs: list[ClientSpec] = []
        self.clients: list[FakeClient] = []

    def __call__(self, spec: ClientSpec) -> FakeClient:
        client = FakeClient(spec)
        if self.setup is not None:
            self.setup(client)
        self.specs.append(spec)
        self.clients.append(client)
        return client

    @property
    def last(self) -> FakeClient:
        return self.clients[-1]


MakeWorker = Callable[..., tuple[SessionWorker, FakeFactory]]
CLI_ENV = {"CLAUDE_CONFIG_DIR": "/state/claude", "HOME": "/state/home"}


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.sqlite3")


@pytest.fixture
async def make_worker(tmp_path: Path, ledger: Ledger) -> AsyncIterator[MakeWorker]:
    workers: list[SessionWorker] = []

    def make(
        *,
        options: dict[str, Any] | None = None,
        checkpointing: bool = True,
        idle_timeout: float = 0.0,
        factory: FakeFactory | None = None,
        session_id: str | None = None,
    ) -> tuple[SessionWorker, FakeFactory]:
        sid = session_id or str(uuid.uuid4())
        cwd = tmp_path / "workspaces" / sid
        cwd.mkdir(parents=True, exist_ok=True)
        if ledger.session(sid) is None:
            ledger.add_session(sid, str(cwd), options or {}, checkpointing, None)
        record = ledger.session(sid)
        assert record is not None
        factory = factory or FakeFactory()
        ctx = WorkerContext(
            ledger=ledger,
            client_factory=factory,
            cli_env=CLI_ENV,
            claude_config_dir=tmp_path / "claude",
            idle_timeout=idle_timeout,
        )
        worker = SessionWorker(record, ctx)
        workers.append(worker)
        return worker, factory

    yield make
    for worker in workers:
        await worker.shutdown(0)
    ledger.close()


async def within(awaitable: Awaitable[Any], seconds: float = SOON) -> Any:
    async with asyncio.timeout(seconds):
        return await awaitable


async def collect(turn: Turn) -> list[TurnEvent]:
    async def run() -> list[TurnEvent]:
        return [e async for e in turn.events()]

    result: list[TurnEvent] = await within(run())
    return result


async def eventually(condition: Callable[[], bool], seconds: float = SOON) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


async def sent(turn_or_awaitable: Awaitable[Turn]) -> Turn:
    """Accepts a prompt and waits until it reached the (fake) CLI."""
    turn = await within(turn_or_awaitable)
    await eventually(lambda: turn.sent or turn.done)
    return turn


def slow_start(start_gate: asyncio.Event, turn_gate: asyncio.Event | None = None) -> FakeFactory:
    """Clients whose start waits on `start_gate` (the CLI is still starting) and, if given,
    whose turn waits on `turn_gate` after its prompt."""

    def setup(client: FakeClient) -> None:
        client.start_gate = start_gate
        client.turn_gate = turn_gate

    return FakeFactory(setup)


def gated(gate: asyncio.Event) -> Callable[[FakeClient], None]:
    def setup(client: FakeClient) -> None:
        client.turn_gate = gate

    return setup


# Turns and the lock


async def test_start_turn_while_a_turn_runs_raises_turn_in_flight(make_worker: MakeWorker) -> None:
    gate = asyncio.Event()
    worker, factory = make_worker(factory=FakeFactory(gated(gate)))
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
    worker, _ = make_worker(factory=FakeFactory(gated(gate)))
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
    turn_gate = asyncio.Event()
    worker, _ = make_worker(factory=slow_start(start_gate, turn_gate))
    prompt = asyncio.create_task(worker.start_turn("hello"))
    await asyncio.sleep(0.05)  # the turn holds the lock, waiting for the CLI to start
    assert not (await prompt).sent

    refused_at_once = False
    entered = False
    try:
        async with asyncio.timeout(0.5), worker.exclusive():
            entered = True
    except TurnInFlight:
        refused_at_once = True
    except TimeoutError:
        refused_at_once = False
    finally:
        start_gate.set()
        turn_gate.set()
        turn = await within(prompt)
        await collect(turn)
    assert not entered
    assert refused_at_once, "exclusive() waited for the lock held by a starting prompt instead of refusing"


async def test_second_start_turn_while_the_first_is_still_starting_its_client_raises_turn_in_flight(
    make_worker: MakeWorker,
) -> None:
    """Same window as above, seen from a second Prompt: it is refused, not run after the first."""
    start_gate = asyncio.Event()
    turn_gate = asyncio.Event()
    worker, factory = make_worker(factory=slow_start(start_gate, turn_gate))
    first = asyncio.create_task(worker.start_turn("first"))
    await asyncio.sleep(0.05)
    second = asyncio.create_task(worker.start_turn("second"))
    await asyncio.sleep(0.05)
    start_gate.set()
    first_turn = await within(first)
    turn_gate.set()
    await collect(first_turn)
    outcome: BaseException | None = None
    try:
        await collect(await within(second))
    except TurnInFlight as err:
        outcome = err
    assert isinstance(outcome, TurnInFlight), (
        f"the second prompt was queued and ran after the first turn: {factory.last.prompts}"
    )


async def test_turn_runs_to_its_end_without_listeners_and_every_listener_replays_all_events(
    make_worker: MakeWorker,
) -> None:
    gate = asyncio.Event()
    worker, factory = make_worker(factory=FakeFactory(gated(gate)))
    turn = await within(worker.start_turn("hi"))

    # One listener hangs up after the first event, as a client that goes away would.
    early = turn.events()
    first = await within(anext(early))
    assert isinstance(first, PromptEvent)
    await early.aclose()

    gate.set()
    await within(turn.wait())  # nobody is reading, yet the turn ends
    assert turn.done
    assert worker.state == State.IDLE
    assert not worker.lock.locked()

    replay_a = await collect(turn)
    replay_b = await collect(turn)
    assert replay_a == replay_b
    assert [type(e) for e in replay_a] == [PromptEvent, AssistantEvent, ResultEvent]
    assert replay_a[0] == first
    assert turn.prompt_id == first.message_id
    assert factory.last.prompts == ["hi"]


async def test_listeners_attached_during_a_turn_all_see_every_event(make_worker: MakeWorker) -> None:
    gate = asyncio.Event()
    worker, _ = make_worker(factory=FakeFactory(gated(gate)))
    turn = await within(worker.start_turn("hi"))
    await asyncio.sleep(0.01)  # the prompt is published before the gate
    listeners = [asyncio.create_task(collect(turn)) for _ in range(3)]
    await asyncio.sleep(0.01)
    gate.set()
    results = await within(asyncio.gather(*listeners))
    assert all(len(r) == 3 for r in results)
    assert results[0] == results[1] == results[2]


async def test_turns_of_two_sessions_run_concurrently(make_worker: MakeWorker) -> None:
    never = asyncio.Event()
    slow, slow_factory = make_worker(factory=FakeFactory(gated(never)))
    fast, _ = make_worker()

    slow_turn = await within(slow.start_turn("takes forever"))
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


# The client


async def test_first_client_start_is_fresh_and_marks_the_session_started(
    make_worker: MakeWorker, ledger: Ledger
) -> None:
    worker, factory = make_worker()
    assert worker.state == State.HIBERNATED
    async with worker.exclusive():
        client = await worker.ensure_client()
    assert client is factory.last
    assert factory.specs[0].resume is False
    assert worker.state == State.IDLE
    record = ledger.session(worker.session_id)
    assert record is not None and record.started


async def test_ensure_client_reuses_a_live_client(make_worker: MakeWorker) -> None:
    worker, factory = make_worker()
    async with worker.exclusive():
        first = await worker.ensure_client()
        again = await worker.ensure_client()
    assert again is first
    assert len(factory.clients) == 1


async def test_dead_client_is_replaced_on_next_ensure_client_with_resume(make_worker: MakeWorker) -> None:
    worker, factory = make_worker()
    async with worker.exclusive():
        first = await worker.ensure_client()
    first.die()
    assert worker.state == State.HIBERNATED

    async with worker.exclusive():
        second = await worker.ensure_client()
    assert second is not first
    assert len(factory.clients) == 2
    assert factory.specs[1].resume is True
    assert factory.specs[1].session_id == worker.session_id
    assert first.closed
    assert worker.state == State.IDLE


async def test_prompt_after_the_process_died_resumes_in_a_new_client(make_worker: MakeWorker) -> None:
    worker, factory = make_worker()
    await collect(await within(worker.start_turn("one")))
    factory.last.die()

    events = await collect(await within(worker.start_turn("two")))
    assert isinstance(events[-1], ResultEvent)
    assert [s.resume for s in factory.specs] == [False, True]
    assert factory.clients[1].prompts == ["two"]


async def test_client_start_failure_raises_agent_unavailable(make_worker: MakeWorker, ledger: Ledger) -> None:
    def setup(client: FakeClient) -> None:
        client.start_error = AgentError("the Claude Code CLI did not start: boom")

    worker, _ = make_worker(factory=FakeFactory(setup))
    with pytest.raises(AgentUnavailable) as caught:
        async with worker.exclusive():
            await worker.ensure_client()
    assert "boom" in caught.value.message
    assert caught.value.metadata == {"session_id": worker.session_id}
    assert worker.state == State.HIBERNATED
    record = ledger.session(worker.session_id)
    assert record is not None and not record.started


async def test_start_turn_with_a_client_that_cannot_start_raises_and_releases_the_lock(
    make_worker: MakeWorker,
) -> None:
    fail = True

    def setup(client: FakeClient) -> None:
        if fail:
            client.start_error = AgentError("no cli")

    worker, _ = make_worker(factory=FakeFactory(setup))
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
    def setup(client: FakeClient) -> None:
        client.turn_error = AgentError("the Claude Code process exited during the turn")

    worker, factory = make_worker(factory=FakeFactory(setup))
    turn = await within(worker.start_turn("hi"))

    seen: list[TurnEvent] = []
    with pytest.raises(AgentUnavailable) as caught:
        async with asyncio.timeout(SOON):
            async for event in turn.events():
                seen.append(event)
    assert [type(e) for e in seen] == [PromptEvent]
    assert "exited during the turn" in caught.value.message
    assert turn.done
    assert worker.state == State.HIBERNATED
    assert not worker.lock.locked()
    await eventually(lambda: factory.clients[0].closed)
    # Every late listener sees the same ending.
    with pytest.raises(AgentUnavailable):
        await collect(turn)


# Hibernation, close, shutdown


async def test_idle_timeout_hibernates_and_closes_the_client(make_worker: MakeWorker) -> None:
    worker, factory = make_worker(idle_timeout=0.05)
    await collect(await within(worker.start_turn("hi")))
    client = factory.last
    await eventually(lambda: worker.state == State.HIBERNATED)
    await eventually(lambda: client.closed)
    assert not worker.record.closed

    # It comes back on demand, resuming the transcript.
    await collect(await within(worker.start_turn("again")))
    assert factory.specs[-1].resume is True


async def test_idle_timeout_does_not_hibernate_during_a_turn(make_worker: MakeWorker) -> None:
    gate = asyncio.Event()
    worker, factory = make_worker(idle_timeout=0.02, factory=FakeFactory(gated(gate)))
    async with worker.exclusive():
        await worker.ensure_client()  # arms the idle timer when the exclusive block ends
    turn = await within(worker.start_turn("long"))
    await asyncio.sleep(0.1)
    assert worker.state == State.RUNNING
    assert not factory.last.closed
    gate.set()
    await collect(turn)


async def test_close_sets_closed_and_closes_the_client(make_worker: MakeWorker, ledger: Ledger) -> None:
    worker, factory = make_worker()
    await collect(await within(worker.start_turn("hi")))
    client = factory.last

    await within(worker.close())
    assert worker.state == State.CLOSED
    assert client.closed
    record = ledger.session(worker.session_id)
    assert record is not None and record.closed


async def test_shutdown_waits_for_a_turn_that_ends_within_grace(make_worker: MakeWorker) -> None:
    gate = asyncio.Event()
    worker, factory = make_worker(factory=FakeFactory(gated(gate)))
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
    worker, factory = make_worker(factory=FakeFactory(gated(never)))
    turn = await sent(worker.start_turn("stuck"))

    started = time.monotonic()
    await within(worker.shutdown(0.2))
    elapsed = time.monotonic() - started
    assert elapsed >= 0.2  # it did wait for the grace period
    assert elapsed < 2.0
    assert factory.last.turn_cancelled
    assert factory.last.closed
    assert turn.done
    assert not worker.lock.locked()
    with pytest.raises(AgentUnavailable):
        await collect(turn)


async def test_after_shutdown_no_client_is_started(make_worker: MakeWorker) -> None:
    worker, factory = make_worker()
    await worker.shutdown(0)
    with pytest.raises(ShuttingDown):
        async with worker.exclusive():
            await worker.ensure_client()
    assert factory.clients == []


async def test_a_client_that_finishes_starting_after_shutdown_began_is_closed(
    make_worker: MakeWorker,
) -> None:
    start_gate = asyncio.Event()
    worker, factory = make_worker(factory=slow_start(start_gate))

    async def use() -> None:
        async with worker.exclusive():
            await worker.ensure_client()

    user = asyncio.create_task(use())
    await asyncio.sleep(0.05)  # the CLI is starting
    await within(worker.shutdown(0))
    start_gate.set()
    with pytest.raises(ShuttingDown):
        await within(user)
    assert factory.last.closed
    assert worker.client_pid is None


# The ClientSpec


async def test_client_spec_carries_stored_options_verbatim_and_checkpointing(
    make_worker: MakeWorker,
) -> None:
    options = {
        "model": "claude-test",
        "max_turns": 5.0,
        "allowed_tools": ["Read", "Bash"],
        "system_prompt": {"type": "preset", "preset": "claude_code", "append": "be brief"},
    }
    worker, factory = make_worker(options=options, checkpointing=False)
    async with worker.exclusive():
        await worker.ensure_client()
    spec = factory.specs[0]
    assert spec.options == options
    assert spec.checkpointing is False
    assert spec.session_id == worker.session_id
    assert spec.cwd == Path(worker.record.cwd)
    assert dict(spec.env) == CLI_ENV
    assert spec.resume is False
    assert spec.resume_session_at is None
    assert spec.resume_drops_turn is None


async def test_client_spec_keeps_checkpointing_on_when_stored(make_worker: MakeWorker) -> None:
    worker, factory = make_worker(checkpointing=True)
    async with worker.exclusive():
        await worker.ensure_client()
    assert factory.specs[0].checkpointing is True


def _write_transcript(config_dir: Path, cwd: str, session_id: str, entries: list[dict[str, Any]]) -> Path:
    path = transcript_path(config_dir, cwd, session_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))
    return path


def _prompt(uid: str, parent: str | None, text: str) -> dict[str, Any]:
    return {
        "type": "user",
        "uuid": uid,
        "parentUuid": parent,
        "isSidechain": False,
        "promptSource": "sdk",
        "message": {"role": "user", "content": text},
        "timestamp": "2026-11-29T23:27:38.962Z",
    }


def _reply(uid: str, parent: str, text: str) -> dict[str, Any]:
    return {
        "type": "assistant",
        "uuid": uid,
        "parentUuid": parent,
        "isSidechain": False,
        "message": {
            "id": f"msg_{uid[:8]}",
            "role": "assistant",
            "content": [{"type": "text", "text": text}],
        },
        "timestamp": "2026-11-29T23:27:39.030Z",
    }


async def test_client_spec_resumes_at_a_pending_ledger_anchor(
    make_worker: MakeWorker, ledger: Ledger, tmp_path: Path
) -> None:
    sid = str(uuid.uuid4())
    cwd = tmp_path / "workspaces" / sid
    ledger.add_session(sid, str(cwd), {"model": "m"}, True, None)
    ledger.touch_session(sid, started=True)
    p1, a1, p2, a2 = (str(uuid.uuid4()) for _ in range(4))
    path = _write_transcript(
        tmp_path / "claude",
        str(cwd),
        sid,
        [_prompt(p1, None, "one"), _reply(a1, p1, "1"), _prompt(p2, a1, "two"), _reply(a2, p2, "2")],
    )
    # A conversation rewind to "two": resume at its last entry before, dropping one turn.
    anchor = Anchor(sid, a1, p2, path.stat().st_size, p2, "rewind-1")
    ledger.begin_rewind(
        rewind_id="rewind-1",
        session_id=sid,
        request_id=None,
        fingerprint="fp",
        message_id=p2,
        mode="CONVERSATION",
        plan={},
        principal="",
    )
    ledger.complete_rewind("rewind-1", {"ok": True}, anchor)

    worker, factory = make_worker(session_id=sid)
    assert (await worker.view()).last_message_id == a1  # the cut shows before any client runs
    async with worker.exclusive():
        await worker.ensure_client()
    spec = factory.specs[0]
    assert spec.resume is True
    assert spec.resume_session_at == a1
    assert spec.resume_drops_turn == p2
    assert spec.options == {"model": "m"}
    assert ledger.anchor(sid) == anchor  # still pending: no new turn has written the cut yet


async def test_client_spec_without_drops_turn_when_the_anchor_has_none(
    make_worker: MakeWorker, ledger: Ledger, tmp_path: Path
) -> None:
    sid = str(uuid.uuid4())
    cwd = tmp_path / "workspaces" / sid
    ledger.add_session(sid, str(cwd), {}, True, None)
    ledger.touch_session(sid, started=True)
    p1, a1, p2, a2, p3, a3 = (str(uuid.uuid4()) for _ in range(6))
    path = _write_transcript(
        tmp_path / "claude",
        str(cwd),
        sid,
        [
            _prompt(p1, None, "one"),
            _reply(a1, p1, "1"),
            _prompt(p2, a1, "two"),
            _reply(a2, p2, "2"),
            _prompt(p3, a2, "three"),
            _reply(a3, p3, "3"),
        ],
    )
    ledger.begin_rewind(
        rewind_id="rewind-2",
        session_id=sid,
        request_id=None,
        fingerprint="fp",
        message_id=p2,
        mode="CONVERSATION",
        plan={},
        principal="",
    )
    ledger.complete_rewind("rewind-2", {}, Anchor(sid, a1, p2, path.stat().st_size, None, "rewind-2"))

    worker, factory = make_worker(session_id=sid)
    async with worker.exclusive():
        await worker.ensure_client()
    assert factory.specs[0].resume_session_at == a1
    assert factory.specs[0].resume_drops_turn is None


async def test_a_large_transcript_is_read_off_the_event_loop(
    make_worker: MakeWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long session's first read must not stall every other session on the loop."""
    import agent_rewind.sessions.worker as worker_module

    calls: list[object] = []
    real_to_thread = asyncio.to_thread

    async def spy(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        calls.append(fn)
        return await real_to_thread(fn, *args, **kwargs)

    monkeypatch.setattr(worker_module.asyncio, "to_thread", spy)
    monkeypatch.setattr(worker_module, "_READ_INLINE_BYTES", 10)
    worker, _factory = make_worker()
    path = transcript_path(worker._ctx.claude_config_dir, worker.record.cwd, worker.session_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "type": "user",
                "uuid": str(uuid.uuid4()),
                "parentUuid": None,
                "promptSource": "sdk",
                "message": {"role": "user", "content": "hello"},
                "timestamp": "2026-11-29T10:00:00Z",
            }
        )
        + "\n"
    )
    view = await worker.view()
    assert len(view.points) == 1
    assert calls, "the read ran in a thread"


async def test_interrupt_while_the_prompt_is_still_starting_its_client_stops_the_turn(
    make_worker: MakeWorker,
) -> None:
    start_gate = asyncio.Event()
    turn_gate = asyncio.Event()
    worker, factory = make_worker(factory=slow_start(start_gate, turn_gate))
    prompt = asyncio.create_task(worker.start_turn("hello"))
    await asyncio.sleep(0.05)
    assert worker.state == State.RUNNING and not (await prompt).sent
    await worker.interrupt()  # nothing to send it to yet
    start_gate.set()
    turn = await sent(prompt)
    assert factory.last.interrupts == 1, "the interrupt reached the CLI once the prompt was sent"
    assert turn.interrupted
    turn_gate.set()
    await collect(turn)


async def test_a_listener_gone_while_the_cli_starts_does_not_lose_the_prompt(make_worker: MakeWorker) -> None:
    start_gate = asyncio.Event()
    worker, factory = make_worker(factory=slow_start(start_gate))
    turn = await within(worker.start_turn("keep me"))

    async def listen() -> None:
        async for _ in turn.events():
            pass

    listener = asyncio.create_task(listen())
    await asyncio.sleep(0.05)
    listener.cancel()  # the RPC's caller hung up while the CLI was still starting
    start_gate.set()
    events = await collect(turn)
    assert factory.last.prompts == ["keep me"]
    assert isinstance(events[-1], ResultEvent)
    assert worker.state == State.IDLE


# Conversation cuts


async def test_a_cut_the_live_process_accepts_keeps_the_process(make_worker: MakeWorker) -> None:
    worker, factory = make_worker()
    await collect(await within(worker.start_turn("first")))
    client = factory.last
    async with worker.exclusive():
        await within(worker.cut_conversation("prompt-x"))
    assert [t for t, _ in client.cuts] == ["prompt-x"]
    assert worker.client_pid == client.pid and not client.closed
    assert len(factory.clients) == 1


async def test_a_cut_the_live_process_refuses_resumes_a_new_one_in_the_background(
    make_worker: MakeWorker,
) -> None:
    worker, factory = make_worker()
    await collect(await within(worker.start_turn("first")))
    old = factory.last
    old.cut_answer = ConversationAnswer(False, "turn_running", "busy")
    async with worker.exclusive():
        await within(worker.cut_conversation("prompt-x"))
        assert old.closed or worker.client_pid is None, "let go at once"
    await eventually(lambda: len(factory.clients) == 2 and factory.last.alive)
    assert factory.last.spec.resume


async def test_a_cut_without_a_live_process_starts_none(make_worker: MakeWorker) -> None:
    worker, factory = make_worker()
    async with worker.exclusive():
        await within(worker.cut_conversation("prompt-x"))
    await asyncio.sleep(0.05)
    assert factory.clients == []
