"""SessionWorker (sessions/worker.py), the facade over a session's parts: its lock held for
exclusive work (a rewind), refused at once while a turn holds the session and never shared between
sessions; what it tells of itself (its replica, its file history, the transcript the last view
caught up with, whether its process holds the newest checkpoint); the context every worker shares.

The harness (a fake client, a ledger that fails on demand) is in harness.py and conftest.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from agent_rewind.errors import TurnInFlight
from agent_rewind.sessions.turn_events import ResultEvent
from agent_rewind.sessions.worker import State, WorkerContext
from agent_rewind.testing.fake_agent import FakeFactory
from tests.unit.sessions.harness import CLI_ENV, SOON, FlakyLedger, MakeWorker, collect, sent, setup, within

# Exclusive work (a rewind) and the lock


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


# What the worker tells of itself


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
