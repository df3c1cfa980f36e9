"""The ledger's contract, run against every implementation (`ledgers` in conftest.py).

Sessions, request ids, pending conversation cuts (anchors), rewind intents, and the event log
with its gap-free cursors. Durability and schema migration are specific to each implementation
and tested beside it.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import pytest

from agent_rewind import metrics
from agent_rewind.errors import ReplicaUnavailable, SessionAlreadyExists
from agent_rewind.store.ledger import (
    Anchor,
    EgressRecord,
    ForkOrigin,
    Ledger,
    NewEvent,
    NewRequest,
    NewRewind,
    NewSession,
    NewSnapshot,
    RequestIdTaken,
    now,
)

SID = "0b7f3c1e-5a8d-4d6e-9f10-2a3b4c5d6e7f"
OTHER = "1c8e4d2f-6b9e-4e7f-8a21-3b4c5d6e7f80"


def _session(sid: str = SID, **kw: Any) -> NewSession:
    values: dict[str, Any] = {
        "session_id": sid,
        "cwd": f"/ws/{sid[:4]}",
        "options": {},
        "checkpointing": True,
    }
    values.update(kw)
    return NewSession(**values)


async def _begin(
    ledger: Ledger, rewind_id: str, *, session_id: str = SID, request_id: str | None = None
) -> None:
    request = NewRequest(request_id, "Rewind", f"fp-{rewind_id}", session_id) if request_id else None
    await ledger.begin_rewind(
        NewRewind(
            rewind_id=rewind_id,
            session_id=session_id,
            message_id=f"msg-{rewind_id}",
            mode="both",
            plan={"target": f"msg-{rewind_id}", "anchor": None},
            principal="alice",
            request=request,
        )
    )


def _event(rewind_id: str, session_id: str = SID, **data: Any) -> NewEvent:
    return NewEvent("REWOUND", session_id, rewind_id, "alice", dict(data))


def _anchor(anchor_uuid: str, rewind_id: str, *, size: int = 100) -> Anchor:
    return Anchor(SID, anchor_uuid, f"target-of-{anchor_uuid}", size, None, rewind_id)


# Secrets and sessions


async def test_a_secret_is_made_once_and_kept(ledger: Ledger) -> None:
    first = await ledger.secret("page_tokens")
    assert len(first) == 32
    assert await ledger.secret("page_tokens") == first
    assert await ledger.secret("other") != first


async def test_session_round_trips_every_field(ledger: Ledger) -> None:
    options: dict[str, Any] = {"model": "claude-test", "max_turns": 5, "allowed_tools": ["Read", "Bash"]}
    created = await ledger.add_session(
        _session(options=options, checkpointing=False, principal="alice", workspace_snapshots=True)
    )
    assert created.options == options
    assert (created.checkpointing, created.closed, created.started) == (False, False, False)
    assert (created.principal, created.workspace_snapshots) == ("alice", True)
    assert created.create_time == created.update_time and created.create_time.tzinfo is not None
    await ledger.touch_session(SID, started=True)
    await ledger.touch_session(SID, closed=True)
    record = await ledger.session(SID)
    assert record is not None and (record.started, record.closed) == (True, True)
    touched = await ledger.touch_session(SID, closed=False)
    record = await ledger.session(SID)
    assert record is not None and not record.closed and record.update_time == touched >= created.update_time


async def test_sessions_lists_every_session_and_ids_are_unique(ledger: Ledger) -> None:
    assert await ledger.session(SID) is None
    await ledger.add_session(_session(SID))
    await ledger.add_session(_session(OTHER))
    assert {r.session_id for r in await ledger.sessions()} == {SID, OTHER}
    with pytest.raises(SessionAlreadyExists):
        await ledger.add_session(_session(SID))


async def test_a_session_created_with_a_request_id_is_found_by_it(ledger: Ledger) -> None:
    request = NewRequest("req-1", "CreateSession", "fp", SID)
    await ledger.add_session(_session(SID), request)
    recorded = await ledger.request("req-1")
    assert recorded is not None and recorded.session_id == SID and recorded.same_call(request)
    with pytest.raises(RequestIdTaken) as taken:
        await ledger.add_session(_session(OTHER), NewRequest("req-1", "CreateSession", "fp2", OTHER))
    assert taken.value.existing.session_id == SID
    assert await ledger.session(OTHER) is None, "the refused insert left nothing behind"
    await ledger.remove_session(SID)
    assert await ledger.session(SID) is None and await ledger.request("req-1") is None


def _write_seconds() -> tuple[float, float]:
    """The ledger-write histogram's (count, sum)."""
    sample = metrics.REGISTRY.get_sample_value
    return (
        sample("agent_rewind_ledger_write_seconds_count") or 0.0,
        sample("agent_rewind_ledger_write_seconds_sum") or 0.0,
    )


