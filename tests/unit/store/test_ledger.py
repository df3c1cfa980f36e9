"""The SQLite ledger: sessions, pending conversation cuts (anchors), rewinds and their cursors."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_rewind.store.ledger import Anchor, Ledger

SID = "0b7f3c1e-5a8d-4d6e-9f10-2a3b4c5d6e7f"
OTHER = "1c8e4d2f-6b9e-4e7f-8a21-3b4c5d6e7f80"


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "ledger.sqlite3"


@pytest.fixture
def ledger(path: Path) -> Iterator[Ledger]:
    db = Ledger(path)
    yield db
    db.close()


def _begin(ledger: Ledger, rewind_id: str, *, session_id: str = SID, request_id: str | None = None) -> None:
    ledger.begin_rewind(
        rewind_id=rewind_id,
        session_id=session_id,
        request_id=request_id,
        fingerprint=f"fp-{rewind_id}",
        message_id=f"msg-{rewind_id}",
        mode="BOTH",
        plan={"target": f"msg-{rewind_id}", "anchor": None},
        principal="alice",
    )


def _anchor(anchor_uuid: str, rewind_id: str, *, size: int = 100, drops: str | None = None) -> Anchor:
    return Anchor(SID, anchor_uuid, f"target-of-{anchor_uuid}", size, drops, rewind_id)


# Sessions


def test_session_round_trips_options_checkpointing_and_flags(ledger: Ledger) -> None:
    options: dict[str, Any] = {
        "model": "claude-test",
        "max_turns": 5.0,
        "allowed_tools": ["Read", "Bash"],
        "mcp_servers": {"x": {"type": "stdio", "command": "srv", "args": ["-v"]}},
        "system_prompt": None,
    }
    created = ledger.add_session(SID, "/ws/a", options, False, None)
    assert created.options == options
    assert created.checkpointing is False
    assert created.closed is False
    assert created.started is False
    assert created.cwd == "/ws/a"
    assert created.create_time == created.update_time
    assert created.create_time.tzinfo is not None

    ledger.touch_session(SID, started=True)
    record = ledger.session(SID)
    assert record is not None
    assert record.started is True and record.closed is False

    ledger.touch_session(SID, closed=True)
    record = ledger.session(SID)
    assert record is not None
    assert record.started is True and record.closed is True

    ledger.touch_session(SID, closed=False)
    record = ledger.session(SID)
    assert record is not None
    assert record.closed is False
    assert record.options == options
    assert record.update_time >= created.update_time


def test_session_with_checkpointing_on(ledger: Ledger) -> None:
    ledger.add_session(SID, "/ws/a", {}, True, None)
    record = ledger.session(SID)
    assert record is not None and record.checkpointing is True


def test_touch_session_returns_the_new_update_time(ledger: Ledger) -> None:
    created = ledger.add_session(SID, "/ws/a", {}, True, None)
    touched = ledger.touch_session(SID)
    record = ledger.session(SID)
    assert record is not None
    assert record.update_time == touched
    assert touched >= created.update_time
    assert record.create_time == created.create_time


def test_unknown_session_is_none(ledger: Ledger) -> None:
    assert ledger.session(SID) is None
    assert ledger.session_by_request("nope") is None


def test_sessions_lists_every_session(ledger: Ledger) -> None:
    ledger.add_session(SID, "/ws/a", {}, True, None)
    ledger.add_session(OTHER, "/ws/b", {}, True, None)
    assert {r.session_id for r in ledger.sessions()} == {SID, OTHER}


def test_session_request_id_is_unique(ledger: Ledger) -> None:
    ledger.add_session(SID, "/ws/a", {}, True, "req-1")
    with pytest.raises(sqlite3.IntegrityError):
        ledger.add_session(OTHER, "/ws/b", {}, True, "req-1")
    found = ledger.session_by_request("req-1")
    assert found is not None and found.session_id == SID
    assert ledger.session(OTHER) is None  # the failed insert left nothing behind


def test_sessions_without_request_id_do_not_collide(ledger: Ledger) -> None:
    ledger.add_session(SID, "/ws/a", {}, True, None)
    ledger.add_session(OTHER, "/ws/b", {}, True, None)
    assert len(ledger.sessions()) == 2


def test_session_id_is_unique(ledger: Ledger) -> None:
    ledger.add_session(SID, "/ws/a", {}, True, None)
    with pytest.raises(sqlite3.IntegrityError):
        ledger.add_session(SID, "/ws/b", {}, True, None)


def test_rewind_request_id_is_unique(ledger: Ledger) -> None:
    ledger.add_session(SID, "/ws/a", {}, True, None)
    _begin(ledger, "r1", request_id="req-9")
    with pytest.raises(sqlite3.IntegrityError):
        _begin(ledger, "r2", request_id="req-9")
    found = ledger.rewind_by_request("req-9")
    assert found is not None and found.rewind_id == "r1"
    assert ledger.rewind("r2") is None


# Anchors


def test_complete_rewind_sets_the_anchor(ledger: Ledger) -> None:
    ledger.add_session(SID, "/ws/a", {}, True, None)
    assert ledger.anchor(SID) is None
    _begin(ledger, "r1")
    anchor = _anchor("a-1", "r1", size=1234, drops="p-2")
    ledger.complete_rewind("r1", {"last_message_id": "a-1"}, anchor)
    assert ledger.anchor(SID) == anchor


def test_a_newer_anchor_replaces_the_older_one(ledger: Ledger) -> None:
    ledger.add_session(SID, "/ws/a", {}, True, None)
    _begin(ledger, "r1")
    ledger.complete_rewind("r1", {}, _anchor("a-1", "r1", size=100, drops="p-2"))
    _begin(ledger, "r2")
    newer = _anchor("a-0", "r2", size=200, drops=None)
    ledger.complete_rewind("r2", {}, newer)
    assert ledger.anchor(SID) == newer


def test_files_only_rewind_leaves_the_anchor_alone(ledger: Ledger) -> None:
    ledger.add_session(SID, "/ws/a", {}, True, None)
    _begin(ledger, "r1")
    anchor = _anchor("a-1", "r1")
    ledger.complete_rewind("r1", {}, anchor)
    _begin(ledger, "r2")
    ledger.complete_rewind("r2", {}, None)
    assert ledger.anchor(SID) == anchor


def test_clear_anchor_only_clears_the_matching_anchor(ledger: Ledger) -> None:
    ledger.add_session(SID, "/ws/a", {}, True, None)
    _begin(ledger, "r1")
    ledger.complete_rewind("r1", {}, _anchor("a-1", "r1"))
    _begin(ledger, "r2")
    newer = _anchor("a-2", "r2")
    ledger.complete_rewind("r2", {}, newer)

    ledger.clear_anchor(SID, "a-1")  # the older cut: the newer one stays
    assert ledger.anchor(SID) == newer
    ledger.clear_anchor(OTHER, "a-2")  # another session's: nothing changes
    assert ledger.anchor(SID) == newer
    ledger.clear_anchor(SID, "a-2")
    assert ledger.anchor(SID) is None


# Rewinds


def test_begin_rewind_records_a_pending_intent(ledger: Ledger) -> None:
    ledger.add_session(SID, "/ws/a", {}, True, None)
    _begin(ledger, "r1", request_id="req-1")
    record = ledger.rewind("r1")
    assert record is not None
    assert record.state == "pending"
    assert record.cursor is None
    assert record.result is None
    assert record.session_id == SID
    assert record.request_id == "req-1"
    assert record.fingerprint == "fp-r1"
    assert record.message_id == "msg-r1"
    assert record.mode == "BOTH"
    assert record.plan == {"target": "msg-r1", "anchor": None}
    assert record.principal == "alice"
    assert record.occur_time.tzinfo is not None


def test_complete_rewind_marks_it_applied_and_stores_the_result(ledger: Ledger) -> None:
    ledger.add_session(SID, "/ws/a", {}, True, None)
    _begin(ledger, "r1")
    result = {"rewind_id": "r1", "files": {"can_rewind": True, "files_changed": ["a.txt"]}}
    ledger.complete_rewind("r1", result, None)
    record = ledger.rewind("r1")
    assert record is not None
    assert record.state == "applied"
    assert record.result == result
    assert record.cursor == 1


def test_complete_rewind_touches_the_session(ledger: Ledger) -> None:
    created = ledger.add_session(SID, "/ws/a", {}, True, None)
    _begin(ledger, "r1")
    ledger.complete_rewind("r1", {}, None)
    record = ledger.session(SID)
    assert record is not None and record.update_time >= created.update_time


def test_cursors_are_gap_free_when_an_intent_in_between_is_abandoned(ledger: Ledger) -> None:
    ledger.add_session(SID, "/ws/a", {}, True, None)
    ledger.add_session(OTHER, "/ws/b", {}, True, None)
    _begin(ledger, "r1")
    ledger.complete_rewind("r1", {}, None)
    _begin(ledger, "r2")  # its files half will be refused
    _begin(ledger, "r3", session_id=OTHER)
    ledger.abandon_rewind("r2")
    ledger.complete_rewind("r3", {}, None)
    _begin(ledger, "r4")
    ledger.complete_rewind("r4", {}, None)

    assert ledger.rewind("r2") is None
    cursors = [(r.rewind_id, r.cursor) for r in ledger.rewinds()]
    assert cursors == [("r1", 1), ("r3", 2), ("r4", 3)]
    assert [r.rewind_id for r in ledger.rewinds(OTHER)] == ["r3"]


def test_cursor_follows_completion_order_not_intent_order(ledger: Ledger) -> None:
    ledger.add_session(SID, "/ws/a", {}, True, None)
    _begin(ledger, "early")
    _begin(ledger, "late")
    ledger.complete_rewind("late", {}, None)
    ledger.complete_rewind("early", {}, None)
    late, early = ledger.rewind("late"), ledger.rewind("early")
    assert late is not None and early is not None
    assert (late.cursor, early.cursor) == (1, 2)


def test_abandon_rewind_does_not_drop_an_applied_rewind(ledger: Ledger) -> None:
    ledger.add_session(SID, "/ws/a", {}, True, None)
    _begin(ledger, "r1")
    ledger.complete_rewind("r1", {}, None)
    ledger.abandon_rewind("r1")
    record = ledger.rewind("r1")
    assert record is not None and record.state == "applied"


def test_pending_rewinds_lists_only_pending(ledger: Ledger) -> None:
    ledger.add_session(SID, "/ws/a", {}, True, None)
    for rid in ("r1", "r2", "r3", "r4"):
        _begin(ledger, rid)
    ledger.complete_rewind("r2", {}, None)
    ledger.abandon_rewind("r4")
    assert [r.rewind_id for r in ledger.pending_rewinds()] == ["r1", "r3"]
    assert all(r.state == "pending" for r in ledger.pending_rewinds())


def test_rewind_for_an_unknown_session_is_refused(ledger: Ledger) -> None:
    with pytest.raises(sqlite3.IntegrityError):
        _begin(ledger, "r1", session_id="no-such-session")


# Durability


def test_data_survives_closing_and_reopening_the_file(path: Path) -> None:
    first = Ledger(path)
    first.add_session(SID, "/ws/a", {"model": "m", "max_turns": 3}, False, "req-1")
    first.touch_session(SID, started=True)
    _begin(first, "r1", request_id="rw-1")
    anchor = _anchor("a-1", "r1", drops="p-9")
    first.complete_rewind("r1", {"ok": True}, anchor)
    _begin(first, "r2")
    first.close()

    second = Ledger(path)
    try:
        record = second.session(SID)
        assert record is not None
        assert record.options == {"model": "m", "max_turns": 3}
        assert record.checkpointing is False
        assert record.started is True
        assert second.session_by_request("req-1") == record
        assert second.anchor(SID) == anchor
        applied = second.rewind_by_request("rw-1")
        assert applied is not None
        assert (applied.state, applied.cursor, applied.result) == ("applied", 1, {"ok": True})
        assert [r.rewind_id for r in second.pending_rewinds()] == ["r2"]
        # Cursors continue after the reopen.
        second.complete_rewind("r2", {}, None)
        completed = second.rewind("r2")
        assert completed is not None and completed.cursor == 2
    finally:
        second.close()


def test_ledger_creates_its_directory(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "ledger.sqlite3"
    Ledger(path).close()
    assert path.exists()
