"""What each session holds, as last measured, summed per principal, and how far retention pruned
it (store/sql/storage.py), on SQLite and PostgreSQL alike."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from agent_rewind.store.ledger import Ledger, NewEvent, NewSession


async def _sessions(ledger: Ledger, *ids: str) -> None:
    for sid in ids:
        await ledger.add_session(NewSession(session_id=sid, cwd=f"/ws/{sid}", options={}, checkpointing=True))


async def test_usage_is_recorded_replaced_and_summed_per_principal(ledger: Ledger) -> None:
    await _sessions(ledger, "s-1", "s-2", "s-3")
    assert await ledger.usage("s-1") is None
    assert await ledger.principal_usage("alice") == 0
    await ledger.record_usage("s-1", "alice", 100, 20)
    await ledger.record_usage("s-2", "alice", 5, 1)
    await ledger.record_usage("s-3", "bob", 1 << 40, 7)  # past 32 bits
    await ledger.record_usage("s-1", "alice", 300, 40)  # measured again: replaced, not added
    got = await ledger.usage("s-1")
    assert got is not None and (got.principal, got.workspace_bytes, got.history_bytes) == ("alice", 300, 40)
    assert got.measure_time is not None and got.files_pruned_before is None
    assert await ledger.principal_usage("alice") == 346
    assert await ledger.principal_usage("bob") == (1 << 40) + 7
    assert await ledger.usage_totals() == (305 + (1 << 40), 48, 3)


async def test_the_pruned_mark_only_moves_later_and_keeps_the_usage(ledger: Ledger) -> None:
    await _sessions(ledger, "s-1")
    t0 = datetime(2026, 12, 1, tzinfo=UTC)
    await ledger.mark_files_pruned("s-1", "alice", t0)  # before any measurement: a row of its own
    got = await ledger.usage("s-1")
    assert got is not None and got.files_pruned_before == t0 and got.measure_time is None
    await ledger.record_usage("s-1", "alice", 10, 2)
    await ledger.mark_files_pruned("s-1", "alice", t0 + timedelta(days=1))
    await ledger.mark_files_pruned("s-1", "alice", t0)  # never back
    got = await ledger.usage("s-1")
    assert got is not None and got.files_pruned_before == t0 + timedelta(days=1)
    assert (got.workspace_bytes, got.history_bytes) == (10, 2)


async def test_a_measurement_that_ends_after_the_session_was_erased_records_nothing(ledger: Ledger) -> None:
    await _sessions(ledger, "s-1")
    await ledger.record_usage("s-1", "alice", 10, 1)
    await ledger.erase_session("s-1", NewEvent("SESSION_DELETED", "s-1"), erasure={"cwd": "/ws/s-1"})
    assert await ledger.usage("s-1") is None
    await ledger.record_usage("s-1", "alice", 10, 1)  # a walk that began before the deletion
    await ledger.record_usage("never", "alice", 10, 1)
    assert await ledger.usage("s-1") is None and await ledger.usage("never") is None
    assert await ledger.principal_usage("alice") == 0


async def test_a_page_s_snapshot_availability_read_alone_is_what_all_records_say(ledger: Ledger) -> None:
    """`snapshots_served` (a page's points, from their own rows and one index entry) against
    `Snapshots.available` (every record, in memory), on a history with incomplete and pruned
    snapshots and a prompt snapshotted twice (a retried turn)."""
    from agent_rewind.snapshots.taking import Snapshots
    from agent_rewind.store.ledger import NewSnapshot

    await _sessions(ledger, "s-1", "s-2")
    plan = [
        ("turn_start", "p1", "t", True),
        ("turn_end", "p1", "t", True),
        ("turn_start", "p2", "t", True),
        ("turn_end", "p2", None, False),  # incomplete: p1 and p2 cannot be served
        ("turn_start", "p3", "t", True),
        ("turn_end", "p3", "t", True),
        ("turn_start", "p4", None, False),  # its own start incomplete
        ("turn_start", "p4", "t", True),  # retried: the newest start counts
        ("turn_end", "p4", "t", True),
        ("turn_start", "p5", "t", True),
    ]
    for kind, ref, tree, complete in plan:
        await ledger.add_snapshot(NewSnapshot("s-1", kind, ref, tree, complete, ""))
    await ledger.add_snapshot(NewSnapshot("s-2", "turn_start", "p1", None, False, ""))  # another session's
    every = Snapshots.available(None, await ledger.snapshots("s-1"))  # type: ignore[arg-type]
    refs = ["p1", "p2", "p3", "p4", "p5", "never"]
    assert await ledger.snapshots_served("s-1", refs) == every
    # (p3's later snapshots include p4's incomplete first start: a rewind to p3 would read it.)
    assert every == {"p1": False, "p2": False, "p3": False, "p4": True, "p5": True}
    assert await ledger.snapshots_served("s-1", ["p4"]) == {"p4": True}
    assert await ledger.snapshots_served("s-1", []) == {}
    assert await ledger.newest_snapshot("s-2") > await ledger.newest_snapshot("s-1") > 0
    assert await ledger.newest_snapshot("none") == 0