async def test_each_write_s_duration_is_observed_once_as_long_as_it_took(ledger: Ledger) -> None:
    await ledger.add_session(_session())
    count, total = _write_seconds()
    started = time.perf_counter()
    await ledger.touch_session(SID, started=True)
    took = time.perf_counter() - started
    after_count, after_total = _write_seconds()
    assert after_count == count + 1
    assert 0 <= after_total - total <= took


# Request ids


async def test_a_request_is_recorded_then_finished(ledger: Ledger) -> None:
    request = NewRequest("req-2", "Prompt", "fp", SID)
    await ledger.begin_request(request, {"prompt_id": "p-1"})
    recorded = await ledger.request("req-2")
    assert recorded is not None and not recorded.done and recorded.result == {"prompt_id": "p-1"}
    with pytest.raises(RequestIdTaken):
        await ledger.begin_request(NewRequest("req-2", "Rewind", "other", OTHER))
    await ledger.finish_request("req-2", {"prompt_id": "p-1", "result": {"subtype": "success"}})
    recorded = await ledger.request("req-2")
    assert recorded is not None and recorded.done and recorded.result is not None
    assert recorded.result["result"] == {"subtype": "success"}
    assert not recorded.same_call(NewRequest("req-2", "Prompt", "fp", OTHER))


async def test_request_ids_past_their_retention_are_forgotten(ledger: Ledger) -> None:
    await ledger.begin_request(NewRequest("old", "Prompt", "fp", SID))
    assert await ledger.forget_requests(now() - timedelta(hours=1)) == 0
    assert await ledger.forget_requests(now() + timedelta(seconds=1)) == 1
    assert await ledger.request("old") is None
    await ledger.begin_request(NewRequest("again", "Prompt", "fp", SID))
    await ledger.forget_request("again")
    assert await ledger.request("again") is None


# Anchors


async def test_completing_a_conversation_rewind_sets_its_anchor_and_a_newer_one_replaces_it(
    ledger: Ledger,
) -> None:
    await ledger.add_session(_session())
    assert await ledger.anchor(SID) is None
    await _begin(ledger, "r1")
    anchor = _anchor("a-1", "r1", size=1234)
    await ledger.complete_rewind("r1", {"last_message_id": "a-1"}, anchor, _event("r1"))
    assert await ledger.anchor(SID) == anchor
    await _begin(ledger, "r2")
    await ledger.complete_rewind("r2", {}, None, _event("r2"))
    assert await ledger.anchor(SID) == anchor, "a files-only rewind leaves it"
    await _begin(ledger, "r3")
    newer = _anchor("a-0", "r3", size=200)
    await ledger.complete_rewind("r3", {}, newer, _event("r3"))
    assert await ledger.anchor(SID) == newer
    await ledger.clear_anchor(SID, "a-1")  # the older cut: the newer one stays
    assert await ledger.anchor(SID) == newer
    await ledger.clear_anchor(OTHER, "a-0")  # another session's: nothing changes
    assert await ledger.anchor(SID) == newer
    await ledger.clear_anchor(SID, "a-0")
    assert await ledger.anchor(SID) is None


# Rewinds


