"""The rewind engine's bookkeeping with a fake CLI: intents, failures, pending intents and recovery.

The real CLI proves the rewinds themselves (tests/integration/test_rewind.py); here a small fake
answers rewind_files so failures can be provoked exactly where they hurt (tests/unit/rewind/fakes.py).
The transcript is written by the test, the ledger is a real SQLite one in tmp_path.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import asdict

import pytest

from agent_rewind.errors import (
    AgentRewindError,
    AgentUnavailable,
    FileCheckpointUnavailable,
    RequestIdReused,
    RewindConflict,
)
from agent_rewind.metrics import REGISTRY
from agent_rewind.rewind.outcome import ConversationHalf, FilesHalf, Mode, RewindOutcome
from agent_rewind.rewind.workspace import OVERWRITE, SKIP
from agent_rewind.sessions.turn_events import ResultEvent
from agent_rewind.store.ledger import Anchor, NewRewind
from tests.unit.rewind.fakes import SOON, MakeSetup, crash_once, within

# Applying


async def test_a_rewind_of_both_halves(make_setup: MakeSetup) -> None:
    s = await make_setup()
    one = s.turn("one")
    first_reply = s.last
    two = s.turn("two")
    s.turn("three")
    outcome = await within(s.engine.rewind(s.worker, s.request(two, Mode.BOTH)))
    assert outcome.last_message_id == first_reply
    assert outcome.files.can_rewind and outcome.files.files_changed == ("a.txt",)
    assert outcome.files.skipped_links == 2, "the restore's own answer"
    assert outcome.conversation == ConversationHalf(True, True, True, 4)
    assert s.knobs.applied == [two]
    assert await s.pending() == []
    anchor = await s.ledger.anchor(s.sid)
    assert anchor is not None and anchor.target_message_id == two
    assert await s.texts() == ["one"]
    assert (await s.worker.view()).points[0].message_id == one
    assert s.clients[-1].cuts == [two], "the live process is cut too"
    record = await s.ledger.rewind(outcome.rewind_id)
    assert record is not None and record.state == "applied" and record.files_applied


async def test_a_dry_run_applies_nothing(make_setup: MakeSetup) -> None:
    s = await make_setup()
    s.turn("one")
    first_reply = s.last
    two = s.turn("two")
    outcome = await within(s.engine.dry_run(s.worker, s.request(two, Mode.BOTH)))
    assert outcome.rewind_id == ""
    assert outcome.files.requested and outcome.files.can_rewind and outcome.files.source == "checkpoint"
    assert outcome.conversation == ConversationHalf(True, True, False, 2)
    assert outcome.last_message_id == first_reply, "what the conversation would end at"
    assert s.knobs.applied == [] and await s.ledger.rewinds(s.sid) == []
    assert await s.ledger.anchor(s.sid) is None
    assert await s.texts() == ["one", "two"]


async def test_a_files_restore_that_fails_once_is_asked_again_in_a_new_process(make_setup: MakeSetup) -> None:
    """The process failed mid-request: whether it restored is unknown, and restoring is idempotent."""
    s = await make_setup()
    s.turn("one")
    two = s.turn("two")
    s.turn("three")
    s.knobs.apply_failures = 1
    outcome = await within(s.engine.rewind(s.worker, s.request(two, Mode.BOTH)))
    assert outcome.conversation.rewound
    assert s.knobs.log[:3] == [f"restore {two}", f"restore {two}", f"restored {two}"]
    assert len(s.clients) == 2 and s.clients[0].closed and s.clients[1].alive
    assert s.knobs.applied == [two]
    assert await s.pending() == []
    assert await s.texts() == ["one"]


async def test_a_files_restore_that_fails_twice_leaves_the_intent_pending(make_setup: MakeSetup) -> None:
    s = await make_setup()
    s.turn("one")
    two = s.turn("two")
    s.turn("three")
    s.knobs.apply_failures = 2
    with pytest.raises(AgentUnavailable):
        await within(s.engine.rewind(s.worker, s.request(two, Mode.BOTH)))
    [pending] = await s.pending()
    assert pending.plan["target"] == two and not pending.files_applied
    assert s.knobs.applied == []
    assert await s.ledger.anchor(s.sid) is None
    assert await s.texts() == ["one", "two", "three"], "the cut waits for the files"
    assert not s.worker.lock.locked()

    # Finished before anything else happens on the session.
    await s.resolve()
    assert s.knobs.applied == [two]
    assert await s.pending() == []
    record = await s.ledger.rewind(pending.rewind_id)
    assert record is not None and record.state == "applied"
    assert await s.texts() == ["one"]


async def test_a_retry_of_a_rewind_left_pending_gets_it_finished(make_setup: MakeSetup) -> None:
    s = await make_setup()
    s.turn("one")
    two = s.turn("two")
    s.knobs.apply_failures = 2
    request = s.request(two, Mode.BOTH, request_id=str(uuid.uuid4()))
    with pytest.raises(AgentUnavailable):
        await within(s.engine.rewind(s.worker, request))
    [pending] = await s.pending()

    outcome = await within(s.engine.rewind(s.worker, request))
    assert outcome.rewind_id == pending.rewind_id, "the same rewind, not a second one"
    assert s.knobs.applied == [two]
    assert [r.rewind_id for r in await s.ledger.rewinds(s.sid)] == [pending.rewind_id]
    # Once applied, a retry gets the result whatever the session does now.
    again = await within(s.engine.rewind(s.worker, request))
    assert again == outcome
    assert s.knobs.applied == [two]


async def test_a_definite_refusal_at_restore_abandons_the_intent(make_setup: MakeSetup) -> None:
    s = await make_setup()
    s.turn("one")
    two = s.turn("two")
    s.knobs.refuse_apply = True
    request = s.request(two, Mode.BOTH, request_id=str(uuid.uuid4()))
    with pytest.raises(FileCheckpointUnavailable) as caught:
        await within(s.engine.rewind(s.worker, request))
    assert caught.value.metadata["message_id"] == two
    assert "No file checkpoint found for this message" in caught.value.message, "the CLI's own word"
    assert await s.ledger.rewinds(s.sid) == [], "nothing was applied: nothing recorded"
    assert await s.ledger.request(request.request_id or "") is None, "a retry plans anew"
    assert await s.ledger.anchor(s.sid) is None
    assert await s.texts() == ["one", "two"]


async def test_a_caller_cancelled_mid_apply_does_not_stop_the_rewind(make_setup: MakeSetup) -> None:
    """The files may already be restored: the rewind is finished, and a retry gets its result."""
    s = await make_setup()
    s.turn("one")
    two = s.turn("two")
    s.knobs.apply_gate = asyncio.Event()
    caller = asyncio.create_task(s.engine.rewind(s.worker, s.request(two, Mode.BOTH)))
    await within(s.knobs.apply_entered.wait())
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await within(caller)
    [pending] = await s.pending()

    s.knobs.apply_gate.set()
    async with asyncio.timeout(SOON), s.worker.lock:  # the rewind holds it until it is done
        pass
    assert s.knobs.applied == [two]
    assert await s.pending() == []
    record = await s.ledger.rewind(pending.rewind_id)
    assert record is not None and record.state == "applied"
    assert await s.texts() == ["one"]


# Pending intents


async def test_an_intent_records_what_it_was_planned_against(
    make_setup: MakeSetup, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = await make_setup()
    s.turn("one")
    first_reply = s.last
    two = s.turn("two")
    size = s.path.stat().st_size
    crash_once(monkeypatch, s.ledger, "complete_rewind")
    with pytest.raises(RuntimeError):
        await within(s.engine.rewind(s.worker, s.request(two, Mode.CONVERSATION)))
    [pending] = await s.pending()
    assert pending.plan["planned_last_message_id"] == s.last
    assert pending.plan["planned_transcript_size"] == size
    assert pending.plan["anchor"]["anchor_uuid"] == first_reply
    assert pending.plan["anchor"]["target_message_id"] == two


async def test_a_pending_intent_the_conversation_moved_past_is_dropped_not_finished(
    make_setup: MakeSetup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cutting now would drop a turn nobody asked to drop."""
    s = await make_setup()
    s.turn("one")
    two = s.turn("two")
    request = s.request(two, Mode.CONVERSATION, request_id=str(uuid.uuid4()))
    crash_once(monkeypatch, s.ledger, "complete_rewind")
    with pytest.raises(RuntimeError):
        await within(s.engine.rewind(s.worker, request))
    [pending] = await s.pending()
    s.turn("three")  # written after the intent (a process that outlived the server, say)

    await s.resolve()
    assert await s.pending() == []
    assert await s.ledger.rewind(pending.rewind_id) is None, "dropped, not marked applied"
    assert await s.ledger.request(request.request_id or "") is None, "a retry plans anew"
    assert await s.ledger.anchor(s.sid) is None
    assert await s.texts() == ["one", "two", "three"]
    assert all(c.cuts == [] for c in s.clients)


