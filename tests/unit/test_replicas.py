"""The heartbeat (replicas.Membership) on a real SQLite ledger whose renewals can be made to fail:
a replica that cannot renew gives up before its lease can run out, and a living one takes over
the sessions of one whose lease did."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

from agent_rewind.errors import StorageUnavailable
from agent_rewind.replicas import Membership, Owners
from agent_rewind.store.ledger import NewSession, ReplicaRecord, now
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

        ledger.renew_replica = unreachable  # type: ignore[method-assign, assignment]
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


# The heartbeat and the lease


class _Renewals:
    """The ledger's renewals, each call doing the next of `script` ("ok": renewed at once, with
    no write to wait for; "down": the ledger is away; "hung": it never answers; "ok" once the
    script is done); each call is announced."""

    def __init__(self, ledger: SqliteLedger, *script: str) -> None:
        self._script = list(script)
        self.calls: list[str] = []
        self._begun: dict[int, asyncio.Event] = {}
        ledger.renew_replica = self  # type: ignore[method-assign]

    async def __call__(self, replica_id: str, epoch: int, lease_s: float) -> ReplicaRecord | None:
        mode = self._script[len(self.calls)] if len(self.calls) < len(self._script) else "ok"
        self.calls.append(mode)
        self._begun.setdefault(len(self.calls), asyncio.Event()).set()
        if mode == "down":
            raise StorageUnavailable("the database is away")
        if mode == "hung":
            await asyncio.Event().wait()
        return ReplicaRecord(replica_id, "a:1", epoch, now() + timedelta(seconds=lease_s), True)

    async def started(self, n: int) -> None:
        """Until the n-th call has begun (so the beat has handled the one before it)."""
        await self._begun.setdefault(n, asyncio.Event()).wait()


async def test_a_replica_whose_renewals_hang_gives_up_before_its_lease_runs_out(tmp_path: Path) -> None:
    """A renewal stuck on a connection that never answers is given up after a sixth of the
    lease, and the beats keep their pace, so the replica still gives up before its lease can
    run out (and another replica take its sessions over)."""
    ledger = await SqliteLedger.open(tmp_path / "ledger.sqlite3")
    lost = asyncio.Event()
    lease = 3.0

    async def on_lease_lost() -> None:
        lost.set()

    membership = Membership(ledger, "pod-0", "a:1", lease, on_lease_lost=on_lease_lost)
    _Renewals(ledger, *["hung"] * 10)
    try:
        joined = asyncio.get_running_loop().time()
        await membership.join()
        await asyncio.wait_for(lost.wait(), 5)
        gave_up = asyncio.get_running_loop().time()
        (record,) = await ledger.replicas()
        assert record.alive, "it gave up only once its lease had run out"
        assert gave_up - joined < lease
    finally:
        await membership.leave()
        await ledger.close()


async def test_leaving_as_a_renewal_ends_stops_the_heartbeat(tmp_path: Path) -> None:
    """The heartbeat is cancelled in the very turn of the loop in which a renewal ended (here:
    failed): the cancellation is not lost, so `leave` returns (it waited for the loop forever
    when the renewal's bound was asyncio.wait_for, on Python 3.11)."""
    ledger = await SqliteLedger.open(tmp_path / "ledger.sqlite3")
    membership = Membership(ledger, "pod-0", "a:1", 0.6)
    renewals = _Renewals(ledger, "down")
    try:
        await membership.join()
        await renewals.started(1)  # the renewal has failed; the beat has not yet seen it
        leaving = asyncio.create_task(membership.leave())
        await asyncio.wait([leaving], timeout=5)
        assert leaving.done(), "leave waited for a heartbeat that went on beating"
        (record,) = await ledger.replicas()
        assert not record.alive, "its lease was ended"
    finally:
        await membership.leave()
        await ledger.close()