async def test_an_intent_is_pending_until_completed(ledger: Ledger) -> None:
    await ledger.add_session(_session())
    await _begin(ledger, "r1", request_id="req-1")
    record = await ledger.rewind("r1")
    assert record is not None
    assert (record.state, record.cursor, record.result, record.files_applied) == (
        "pending",
        None,
        None,
        False,
    )
    assert (record.session_id, record.request_id, record.message_id, record.mode) == (
        SID,
        "req-1",
        "msg-r1",
        "both",
    )
    assert record.plan == {"target": "msg-r1", "anchor": None} and record.principal == "alice"
    request = await ledger.request("req-1")
    assert request is not None and request.result == {"rewind_id": "r1"} and not request.done
    await ledger.mark_files_applied("r1")
    record = await ledger.rewind("r1")
    assert record is not None and record.files_applied
    result = {"rewind_id": "r1", "files": {"files_changed": ["a.txt"]}}
    event = await ledger.complete_rewind("r1", result, None, _event("r1"))
    record = await ledger.rewind("r1")
    assert record is not None and (record.state, record.result, record.cursor) == (
        "applied",
        result,
        event.cursor,
    )
    assert (await ledger.events_after(0)) == [event], "the returned event is the one the log holds"
    request = await ledger.request("req-1")
    assert request is not None and request.done


async def test_abandoning_an_intent_forgets_it_and_its_request_but_never_an_applied_rewind(
    ledger: Ledger,
) -> None:
    await ledger.add_session(_session())
    await _begin(ledger, "r1", request_id="req-1")
    await ledger.abandon_rewind("r1")
    assert await ledger.rewind("r1") is None and await ledger.request("req-1") is None
    await _begin(ledger, "r2", request_id="req-2")
    await ledger.complete_rewind("r2", {}, None, _event("r2"))
    await ledger.abandon_rewind("r2")
    record = await ledger.rewind("r2")
    assert record is not None and record.state == "applied"
    assert await ledger.request("req-2") is not None


async def test_a_rewind_request_id_is_taken_once(ledger: Ledger) -> None:
    await ledger.add_session(_session())
    await _begin(ledger, "r1", request_id="req-9")
    with pytest.raises(RequestIdTaken):
        await _begin(ledger, "r2", request_id="req-9")
    assert await ledger.rewind("r2") is None


async def test_pending_rewinds_by_session(ledger: Ledger) -> None:
    await ledger.add_session(_session(SID))
    await ledger.add_session(_session(OTHER))
    for rid in ("r1", "r2", "r3", "r4"):
        await _begin(ledger, rid)
    await _begin(ledger, "o1", session_id=OTHER)
    await ledger.complete_rewind("r2", {}, None, _event("r2"))
    await ledger.abandon_rewind("r4")
    assert [r.rewind_id for r in await ledger.pending_rewinds()] == ["r1", "r3", "o1"]
    assert [r.rewind_id for r in await ledger.pending_rewinds(SID)] == ["r1", "r3"]
    assert [r.rewind_id for r in await ledger.rewinds(OTHER)] == ["o1"]
    assert [(r.rewind_id, r.state) for r in await ledger.rewinds()] == [
        ("r1", "pending"),
        ("r2", "applied"),
        ("r3", "pending"),
        ("o1", "pending"),
    ], "every session's, applied ones included, in the order they began"


async def test_completing_a_rewind_twice_is_refused_and_appends_no_event(ledger: Ledger) -> None:
    await ledger.add_session(_session())
    await _begin(ledger, "r1")
    await ledger.complete_rewind("r1", {}, None, _event("r1"))
    with pytest.raises(LookupError):
        await ledger.complete_rewind("r1", {}, None, _event("r1"))
    assert [e.rewind_id for e in await ledger.events_after(0)] == ["r1"]


# The event log


async def test_cursors_are_gap_free_and_follow_completion_order(ledger: Ledger) -> None:
    await ledger.add_session(_session(SID))
    await ledger.add_session(_session(OTHER))
    assert await ledger.event_bounds() == (0, 0)
    await _begin(ledger, "early")
    await _begin(ledger, "late")
    await _begin(ledger, "dropped")
    await _begin(ledger, "other", session_id=OTHER)
    assert (await ledger.complete_rewind("late", {}, None, _event("late", messages_dropped=2))).cursor == 1
    await ledger.abandon_rewind("dropped")
    assert (await ledger.complete_rewind("other", {}, None, _event("other", OTHER))).cursor == 2
    assert (await ledger.complete_rewind("early", {}, None, _event("early"))).cursor == 3
    events = await ledger.events_after(0)
    assert [(e.cursor, e.rewind_id) for e in events] == [(1, "late"), (2, "other"), (3, "early")]
    assert events[0].data == {"messages_dropped": 2} and events[0].kind == "REWOUND"
    assert events[0].principal == "alice" and events[0].occur_time.tzinfo is not None
    assert [e.cursor for e in await ledger.events_after(1)] == [2, 3]
    assert [e.cursor for e in await ledger.events_after(0, session_id=SID)] == [1, 3]
    assert [e.cursor for e in await ledger.events_after(0, limit=2)] == [1, 2]
    assert await ledger.event_bounds() == (1, 3)


