"""What the RPC layer keeps between calls: bounded, principal-checked on every read, and dropped
with a deleted session (the hub tells it: tests/unit/events/test_hub.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from agent_rewind.access import Permission, Principal
from agent_rewind.api.v1 import rewind_service_pb2
from agent_rewind.errors import QuotaExceeded, SessionNotFound
from agent_rewind.rpc.caches import EventMessages, ServiceCaches, StoredRecords, WatchStreams
from agent_rewind.store.ledger import EventRecord, PointsHead, SessionRecord
from agent_rewind.transcript.entries import RewindPoint

T = datetime(2026, 12, 6, tzinfo=UTC)
ALICE = Principal("alice", frozenset({Permission.SESSIONS_READ}))
BOB = Principal("bob", frozenset({Permission.SESSIONS_READ}))
ADMIN = Principal("ops", frozenset({Permission.ADMIN}))


def _event(cursor: int, session_id: str = "s1", padding: int = 0) -> EventRecord:
    return EventRecord(cursor, "REWIND_APPLIED", session_id, "r1", "alice", T, {"pad": "x" * padding})


def _decoded(encoded: bytes) -> tuple[int, str]:
    message = rewind_service_pb2.WatchRewindEventsResponse.FromString(encoded)
    return message.event.cursor, message.event.session_id


def test_an_event_is_encoded_once_for_every_watcher() -> None:
    messages = EventMessages()
    first = messages.response(_event(1))
    assert messages.response(_event(1)) is first
    assert _decoded(first) == (1, "s1")
    assert messages.held == (1, len(first))


def test_a_cursor_kept_for_another_session_is_never_sent_for_this_one() -> None:
    """A cursor's message is the session's it was made for: a log whose cursors began again
    (a ledger restored from a backup) must not send one session's event as another's."""
    messages = EventMessages()
    messages.response(_event(1, "s1"))
    assert _decoded(messages.response(_event(1, "s2"))) == (1, "s2")


def test_the_newest_events_are_kept_up_to_the_count_and_the_bytes() -> None:
    by_count = EventMessages(size=2)
    for cursor in (1, 2, 3):
        by_count.response(_event(cursor))
    kept = by_count.held
    assert kept[0] == 2
    third = by_count.response(_event(3))
    assert by_count.response(_event(3)) is third, "the newest is kept"
    assert by_count.held == kept, "and asked for again, nothing is added"

    one = len(EventMessages().response(_event(1, padding=100)))
    by_bytes = EventMessages(max_bytes=2 * one)
    for cursor in (1, 2, 3):
        by_bytes.response(_event(cursor, padding=100))
    assert by_bytes.held[0] == 2 and by_bytes.held[1] <= 2 * one
    exactly = EventMessages(max_bytes=one)
    exactly.response(_event(1, padding=100))
    assert exactly.held == (1, one), "a message of exactly the bound is kept"


def test_a_deleted_session_s_events_go_and_their_bytes_with_them() -> None:
    messages = EventMessages()
    mine = messages.response(_event(1, "s1"))
    theirs = messages.response(_event(2, "s2"))
    messages.forget("s1")
    assert messages.held == (1, len(theirs))
    assert messages.response(_event(1, "s1")) is not mine


def _record(session_id: str, principal: str) -> SessionRecord:
    return SessionRecord(session_id, "/ws", {}, True, T, T, False, True, principal=principal)


class _Ledger:
    def __init__(self) -> None:
        self.loads: list[str] = []

    async def load(self, session_id: str, principal: Principal) -> SessionRecord:
        self.loads.append(session_id)
        return _record(session_id, "alice")


async def test_a_kept_record_is_shown_only_to_a_principal_who_may_see_it() -> None:
    """The slip of issue 37: once one principal had loaded a session's record, another read it
    from the cache without the check."""
    ledger = _Ledger()
    records = StoredRecords()
    assert (await records.get("s1", ALICE, ledger.load)).principal == "alice"
    with pytest.raises(SessionNotFound):
        await records.get("s1", BOB, ledger.load)
    assert (await records.get("s1", ADMIN, ledger.load)).session_id == "s1"
    assert ledger.loads == ["s1"], "loaded once"


async def test_a_record_is_loaded_again_after_its_session_was_forgotten_or_pushed_out() -> None:
    ledger = _Ledger()
    records = StoredRecords(size=2)
    for sid in ("s1", "s2", "s3"):
        await records.get(sid, ALICE, ledger.load)
    assert "s1" not in records and "s2" in records and "s3" in records
    records.forget("s3")
    await records.get("s3", ALICE, ledger.load)
    assert ledger.loads == ["s1", "s2", "s3", "s3"]


def test_a_principal_holds_at_most_its_limit_of_watch_streams() -> None:
    streams = WatchStreams(2)
    with streams.held("alice"), streams.held("alice"):
        with pytest.raises(QuotaExceeded) as refused, streams.held("alice"):
            pass
        assert refused.value.metadata == {"limit": "watch_streams", "max": "2"}
        with streams.held("bob"):  # another's streams count apart
            assert streams.open("bob") == 1
        assert streams.open("alice") == 2
    assert streams.open("alice") == 0


def test_a_watch_stream_that_ends_in_an_error_is_counted_off() -> None:
    streams = WatchStreams(1)
    with pytest.raises(RuntimeError), streams.held("alice"):
        raise RuntimeError("the caller hung up")
    with streams.held("alice"):
        assert streams.open("alice") == 1


async def test_a_deleted_session_leaves_nothing_in_any_cache() -> None:
    caches = ServiceCaches()
    ledger = _Ledger()
    caches.events.response(_event(1, "s1"))
    theirs = caches.events.response(_event(2, "s2"))
    head = PointsHead("s1", 10, "", "u1", {}, 1, "m1", 0, 0, True, "")
    caches.pages.put("s1", 0, 10, head, [RewindPoint("m1", "", "hi", 0, T, True)])
    await caches.records.get("s1", ALICE, ledger.load)
    caches.forget("s1")
    assert caches.events.held == (1, len(theirs))
    assert caches.pages.points("s1", 0, 10, head) is None
    assert "s1" not in caches.records
