"""The heartbeat (replicas.Membership) on a real SQLite ledger whose renewals can be made to fail:
a replica that cannot renew gives up before its lease can run out, and a living one takes over
the sessions of one whose lease did."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent_rewind.errors import StorageUnavailable
from agent_rewind.replicas import Membership, Owners
from agent_rewind.store.ledger import NewSession
from agent_rewind.store.sqlite import SqliteLedger

SID = "0b7f3c1e-5a8d-4d6e-9f10-2a3b4c5d6e7f"


async def test_a_replica_that_cannot_renew_gives_up_before_its_lease_runs_out(tmp_path: Path) -> None:
    ledger = await SqliteLedger.open(tmp_path / "ledger.sqlite3")
    lost = asyncio.Event()
    lease = 3.0

    async def on_lease_lost() -> None:
        lost.set()

    membership = Membership(ledger, "pod-0", "a:1", lease, on_lease_lost=on_lease_lost)
    try:
        await membership.join()
        broken = asyncio.get_running_loop().time()

        async def unreachable(*args: object) -> None:
            raise StorageUnavailable("the database is away")

        ledger.renew_replica = unreachable  # type: ignore[method-assign]
        await asyncio.wait_for(lost.wait(), 5)
        gave_up = asyncio.get_running_loop().time()
        (record,) = await ledger.replicas()
        assert record.alive, "it gave up while its lease was still current"
        assert membership.lease_lost and gave_up - broken < lease
    finally:
        await membership.leave()
        await ledger.close()


async def test_a_living_replica_takes_over_the_sessions_of_one_whose_lease_ran_out(tmp_path: Path) -> None:
    ledger = await SqliteLedger.open(tmp_path / "ledger.sqlite3")
    await ledger.register_replica("pod-0", "a:1", 0.05)  # a replica that died at once
    await ledger.add_session(NewSession(SID, "/ws", {}, True, replica="pod-0"))
    taken: list[tuple[str, list[str]]] = []
    done = asyncio.Event()

    async def take_over(replica_id: str, session_ids: list[str]) -> None:
        taken.append((replica_id, session_ids))
        done.set()

    membership = Membership(ledger, "pod-1", "b:1", 0.6, take_over=take_over)
    try:
        await membership.join()
        await asyncio.wait_for(done.wait(), 5)
        assert taken == [("pod-0", [SID])]
        record = await ledger.session(SID)
        assert record is not None and record.replica == "pod-1"
    finally:
        await membership.leave()
        await ledger.close()


async def test_a_remembered_owner_that_was_taken_over_is_asked_of_the_ledger_again(tmp_path: Path) -> None:
    ledger = await SqliteLedger.open(tmp_path / "ledger.sqlite3")
    await ledger.register_replica("pod-0", "a:1", 0.3)
    await ledger.register_replica("pod-1", "b:1", 60)
    await ledger.add_session(NewSession(SID, "/ws", {}, True, replica="pod-0"))
    membership = Membership(ledger, "pod-2", "c:1", 60)
    try:
        await membership.join()
        owners = Owners(ledger, membership, lambda session_id: False)
        first = await owners.owner(SID)
        assert first is not None and first.replica_id == "pod-0"
        await asyncio.sleep(0.4)  # pod-0's lease runs out; pod-1 takes its sessions over
        assert await ledger.take_over("pod-0", "pod-1") == [SID]
        await membership.refresh()  # its heartbeat: the directory says pod-0's lease ran out
        now = await owners.owner(SID)
        assert now is not None and now.replica_id == "pod-1", "not the remembered, dead owner"
    finally:
        await membership.leave()
        await ledger.close()