async def test_trimming_keeps_the_newest_and_cursors_go_on(ledger: Ledger) -> None:
    await ledger.add_session(_session())
    for n in range(5):
        await _begin(ledger, f"r{n}")
        await ledger.complete_rewind(f"r{n}", {}, None, _event(f"r{n}"))
    assert await ledger.trim_events(keep=2, older_than=None) == 3
    assert await ledger.event_bounds() == (4, 5)
    assert await ledger.trim_events(keep=None, older_than=now() + timedelta(seconds=1)) == 2
    assert await ledger.event_bounds() == (6, 5), "nothing retained: the oldest is past the newest"
    await _begin(ledger, "r5")
    assert (await ledger.complete_rewind("r5", {}, None, _event("r5"))).cursor == 6
    assert await ledger.event_bounds() == (6, 6)


async def test_concurrent_completions_get_distinct_consecutive_cursors(ledger: Ledger) -> None:
    await ledger.add_session(_session())
    ids = [f"r{n}" for n in range(20)]
    for rid in ids:
        await _begin(ledger, rid)
    events = await asyncio.gather(*(ledger.complete_rewind(r, {}, None, _event(r)) for r in ids))
    assert sorted(e.cursor for e in events) == list(range(1, 21))


# Workspace snapshots


async def test_snapshots_are_listed_per_session_in_the_order_they_were_taken(ledger: Ledger) -> None:
    await ledger.add_session(_session())
    await ledger.add_session(_session(OTHER))
    first = await ledger.add_snapshot(NewSnapshot(SID, "turn_start", "p1", "t1", True))
    await ledger.add_snapshot(NewSnapshot(OTHER, "turn_start", "q1", "u1", True))
    await ledger.add_snapshot(NewSnapshot(SID, "turn_end", "p1", "t2", False, "timeout"))
    await ledger.add_snapshot(NewSnapshot(SID, "rewind_before", "r1", None, False, "file over 10 bytes: big"))
    records = await ledger.snapshots(SID)
    assert [(r.kind, r.ref, r.tree, r.complete, r.reason) for r in records] == [
        ("turn_start", "p1", "t1", True, ""),
        ("turn_end", "p1", "t2", False, "timeout"),
        ("rewind_before", "r1", None, False, "file over 10 bytes: big"),
    ]
    assert records[0] == first
    assert [r.seq for r in records] == sorted(r.seq for r in records)
    assert [r.ref for r in await ledger.snapshots(OTHER)] == ["q1"]


async def test_pruned_snapshots_lose_their_trees_and_say_so(ledger: Ledger) -> None:
    await ledger.add_session(_session())
    await ledger.add_session(_session(OTHER))
    taken = [
        await ledger.add_snapshot(NewSnapshot(SID, "turn_start", f"p{i}", f"t{i}", True)) for i in range(3)
    ]
    other = await ledger.add_snapshot(NewSnapshot(OTHER, "turn_start", "q", "u", True))
    assert await ledger.prune_snapshots(SID, before_seq=taken[2].seq) == 2
    assert await ledger.prune_snapshots(SID, before_seq=taken[2].seq) == 0, "already pruned"
    records = await ledger.snapshots(SID)
    assert [(r.tree, r.complete, r.reason) for r in records] == [
        (None, False, "pruned"),
        (None, False, "pruned"),
        ("t2", True, ""),
    ]
    assert await ledger.snapshots(OTHER) == [other], "another session's are untouched"


# Erasure (DeleteSession)


