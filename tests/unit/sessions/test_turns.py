"""A turn's event log (sessions/turns.py): replayed from the start to every listener, ended with
its error, kept in the ledger as a record a retry after a restart is replayed from."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from agent_rewind.errors import AgentRewindError, AgentUnavailable
from agent_rewind.sessions.turn_events import AssistantEvent, PromptEvent, ResultEvent, TurnEvent
from agent_rewind.sessions.turns import Turn

SID = "0b7f3c1e-5a8d-4d6e-9f10-2a3b4c5d6e7f"
RESULT = ResultEvent("success", False, 2, 1200, 0.25, "done", "end_turn", interrupted=True)


async def collect(turn: Turn) -> list[TurnEvent]:
    async with asyncio.timeout(2.0):
        return [e async for e in turn.events()]


def test_each_turn_chooses_its_own_prompt_id() -> None:
    first, second = Turn(SID, "a"), Turn(SID, "a")
    assert str(uuid.UUID(first.prompt_id)) == first.prompt_id
    assert first.prompt_id != second.prompt_id
    assert not first.sent and not first.done and first.result is None and first.error is None


async def test_listeners_get_every_event_from_the_start_and_wait_for_more() -> None:
    turn = Turn(SID, "hi")
    await turn.publish(PromptEvent(turn.prompt_id, "hi"))
    early = asyncio.create_task(collect(turn))
    await turn.publish(AssistantEvent("a-1", "msg_1", "hello"))
    await asyncio.sleep(0)
    assert not early.done(), "a listener waits for the turn's end"
    await turn.publish(RESULT)
    await turn.finish()
    late = await collect(turn)
    assert await early == late
    assert [type(e) for e in late] == [PromptEvent, AssistantEvent, ResultEvent]
    assert turn.done and turn.result == RESULT
    await asyncio.wait_for(turn.wait(), 1.0)


async def test_a_turns_error_is_raised_after_its_events_to_every_listener() -> None:
    turn = Turn(SID, "hi")
    await turn.publish(PromptEvent(turn.prompt_id, "hi"))
    died = AgentUnavailable(SID, "the process died")
    await turn.finish(died)
    assert turn.error is died
    for _ in range(2):
        seen: list[TurnEvent] = []
        with pytest.raises(AgentUnavailable):
            async for event in turn.events():
                seen.append(event)
        assert seen == [PromptEvent(turn.prompt_id, "hi")]
    assert turn.result is None


async def test_the_record_of_a_turn_that_ran() -> None:
    turn = Turn(SID, "hi", request_id="r-1")
    turn.sent = True
    await turn.publish(PromptEvent(turn.prompt_id, "hi"))
    await turn.publish(RESULT)
    await turn.finish()
    assert turn.record() == {
        "prompt_id": turn.prompt_id,
        "result": {
            "subtype": "success",
            "is_error": False,
            "num_turns": 2,
            "duration_ms": 1200,
            "total_cost_usd": 0.25,
            "result": "done",
            "stop_reason": "end_turn",
            "interrupted": True,
        },
    }


async def test_the_record_of_a_turn_whose_prompt_never_reached_the_cli() -> None:
    turn = Turn(SID, "hi", request_id="r-1")
    await turn.finish(AgentUnavailable(SID, "no cli"))
    record = turn.record()
    assert record["prompt_id"] == ""
    assert record["error"] == {
        "reason": "AGENT_UNAVAILABLE",
        "message": AgentUnavailable(SID, "no cli").message,
        "metadata": {"session_id": SID},
    }
    assert "result" not in record


async def test_a_replayed_turn_tells_what_the_record_says() -> None:
    ran = Turn(SID, "hi", request_id="r-1")
    ran.sent = True
    await ran.publish(PromptEvent(ran.prompt_id, "hi"))
    await ran.publish(AssistantEvent("a-1", "msg_1", "hello"))
    await ran.publish(RESULT)
    await ran.finish()

    replayed = await Turn.replayed(SID, "hi", "r-1", ran.record())
    assert replayed.done and replayed.sent
    assert replayed.prompt_id == ran.prompt_id and replayed.request_id == "r-1"
    assert await collect(replayed) == [PromptEvent(ran.prompt_id, "hi"), RESULT]


async def test_a_replayed_failure_keeps_its_reason() -> None:
    failed = Turn(SID, "hi", request_id="r-1")
    await failed.finish(AgentUnavailable(SID, "no cli"))
    replayed = await Turn.replayed(SID, "hi", "r-1", failed.record())
    assert not replayed.sent
    with pytest.raises(AgentRewindError) as caught:
        await collect(replayed)
    assert caught.value.reason == "AGENT_UNAVAILABLE"
    assert caught.value.message == AgentUnavailable(SID, "no cli").message


async def test_a_replayed_error_keeps_its_metadata() -> None:
    failed = Turn(SID, "hi", request_id="r-1")
    await failed.finish(AgentUnavailable(SID, "no cli"))
    replayed = await Turn.replayed(SID, "hi", "r-1", failed.record())
    with pytest.raises(AgentRewindError) as caught:
        [e async for e in replayed.events()]
    assert (caught.value.reason, caught.value.metadata) == ("AGENT_UNAVAILABLE", {"session_id": SID})


async def test_a_replayed_error_without_its_details_is_internal_with_an_empty_message() -> None:
    """A record missing what an error needs (an older or damaged row) still ends the replay with
    an error, never a success."""
    replayed = await Turn.replayed(SID, "hi", "r-1", {"prompt_id": "", "error": {}})
    with pytest.raises(AgentRewindError) as caught:
        await collect(replayed)
    assert (caught.value.reason, caught.value.message, caught.value.metadata) == ("INTERNAL", "", {})


async def test_a_replayed_errors_metadata_is_strings_and_only_from_a_mapping() -> None:
    record: dict[str, Any] = {"error": {"reason": "QUOTA_EXCEEDED", "message": "m", "metadata": {"turns": 3}}}
    replayed = await Turn.replayed(SID, "hi", "r-1", record)
    with pytest.raises(AgentRewindError) as caught:
        await collect(replayed)
    assert caught.value.metadata == {"turns": "3"}

    record = {"error": {"reason": "QUOTA_EXCEEDED", "message": "m", "metadata": ["turns", 3]}}
    replayed = await Turn.replayed(SID, "hi", "r-1", record)
    with pytest.raises(AgentRewindError) as caught:
        await collect(replayed)
    assert caught.value.metadata == {}


async def test_a_replayed_record_without_a_prompt_or_a_result_has_no_events() -> None:
    replayed = await Turn.replayed(SID, "hi", "r-1", {"prompt_id": None, "result": None})
    assert replayed.done and not replayed.sent and replayed.prompt_id == ""
    assert await collect(replayed) == []
    assert replayed.result is None and replayed.error is None


async def test_the_record_of_a_turn_that_ended_with_a_result_and_an_error_keeps_both() -> None:
    turn = Turn(SID, "hi", request_id="r-1")
    turn.sent = True
    await turn.publish(PromptEvent(turn.prompt_id, "hi"))
    await turn.publish(RESULT)
    await turn.finish(AgentUnavailable(SID, "recorded late"))
    record = turn.record()
    assert record["result"]["result"] == "done"
    assert record["error"]["reason"] == "AGENT_UNAVAILABLE"
    replayed = await Turn.replayed(SID, "hi", "r-1", record)
    seen: list[TurnEvent] = []
    with pytest.raises(AgentRewindError):
        async for event in replayed.events():
            seen.append(event)
    assert seen == [PromptEvent(turn.prompt_id, "hi"), RESULT]


async def test_a_turns_result_is_its_last_event_only_when_that_is_a_result() -> None:
    turn = Turn(SID, "hi")
    await turn.publish(RESULT)
    assert turn.result == RESULT
    await turn.publish(AssistantEvent("a-2", "msg_2", "after"))
    assert turn.result is None


async def test_a_listener_reading_during_a_turn_gets_each_event_once_in_order() -> None:
    turn = Turn(SID, "hi")
    events = turn.events()
    await turn.publish(PromptEvent(turn.prompt_id, "hi"))
    assert await asyncio.wait_for(anext(events), 1.0) == PromptEvent(turn.prompt_id, "hi")
    first, second = AssistantEvent("a-1", "msg_1", "one"), AssistantEvent("a-2", "msg_2", "two")
    await turn.publish(first)
    await turn.publish(second)
    assert await asyncio.wait_for(anext(events), 1.0) == first
    assert await asyncio.wait_for(anext(events), 1.0) == second
    await turn.finish()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(events), 1.0)