async def test_a_pending_intent_still_current_is_finished(
    make_setup: MakeSetup, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = await make_setup()
    s.turn("one")
    two = s.turn("two")
    crash_once(monkeypatch, s.ledger, "complete_rewind")
    with pytest.raises(RuntimeError):
        await within(s.engine.rewind(s.worker, s.request(two, Mode.CONVERSATION)))
    [pending] = await s.pending()
    await s.resolve()
    record = await s.ledger.rewind(pending.rewind_id)
    assert record is not None and record.state == "applied"
    assert await s.texts() == ["one"]


async def test_a_pending_intent_the_conversation_moved_past_restores_no_files(make_setup: MakeSetup) -> None:
    s = await make_setup()
    s.turn("one")
    two = s.turn("two")
    s.knobs.apply_failures = 2
    with pytest.raises(AgentUnavailable):
        await within(s.engine.rewind(s.worker, s.request(two, Mode.BOTH)))
    assert len(await s.pending()) == 1
    s.turn("three")
    await s.resolve()
    assert await s.pending() == []
    assert s.knobs.applied == [], "files restored for a rewind that was then dropped"


async def test_a_turn_runs_only_after_the_pending_rewind_is_finished(make_setup: MakeSetup) -> None:
    s = await make_setup()
    s.turn("one")
    two = s.turn("two")
    s.knobs.apply_failures = 2
    with pytest.raises(AgentUnavailable):
        await within(s.engine.rewind(s.worker, s.request(two, Mode.BOTH)))

    turn = await within(s.worker.start_turn("four"))
    events = [e async for e in turn.events()]
    assert isinstance(events[-1], ResultEvent)
    assert s.knobs.log.index(f"restored {two}") < s.knobs.log.index("prompt four")
    assert await s.pending() == []
    assert s.knobs.applied == [two]
    # The prompt went to the conversation as cut; written there, the cut leaves the ledger.
    assert await s.texts() == ["one", "four"]
    assert await s.ledger.anchor(s.sid) is None


async def test_a_turn_does_not_run_on_a_rewind_that_still_cannot_finish(make_setup: MakeSetup) -> None:
    s = await make_setup()
    s.turn("one")
    two = s.turn("two")
    s.knobs.apply_failures = 4  # two for the rewind, two for the try before the prompt
    with pytest.raises(AgentUnavailable):
        await within(s.engine.rewind(s.worker, s.request(two, Mode.BOTH)))

    turn = await within(s.worker.start_turn("four"))
    with pytest.raises(AgentUnavailable):
        async with asyncio.timeout(SOON):
            async for _ in turn.events():
                pass
    assert not turn.sent
    assert "prompt four" not in s.knobs.log
    assert len(await s.pending()) == 1
    assert not s.worker.lock.locked() and not s.worker.turn_running


async def test_a_recorded_files_half_is_finished_not_redone(
    make_setup: MakeSetup, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = await make_setup()
    s.turn("one")
    two = s.turn("two")
    crash_once(monkeypatch, s.ledger, "complete_rewind")
    with pytest.raises(RuntimeError):
        await within(s.engine.rewind(s.worker, s.request(two, Mode.BOTH)))
    [pending] = await s.pending()
    assert pending.files_applied
    assert s.knobs.applied == [two]

    await s.restart()
    await within(s.engine.recover({s.sid: s.worker}))
    assert s.knobs.applied == [two], "files are not restored twice"
    assert await s.pending() == []
    assert await s.texts() == ["one"]


async def test_recovery_drops_an_older_versions_intent_whose_anchor_is_gone(make_setup: MakeSetup) -> None:
    """An intent recorded before planned_last_message_id existed is checked by its anchor."""
    s = await make_setup()
    s.turn("one")
    two = s.turn("two")
    anchor = Anchor(s.sid, "not-on-the-chain", two, 0, None, "r1")
    outcome = {
        "rewind_id": "r1",
        "last_message_id": "",
        "files": {
            "requested": False,
            "can_rewind": False,
            "files_changed": [],
            "insertions": 0,
            "deletions": 0,
            "skipped_links": 0,
            "refusal": None,
        },
        "conversation": {
            "requested": True,
            "can_rewind": True,
            "rewound": False,
            "messages_dropped": 2,
            "refusal": None,
        },
    }
    plan = {"target": two, "files": False, "anchor": asdict(anchor), "outcome": outcome}
    await s.ledger.begin_rewind(NewRewind("r1", s.sid, two, "conversation", plan))
    await within(s.engine.recover({s.sid: s.worker}))
    assert await s.pending() == []
    assert await s.ledger.anchor(s.sid) is None
    assert await s.texts() == ["one", "two"]


async def test_a_stale_expectation_is_a_conflict_even_when_the_target_was_dropped(
    make_setup: MakeSetup,
) -> None:
    s = await make_setup()
    s.turn("one")
    two = s.turn("two")
    three = s.turn("three")
    seen_last = s.last
    await within(s.engine.rewind(s.worker, s.request(two, Mode.CONVERSATION)))  # another client's rewind
    with pytest.raises(RewindConflict) as caught:
        await within(
            s.engine.rewind(s.worker, s.request(three, Mode.CONVERSATION, expected_last_message_id=seen_last))
        )
    assert caught.value.metadata["last_message_id"] == (await s.worker.view()).last_message_id
    assert isinstance(caught.value, AgentRewindError)


async def test_a_files_only_rewind_leaves_the_conversation_as_it_is(make_setup: MakeSetup) -> None:
    s = await make_setup()
    s.turn("one")
    two = s.turn("two")
    s.turn("three")
    outcome = await within(s.engine.rewind(s.worker, s.request(two, Mode.FILES)))
    assert outcome.files.can_rewind and s.knobs.applied == [two]
    assert outcome.conversation == ConversationHalf()
    assert outcome.last_message_id == s.last, "the conversation still ends where it did"
    assert await s.ledger.anchor(s.sid) is None
    assert await s.texts() == ["one", "two", "three"]
    [event] = s.published
    assert (event.kind, event.rewind_id) == ("REWOUND", outcome.rewind_id)


async def test_a_prompts_rewind_runs_under_the_lock_its_turn_holds(make_setup: MakeSetup) -> None:
    """PromptRequest.rewind: the turn holds the session's lock, and the rewind runs under it."""
    s = await make_setup()
    s.turn("one")
    two = s.turn("two")
    async with asyncio.timeout(SOON), s.worker.lock:
        outcome = await s.engine.rewind_before_prompt(s.worker, s.request(two, Mode.BOTH))
    assert outcome.conversation.rewound and s.knobs.applied == [two]
    assert await s.texts() == ["one"]


async def test_a_request_id_used_again_with_another_conflict_policy_is_refused(make_setup: MakeSetup) -> None:
    s = await make_setup()
    s.turn("one")
    two = s.turn("two")
    rid = str(uuid.uuid4())
    await within(s.engine.rewind(s.worker, s.request(two, Mode.FILES, request_id=rid, conflict_policy=SKIP)))
    with pytest.raises(RequestIdReused):
        await within(
            s.engine.rewind(s.worker, s.request(two, Mode.FILES, request_id=rid, conflict_policy=OVERWRITE))
        )
    assert s.knobs.applied == [two]


# What a plan says when a half is refused


async def test_a_files_half_the_cli_cannot_rewind_is_refused_with_the_clis_reason(
    make_setup: MakeSetup,
) -> None:
    s = await make_setup()
    s.turn("one")
    two = s.turn("two")
    s.knobs.refuse_plan = "No file checkpoint found for this message"
    preview = await within(s.engine.dry_run(s.worker, s.request(two, Mode.BOTH)))
    assert preview.files.requested and not preview.files.can_rewind
    assert preview.files.refusal is not None
    assert preview.files.refusal.reason == "FILE_CHECKPOINT_UNAVAILABLE"
    assert preview.files.refusal.metadata["sdk_error"] == "No file checkpoint found for this message"
    assert preview.conversation.can_rewind, "the other half is judged on its own"
    with pytest.raises(AgentRewindError) as caught:
        await within(s.engine.rewind(s.worker, s.request(two, Mode.BOTH)))
    assert caught.value.reason == "FILE_CHECKPOINT_UNAVAILABLE"
    assert await s.ledger.rewinds(s.sid) == [] and await s.texts() == ["one", "two"]


async def test_a_files_half_of_a_session_without_checkpointing_is_refused(make_setup: MakeSetup) -> None:
    s = await make_setup(checkpointing=False)
    s.turn("one")
    two = s.turn("two")
    preview = await within(s.engine.dry_run(s.worker, s.request(two, Mode.FILES)))
    assert preview.files.requested and not preview.files.can_rewind
    assert preview.files.refusal is not None and preview.files.refusal.reason == "CHECKPOINTING_DISABLED"
    assert s.knobs.log == [], "the CLI is not asked"


async def test_the_first_prompts_conversation_half_is_refused(make_setup: MakeSetup) -> None:
    s = await make_setup()
    one = s.turn("one")
    s.turn("two")
    preview = await within(s.engine.dry_run(s.worker, s.request(one, Mode.CONVERSATION)))
    assert preview.conversation.requested and not preview.conversation.can_rewind
    assert preview.conversation.refusal is not None
    assert preview.conversation.refusal.reason == "NO_CONVERSATION_ANCHOR"
    assert preview.files == FilesHalf(), "not asked for"


async def test_a_workspace_replaced_by_a_link_refuses_the_files_half_only(make_setup: MakeSetup) -> None:
    """A restore would write wherever the link leads; the conversation is not in the workspace."""
    s = await make_setup()
    s.turn("one")
    two = s.turn("two")
    s.cwd.rename(s.tmp_path / "elsewhere")
    s.cwd.symlink_to(s.tmp_path / "elsewhere")
    preview = await within(s.engine.dry_run(s.worker, s.request(two, Mode.BOTH)))
    assert preview.files.requested and preview.files.refusal is not None
    assert preview.files.refusal.reason == "WORKSPACE_OUTSIDE_ROOT"
    with pytest.raises(AgentRewindError) as caught:
        await within(s.engine.rewind(s.worker, s.request(two, Mode.FILES)))
    assert caught.value.reason == "WORKSPACE_OUTSIDE_ROOT"
    assert "restore" not in " ".join(s.knobs.log)
    outcome = await within(s.engine.rewind(s.worker, s.request(two, Mode.CONVERSATION)))
    assert outcome.conversation.rewound and await s.texts() == ["one"]


# Older intents, and what moved on


async def test_recovery_finishes_an_older_versions_intent_whose_anchor_is_still_there(
    make_setup: MakeSetup,
) -> None:
    """An intent recorded before planned_last_message_id existed is checked by its anchor."""
    s = await make_setup()
    s.turn("one")
    first_reply = s.last
    two = s.turn("two")
    anchor = Anchor(s.sid, first_reply, two, s.path.stat().st_size, None, "r1")
    outcome = RewindOutcome("r1", FilesHalf(), ConversationHalf(True, True, False, 2), "")
    plan = {"target": two, "files": False, "anchor": asdict(anchor), "outcome": outcome.to_json()}
    await s.ledger.begin_rewind(NewRewind("r1", s.sid, two, "conversation", plan))
    await within(s.engine.recover({s.sid: s.worker}))
    assert await s.pending() == []
    record = await s.ledger.rewind("r1")
    assert record is not None and record.state == "applied"
    assert await s.texts() == ["one"]


async def test_a_rewind_whose_conversation_moved_on_after_its_files_were_restored_keeps_the_files_half(
    make_setup: MakeSetup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The files stand; the result says the conversation was not cut, and nothing is cut."""
    s = await make_setup()
    s.turn("one")
    two = s.turn("two")
    crash_once(monkeypatch, s.ledger, "complete_rewind")
    with pytest.raises(RuntimeError):
        await within(s.engine.rewind(s.worker, s.request(two, Mode.BOTH)))
    [pending] = await s.pending()
    assert pending.files_applied
    s.turn("three")  # a CLI that started a turn of its own
    await s.resolve()
    record = await s.ledger.rewind(pending.rewind_id)
    assert record is not None and record.state == "applied" and record.result is not None
    done = RewindOutcome.from_json(record.result)
    assert done.files.can_rewind
    assert done.conversation == ConversationHalf(True, False, False, 0)
    assert done.last_message_id == s.last
    assert await s.ledger.anchor(s.sid) is None
    assert await s.texts() == ["one", "two", "three"]
    assert s.knobs.applied == [two], "restored once"


# Metrics


def _rewinds(mode: str, outcome: str, source: str) -> float:
    return (
        REGISTRY.get_sample_value(
            "agent_rewind_rewinds_total", {"mode": mode, "outcome": outcome, "source": source}
        )
        or 0.0
    )


def _seconds(mode: str) -> float:
    return REGISTRY.get_sample_value("agent_rewind_rewind_duration_seconds_sum", {"mode": mode}) or 0.0


async def test_rewinds_are_counted_by_mode_outcome_and_source_and_a_retry_is_not(
    make_setup: MakeSetup,
) -> None:
    s = await make_setup()
    s.turn("one")
    two = s.turn("two")
    three = s.turn("three")
    labels = [
        ("files", "applied", "checkpoint"),
        ("conversation", "applied", "none"),
        ("conversation", "refused", "none"),
        ("files", "failed", "checkpoint"),
        ("files", "retried", "checkpoint"),
    ]
    before = {k: _rewinds(*k) for k in labels}
    seconds = _seconds("files")
    rid = str(uuid.uuid4())
    started = time.perf_counter()
    first = await within(s.engine.rewind(s.worker, s.request(two, Mode.FILES, request_id=rid)))
    took = time.perf_counter() - started
    assert 0 < _seconds("files") - seconds <= took, "how long the rewind took"
    # A prompt's retry, for a rewind already applied: the same rewind, counted once.
    async with asyncio.timeout(SOON), s.worker.lock:
        again = await s.engine.rewind_before_prompt(s.worker, s.request(two, Mode.FILES, request_id=rid))
    assert again.rewind_id == first.rewind_id and s.knobs.applied == [two]
    await within(s.engine.rewind(s.worker, s.request(three, Mode.CONVERSATION)))
    with pytest.raises(RewindConflict):
        await within(
            s.engine.rewind(s.worker, s.request(two, Mode.CONVERSATION, expected_last_message_id="x"))
        )
    s.knobs.apply_failures = 2
    with pytest.raises(AgentUnavailable):
        await within(s.engine.rewind(s.worker, s.request(two, Mode.FILES)))
    counted = {k: _rewinds(*k) - before[k] for k in labels}
    assert counted == {
        ("files", "applied", "checkpoint"): 1,
        ("conversation", "applied", "none"): 1,
        ("conversation", "refused", "none"): 1,
        ("files", "failed", "checkpoint"): 1,
        ("files", "retried", "checkpoint"): 0,
    }