def _deleted(session_id: str = SID, **data: Any) -> NewEvent:
    return NewEvent("SESSION_DELETED", session_id, principal="admin", data={"owner": "alice", **data})


async def _session_with_everything(ledger: Ledger, sid: str = SID) -> None:
    """A session with a row in every table that may hold its content."""
    await ledger.add_session(
        _session(sid, options={"system_prompt": "the secret"}, principal="alice"),
        NewRequest(f"create-{sid}", "CreateSession", '["the secret"]', sid),
    )
    await ledger.begin_request(NewRequest(f"prompt-{sid}", "Prompt", '["the secret prompt"]', sid))
    await ledger.finish_request(f"prompt-{sid}", {"events": ["the secret reply"]})
    await _begin(ledger, f"r-{sid}", session_id=sid, request_id=f"rewind-{sid}")
    await ledger.complete_rewind(
        f"r-{sid}",
        {"files": ["/ws/the-secret.txt"]},
        Anchor(sid, f"a-{sid}", f"m-{sid}", 10, None, f"r-{sid}"),
        NewEvent(
            "REWOUND",
            sid,
            f"r-{sid}",
            "alice",
            {"owner": "alice", "files": {"files_changed": ["/ws/x"]}, "paths": ["src/secret"]},
        ),
    )
    await _begin(ledger, f"pending-{sid}", session_id=sid)
    await ledger.add_snapshot(NewSnapshot(sid, "turn_start", "p1", "tree", True))
    await ledger.record_egress(EgressRecord(sid, "p1", "secret.example.com", 443))
    await ledger.record_usage(sid, "alice", 10, 1)


async def test_an_erased_session_leaves_a_tombstone_and_nothing_of_its_content(ledger: Ledger) -> None:
    await _session_with_everything(ledger)
    await _session_with_everything(ledger, OTHER)
    created = await ledger.tombstone(SID)
    assert created is None, "a live session has no tombstone"
    record = await ledger.session(SID)
    assert record is not None
    request = NewRequest("delete-1", "DeleteSession", "fp", SID)
    plan = {"cwd": "/ws/0b7f", "workspace": True}
    event = await ledger.erase_session(SID, _deleted(), request, plan)

    assert (event.kind, event.session_id, event.principal, event.data) == (
        "SESSION_DELETED",
        SID,
        "admin",
        {"owner": "alice"},
    )
    assert await ledger.session(SID) is None
    assert [r.session_id for r in await ledger.sessions()] == [OTHER]
    tombstone = await ledger.tombstone(SID)
    assert tombstone is not None
    assert (tombstone.session_id, tombstone.principal, tombstone.erasure) == (SID, "alice", plan)
    assert tombstone.create_time == record.create_time and tombstone.deleted_time == event.occur_time
    # Every row with its content is gone: pending cuts, rewinds (pending ones too), snapshot
    # records, request ids of every call on it; the delete's own request is recorded, done.
    assert await ledger.anchor(SID) is None
    assert await ledger.rewinds(SID) == [] and await ledger.pending_rewinds(SID) == []
    assert await ledger.snapshots(SID) == []
    assert await ledger.egress(SID) == []
    assert await ledger.usage(SID) is None
    for request_id in (f"create-{SID}", f"prompt-{SID}", f"rewind-{SID}"):
        assert await ledger.request(request_id) is None, request_id
    recorded = await ledger.request("delete-1")
    assert recorded is not None and recorded.done and recorded.same_call(request)
    # Its events stay (their cursors are the log's), without the paths of its files.
    events = await ledger.events_after(0, SID)
    assert [(e.kind, e.rewind_id) for e in events] == [("REWOUND", f"r-{SID}"), ("SESSION_DELETED", "")]
    assert events[0].data == {"owner": "alice", "files": {"files_changed": []}, "paths": []}
    assert events[1] == event

    # The other session has all of it still.
    assert await ledger.anchor(OTHER) is not None
    assert len(await ledger.rewinds(OTHER)) == 2 and len(await ledger.snapshots(OTHER)) == 1
    assert len(await ledger.egress(OTHER)) == 1
    assert await ledger.usage(OTHER) is not None
    assert await ledger.request(f"prompt-{OTHER}") is not None
    (theirs,) = [e for e in await ledger.events_after(0, OTHER)]
    assert theirs.data["files"] == {"files_changed": ["/ws/x"]} and theirs.data["paths"] == ["src/secret"]
    # A deleted session's id stays taken.
    with pytest.raises(SessionAlreadyExists):
        await ledger.add_session(_session(SID))


