"""A Prompt's request id (sessions/running.py, keeping the retry rule of agent_rewind/retries.py;
a turn replayed through sessions/turns.py): a retry re-attaches to its turn, or after a restart
gets it replayed from the ledger; other text under the same id is REQUEST_ID_REUSED; a turn a dead
server left half done is run again only if its prompt never reached the transcript; two prompts
racing for one id leave the loser's session free.

The harness (a fake client, a ledger that fails on demand) is in harness.py and conftest.py.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from agent_rewind.errors import AgentRewindError, AgentUnavailable, RequestIdReused, TurnInFlight
from agent_rewind.sessions.adapter import AgentError
from agent_rewind.sessions.turn_events import PromptEvent, ResultEvent, TurnEvent
from agent_rewind.sessions.turns import Turn
from agent_rewind.sessions.worker import SessionWorker, State
from agent_rewind.store.ledger import NewRequest, RequestRecord
from agent_rewind.testing.fake_agent import FakeClient, FakeFactory
from tests.unit.sessions.harness import FlakyLedger, MakeWorker, collect, kinds, sent, setup, within

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


# What a dead server left


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


# Two prompts racing for one request id


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