async def test_the_deleted_event_takes_the_next_cursor(ledger: Ledger) -> None:
    await ledger.add_session(_session())
    await ledger.add_session(_session(OTHER))
    await _begin(ledger, "r1", session_id=OTHER)
    first = await ledger.complete_rewind("r1", {}, None, _event("r1", OTHER))
    deleted = await ledger.erase_session(SID, _deleted())
    assert deleted.cursor == first.cursor + 1
    assert await ledger.event_bounds() == (first.cursor, deleted.cursor)
    assert [e.cursor for e in await ledger.events_after(0)] == [first.cursor, deleted.cursor]


async def test_erasing_an_unknown_or_deleted_session_is_a_lookup_error(ledger: Ledger) -> None:
    with pytest.raises(LookupError):
        await ledger.erase_session(SID, _deleted())
    await ledger.add_session(_session())
    await ledger.erase_session(SID, _deleted())
    with pytest.raises(LookupError):
        await ledger.erase_session(SID, _deleted(), NewRequest("delete-2", "DeleteSession", "fp", SID))
    assert await ledger.request("delete-2") is None
    assert len(await ledger.events_after(0)) == 1


async def test_erasing_with_a_request_id_already_taken_changes_nothing(ledger: Ledger) -> None:
    await ledger.add_session(_session())
    await ledger.begin_request(NewRequest("taken", "Prompt", "fp", SID))
    with pytest.raises(RequestIdTaken) as taken:
        await ledger.erase_session(SID, _deleted(), NewRequest("taken", "DeleteSession", "fp", SID))
    assert taken.value.existing.method == "Prompt"
    assert await ledger.session(SID) is not None and await ledger.tombstone(SID) is None
    assert await ledger.request("taken") is not None
    assert await ledger.events_after(0) == []


async def test_an_erasure_is_unfinished_until_it_is_said_finished(ledger: Ledger) -> None:
    for sid in (SID, OTHER):
        await ledger.add_session(_session(sid))
    await ledger.erase_session(SID, _deleted(), erasure={"cwd": "/ws/a", "workspace": False})
    await ledger.erase_session(OTHER, _deleted(OTHER))  # nothing left to erase on disk
    assert [(t.session_id, t.erasure) for t in await ledger.unfinished_erasures()] == [
        (SID, {"cwd": "/ws/a", "workspace": False})
    ]
    await ledger.finish_erasure(SID)
    await ledger.finish_erasure(SID)  # idempotent
    assert await ledger.unfinished_erasures() == []
    tombstone = await ledger.tombstone(SID)
    assert tombstone is not None and tombstone.erasure is None
    await ledger.finish_erasure("no-such-session")


# The replica directory


async def test_a_replica_registers_renews_and_a_new_incarnation_fences_the_old(ledger: Ledger) -> None:
    first = await ledger.register_replica("pod-0", "pod-0.svc:50051", 30)
    assert (first.replica_id, first.address, first.epoch, first.alive) == (
        "pod-0",
        "pod-0.svc:50051",
        1,
        True,
    )
    renewed = await ledger.renew_replica("pod-0", 1, 60)
    assert renewed is not None and renewed.lease_expires > first.lease_expires and renewed.epoch == 1
    again = await ledger.register_replica("pod-0", "10.0.0.7:50051", 30)  # restarted elsewhere
    assert (again.epoch, again.address) == (2, "10.0.0.7:50051")
    assert await ledger.renew_replica("pod-0", 1, 30) is None  # the old incarnation is fenced off
    assert await ledger.renew_replica("pod-0", 2, 30) is not None
    await ledger.retire_replica("pod-0", 1)  # the old one's retirement changes nothing
    assert [r.alive for r in await ledger.replicas()] == [True]
    await ledger.retire_replica("pod-0", 2)
    assert [(r.replica_id, r.epoch, r.alive) for r in await ledger.replicas()] == [("pod-0", 2, False)]


async def test_a_lease_not_renewed_expires(ledger: Ledger) -> None:
    await ledger.register_replica("pod-1", "pod-1:50051", 30)
    await ledger.register_replica("pod-2", "pod-2:50051", 0.05)
    await asyncio.sleep(0.2)
    assert [(r.replica_id, r.alive) for r in await ledger.replicas()] == [("pod-1", True), ("pod-2", False)]


async def test_a_session_names_the_replica_that_owns_it(ledger: Ledger) -> None:
    created = await ledger.add_session(_session(replica="pod-0"))
    await ledger.add_session(_session(OTHER))
    assert created.replica == "pod-0"
    assert [(s.session_id, s.replica) for s in await ledger.sessions()] == sorted(
        [(SID, "pod-0"), (OTHER, "")]
    )


async def test_sessions_that_name_no_replica_are_claimed_once_and_counted_by_owner(ledger: Ledger) -> None:
    third = "2d9f5e3a-7c0f-4f8a-9b32-4c5d6e7f8091"
    await ledger.add_session(_session(replica="pod-0"))
    await ledger.add_session(_session(OTHER))  # from before replicas were recorded
    await ledger.add_session(_session(third))
    await ledger.erase_session(third, _deleted())  # a tombstone names its owner too
    assert await ledger.session_counts() == {"pod-0": 1, "": 1}
    assert await ledger.claim_sessions("pod-1") == 2
    assert await ledger.claim_sessions("pod-2") == 0, "claimed once: a second replica finds none"
    assert await ledger.session_counts() == {"pod-0": 1, "pod-1": 1}
    tombstone = await ledger.tombstone(third)
    assert tombstone is not None and tombstone.replica == "pod-1"
    # An embedded ledger's only server claims every session, whatever id made it.
    assert await ledger.claim_sessions("pod-1", every=True) == 1
    assert await ledger.session_counts() == {"pod-1": 2}


LEASE_S = 1.0


async def test_a_replica_whose_lease_ran_out_is_taken_over_and_fenced_off_in_one_go(ledger: Ledger) -> None:
    third = "2d9f5e3a-7c0f-4f8a-9b32-4c5d6e7f8091"
    await ledger.register_replica("pod-1", "b:1", 60)
    ledger.fence("pod-1", 1)
    await ledger.add_session(_session(replica="pod-0"))
    await ledger.add_session(_session(third, replica="pod-0"))
    await ledger.erase_session(third, _deleted())
    await ledger.add_session(_session(OTHER, replica="pod-1"))
    # Registered just before the look, with a lease no loaded machine outlasts in one call.
    old = await ledger.register_replica("pod-0", "a:1", LEASE_S)
    assert await ledger.take_over("pod-0", "pod-1") is None, "its lease is current: nothing taken"
    await asyncio.sleep(LEASE_S + 0.1)
    assert await ledger.take_over("pod-0", "pod-1") == sorted([SID, third])
    assert await ledger.session_counts() == {"pod-1": 2}
    tombstone = await ledger.tombstone(third)
    assert tombstone is not None and tombstone.replica == "pod-1", "its erasure is pod-1's to finish"
    # The old incarnation of pod-0, back: it may neither renew nor write.
    assert await ledger.renew_replica("pod-0", old.epoch, 60) is None
    ledger.fence("pod-0", old.epoch)
    with pytest.raises(ReplicaUnavailable):
        await ledger.touch_session(SID)
    ledger.fence("pod-1", 1)
    assert await ledger.take_over("pod-0", "pod-1") == [], "fenced off, it owns nothing more"


async def test_a_fenced_ledger_refuses_every_write_once_another_incarnation_registered(
    ledger: Ledger,
) -> None:
    first = await ledger.register_replica("pod-0", "pod-0:50051", 30)
    ledger.fence("pod-0", first.epoch)
    await ledger.add_session(_session())  # the current incarnation writes
    await ledger.register_replica("pod-0", "elsewhere:50051", 30)  # a newer one, elsewhere
    with pytest.raises(ReplicaUnavailable) as refused:
        await ledger.add_session(_session(OTHER))
    assert refused.value.metadata == {"replica": "pod-0"}
    with pytest.raises(ReplicaUnavailable):
        await ledger.touch_session(SID, closed=True)
    assert [(s.session_id, s.closed) for s in await ledger.sessions()] == [(SID, False)]  # nothing changed
    await ledger.retire_replica("pod-0", first.epoch)  # the directory's own writes still run
    assert [r.epoch for r in await ledger.replicas()] == [2]


async def test_a_fenced_incarnation_learns_it_from_its_renewal_and_may_register_anew(
    ledger: Ledger,
) -> None:
    """The directory's writes are not fenced: the fenced-off incarnation's renewal answers None
    (Membership's sign that it is fenced, not that the ledger is away), and its process may join
    again as a newer incarnation."""
    first = await ledger.register_replica("pod-0", "pod-0:50051", 30)
    ledger.fence("pod-0", first.epoch)
    await ledger.register_replica("pod-0", "elsewhere:50051", 30)
    assert await ledger.renew_replica("pod-0", first.epoch, 30) is None
    again = await ledger.register_replica("pod-0", "pod-0:50051", 30)
    assert (again.epoch, again.address, again.alive) == (3, "pod-0:50051", True)
    ledger.fence("pod-0", again.epoch)
    await ledger.add_session(_session())  # the newest incarnation writes


async def test_a_lease_is_current_only_before_it_ends(ledger: Ledger) -> None:
    """A lease that ends the moment it is granted (zero seconds) is not current, by the same
    clock reading that granted it; nor is a retired one."""
    granted = await ledger.register_replica("pod-0", "pod-0:50051", 0)
    assert not granted.alive and granted.lease_expires <= now()
    assert [r.alive for r in await ledger.replicas()] == [False]


async def test_a_session_id_taken_is_refused_the_same_way_by_every_ledger(ledger: Ledger) -> None:
    await ledger.add_session(_session())
    with pytest.raises(SessionAlreadyExists):
        await ledger.add_session(
            _session(cwd="/elsewhere"), NewRequest("create-again", "CreateSession", "fp", SID)
        )
    assert await ledger.request("create-again") is None  # nothing written
    assert [s.cwd for s in await ledger.sessions()] == [f"/ws/{SID[:4]}"]


# --- fork origins and egress ---------------------------------------------------------------------


async def test_a_fork_keeps_where_it_came_from(ledger: Ledger) -> None:
    await ledger.add_session(_session())
    origin = ForkOrigin(SID, "9d1e5c3a-7b8c-4d9e-8f01-2a3b4c5d6e7f")
    made = await ledger.add_session(_session(OTHER, forked_from=origin))
    assert made.forked_from == origin
    assert (await ledger.session(OTHER)) == made
    assert (await ledger.session(SID)) is not None and (await ledger.session(SID)).forked_from is None  # type: ignore[union-attr]
    assert {r.session_id: r.forked_from for r in await ledger.sessions()} == {SID: None, OTHER: origin}
    whole = await ledger.add_session(
        _session("2d9f5e30-7cae-4f80-9b32-4c5d6e7f8091", forked_from=ForkOrigin(SID, ""))
    )
    assert whole.forked_from == ForkOrigin(SID, "")


async def test_egress_is_kept_per_turn_and_host_once_in_the_order_first_seen(ledger: Ledger) -> None:
    await ledger.add_session(_session())
    await ledger.add_session(_session(OTHER))
    seen = [
        EgressRecord(SID, "p1", "pypi.org", 443),
        EgressRecord(SID, "p1", "files.pythonhosted.org", 443),
        EgressRecord(SID, "p1", "pypi.org", 443),  # again: kept once
        EgressRecord(SID, "p2", "pypi.org", 443),
        EgressRecord(SID, "p2", "pypi.org", 80),
        EgressRecord(OTHER, "q1", "example.com", 443),
    ]
    for record in seen:
        await ledger.record_egress(record)
    assert await ledger.egress(SID) == [seen[0], seen[1], seen[3], seen[4]]
    assert await ledger.egress(OTHER) == [seen[5]]
    assert await ledger.egress("3e0a6f41-8dbf-4091-8c43-5d6e7f8091a2") == []
