"""The heartbeat (replicas.Membership) on a real SQLite ledger whose renewals can be made to fail:
a replica that cannot renew gives up before its lease can run out, and a living one takes over
the sessions of one whose lease did."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from agent_rewind.errors import ReplicaUnavailable, StorageUnavailable
from agent_rewind.replicas import LEAST_LOADED, Membership, Owners
from agent_rewind.store.ledger import NewEvent, NewSession, ReplicaRecord, SessionRecord, now
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


# Fencing


async def test_an_incarnation_registered_again_elsewhere_is_fenced_at_its_next_renewal(
    tmp_path: Path,
) -> None:
    """Its renewal is refused (not an error): it says it is fenced, tells `on_fenced` once, and
    every later renewal is refused without asking the ledger; its writes are refused too."""
    ledger = await SqliteLedger.open(tmp_path / "ledger.sqlite3")
    told: list[str] = []

    async def on_fenced() -> None:
        told.append("fenced")

    await ledger.register_replica("pod-0", "before:1", 60)  # an incarnation before this one
    membership = Membership(ledger, "pod-0", "a:1", 60, on_fenced)
    try:
        joined = await membership.join()
        assert (joined.replica_id, joined.address, joined.epoch, joined.alive) == ("pod-0", "a:1", 2, True)
        assert membership.epoch == 2
        assert await membership.renew() is True, "the current incarnation renews"
        assert not membership.fenced
        await ledger.register_replica("pod-0", "elsewhere:1", 60)  # restarted elsewhere
        assert await membership.renew() is False
        assert membership.fenced and told == ["fenced"]
        assert await membership.renew() is False, "still fenced off"
        assert told == ["fenced"], "told once"
        with pytest.raises(ReplicaUnavailable):
            await ledger.add_session(NewSession(SID, "/ws", {}, True, replica="pod-0"))
    finally:
        await membership.leave()
        await ledger.close()


async def test_the_heartbeat_of_a_fenced_incarnation_stops_and_leaves_the_new_one_s_lease_alone(
    tmp_path: Path,
) -> None:
    ledger = await SqliteLedger.open(tmp_path / "ledger.sqlite3")
    fenced = asyncio.Event()

    async def on_fenced() -> None:
        fenced.set()

    membership = Membership(ledger, "pod-0", "a:1", 1.2, on_fenced)
    try:
        await membership.join()
        newer = await ledger.register_replica("pod-0", "elsewhere:1", 60)
        await asyncio.wait_for(fenced.wait(), 5)
        assert membership.fenced
        await membership.leave()  # a fenced incarnation does not retire the newer one's lease
        (record,) = await ledger.replicas()
        assert (record.epoch, record.address, record.alive) == (newer.epoch, "elsewhere:1", True)
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


async def test_one_failed_renewal_is_not_a_lost_lease(tmp_path: Path) -> None:
    """A beat that cannot reach the ledger leaves the lease to run: the replica gives up only
    once no renewal succeeded for two thirds of the lease, so one miss followed by a renewal is
    nothing."""
    ledger = await SqliteLedger.open(tmp_path / "ledger.sqlite3")
    lost = asyncio.Event()

    async def on_lease_lost() -> None:
        lost.set()

    membership = Membership(ledger, "pod-0", "a:1", 2.4, on_lease_lost=on_lease_lost)
    renewals = _Renewals(ledger, "down")
    second = asyncio.create_task(renewals.started(2))
    giving_up = asyncio.create_task(lost.wait())
    try:
        with capture_logs() as logged:
            await membership.join()
            await asyncio.wait([second, giving_up], timeout=5, return_when=asyncio.FIRST_COMPLETED)
        assert second.done() and not lost.is_set(), "gave up after one missed beat"
        assert not membership.lease_lost
        (failed,) = [e for e in logged if e["log_level"] == "warning"]
        assert failed["error"] == str(StorageUnavailable("the database is away")), "says why"
    finally:
        second.cancel()
        giving_up.cancel()
        await membership.leave()
        await ledger.close()


async def test_a_lease_lost_and_renewed_again_is_no_longer_lost(tmp_path: Path) -> None:
    """Without `on_lease_lost` the heartbeat goes on past a lost lease; the next renewal that
    succeeds says so (`lease_lost` is False again), and a later loss is seen again."""
    ledger = await SqliteLedger.open(tmp_path / "ledger.sqlite3")
    membership = Membership(ledger, "pod-0", "a:1", 0.6)
    renewals = _Renewals(ledger, *["down"] * 4, "ok", "ok", *["down"] * 4)
    try:
        await membership.join()
        await renewals.started(4)  # three beats without a renewal: the whole lease
        assert membership.lease_lost
        await renewals.started(6)  # the fifth renewed
        assert not membership.lease_lost
        await renewals.started(10)  # three more without
        assert membership.lease_lost
    finally:
        await membership.leave()
        await ledger.close()


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


async def test_leaving_ends_the_lease_at_once_and_the_directory_counts_only_the_living(
    tmp_path: Path,
) -> None:
    ledger = await SqliteLedger.open(tmp_path / "ledger.sqlite3")
    await ledger.register_replica("pod-1", "b:1", 60)
    await ledger.register_replica("pod-2", "c:1", 0)  # its lease ran out
    membership = Membership(ledger, "pod-0", "a:1", 60)
    try:
        await membership.join()
        assert membership.alive == 2
        assert [r.replica_id for r in await membership.replicas()] == ["pod-0", "pod-1"]
        await membership.leave()
        assert [(r.replica_id, r.alive) for r in await ledger.replicas()] == [
            ("pod-0", False),
            ("pod-1", True),
            ("pod-2", False),
        ]
    finally:
        await membership.leave()
        await ledger.close()


async def test_a_replica_that_never_joined_leaves_without_a_trace(tmp_path: Path) -> None:
    ledger = await SqliteLedger.open(tmp_path / "ledger.sqlite3")
    try:
        await Membership(ledger, "pod-0", "a:1", 60).leave()
        assert await ledger.replicas() == []
    finally:
        await ledger.close()


# Takeover


async def test_only_a_dead_replica_that_owns_sessions_or_an_unfinished_erasure_is_taken_over(
    tmp_path: Path,
) -> None:
    """pod-0 died owning nothing: left as it is. pod-2 died with a deleted session's erasure
    unfinished (its files are on the shared disk): taken over, the erasure is the taker's to
    finish. pod-3 died owning a session: taken over. pod-4 is alive: left alone."""
    ledger = await SqliteLedger.open(tmp_path / "ledger.sqlite3")
    erased, owned, living = (
        SID,
        "1c8e4d2f-6b9e-4e7f-8a21-3b4c5d6e7f80",
        "2d9f5e3a-7c0f-4f8a-9b32-4c5d6e7f8091",
    )
    for replica_id in ("pod-0", "pod-2", "pod-3"):
        await ledger.register_replica(replica_id, f"{replica_id}:1", 0)
    await ledger.register_replica("pod-4", "pod-4:1", 60)
    await ledger.add_session(NewSession(erased, "/ws/e", {}, True, replica="pod-2"))
    await ledger.erase_session(
        erased, NewEvent("DELETED", erased, "", "alice", {}), erasure={"paths": ["/ws/e"]}
    )
    await ledger.add_session(NewSession(owned, "/ws/o", {}, True, replica="pod-3"))
    await ledger.add_session(NewSession(living, "/ws/l", {}, True, replica="pod-4"))
    taken: list[tuple[str, list[str]]] = []
    done = asyncio.Event()

    async def take_over(replica_id: str, session_ids: list[str]) -> None:
        taken.append((replica_id, session_ids))
        if replica_id == "pod-3":
            done.set()

    membership = Membership(ledger, "pod-1", "b:1", 1.2, take_over=take_over)
    try:
        await membership.join()
        await asyncio.wait_for(done.wait(), 5)
        assert taken == [("pod-2", [erased]), ("pod-3", [owned])]
        epochs = {r.replica_id: r.epoch for r in await ledger.replicas()}
        assert epochs == {"pod-0": 1, "pod-1": 1, "pod-2": 2, "pod-3": 2, "pod-4": 1}
        tombstone = await ledger.tombstone(erased)
        assert tombstone is not None and tombstone.replica == "pod-1"
        assert [(s.session_id, s.replica) for s in await ledger.sessions()] == sorted(
            [(owned, "pod-1"), (living, "pod-4")]
        )
    finally:
        await membership.leave()
        await ledger.close()


# Owners


async def _directory(tmp_path: Path) -> tuple[SqliteLedger, Membership]:
    """pod-1 (this replica, joined), pod-0 and pod-2 alive, pod-9 whose lease ran out."""
    ledger = await SqliteLedger.open(tmp_path / "ledger.sqlite3")
    await ledger.register_replica("pod-0", "a:1", 60)
    await ledger.register_replica("pod-2", "c:1", 60)
    await ledger.register_replica("pod-9", "z:1", 0)
    membership = Membership(ledger, "pod-1", "b:1", 60)
    await membership.join()
    return ledger, membership


async def test_a_session_held_here_owned_here_or_owned_by_none_is_answered_here(tmp_path: Path) -> None:
    ledger, membership = await _directory(tmp_path)
    held, mine, unowned = SID, "1c8e4d2f-6b9e-4e7f-8a21-3b4c5d6e7f80", "2d9f5e3a-7c0f-4f8a-9b32-4c5d6e7f8091"
    try:
        await ledger.add_session(NewSession(held, "/ws/h", {}, True, replica="pod-0"))
        await ledger.add_session(NewSession(mine, "/ws/m", {}, True, replica="pod-1"))
        await ledger.add_session(NewSession(unowned, "/ws/u", {}, True))
        owners = Owners(ledger, membership, lambda session_id: session_id == held)
        assert await owners.owner(held) is None, "its worker is here, whatever the ledger says"
        assert await owners.owner(mine) is None
        assert await owners.owner(unowned) is None
        assert await owners.owner("3e0a6f4b-8d1a-4a9b-8c43-5d6e7f8091a2") is None, "no such session"
    finally:
        await membership.leave()
        await ledger.close()


async def test_a_session_owned_elsewhere_is_forwarded_to_its_owner_asked_of_the_ledger_once(
    tmp_path: Path,
) -> None:
    """The owner never changes while it lives, so it is remembered: the ledger is asked once."""
    ledger, membership = await _directory(tmp_path)
    asked: list[str] = []
    session = ledger.session

    async def counted(session_id: str) -> SessionRecord | None:
        asked.append(session_id)
        return await session(session_id)

    try:
        await ledger.add_session(NewSession(SID, "/ws", {}, True, replica="pod-2"))
        ledger.session = counted  # type: ignore[method-assign]
        owners = Owners(ledger, membership, lambda session_id: False)
        for _ in range(2):
            owner = await owners.owner(SID)
            assert owner is not None and (owner.replica_id, owner.address) == ("pod-2", "c:1")
        assert asked == [SID]
        owners.forget(SID)  # the owner did not answer for it: asked again
        owner = await owners.owner(SID)
        assert owner is not None and owner.replica_id == "pod-2" and asked == [SID, SID]
    finally:
        await membership.leave()
        await ledger.close()


async def test_a_session_whose_owner_is_dead_or_unknown_is_replica_unavailable(tmp_path: Path) -> None:
    ledger, membership = await _directory(tmp_path)
    other = "1c8e4d2f-6b9e-4e7f-8a21-3b4c5d6e7f80"
    try:
        await ledger.add_session(NewSession(SID, "/ws", {}, True, replica="pod-9"))
        await ledger.add_session(NewSession(other, "/ws/o", {}, True, replica="pod-7"))
        owners = Owners(ledger, membership, lambda session_id: False)
        with pytest.raises(ReplicaUnavailable, match="lease has run out") as dead:
            await owners.owner(SID)
        assert dead.value.metadata == {"replica": "pod-9"}
        with pytest.raises(ReplicaUnavailable, match="not in the replica directory"):
            await owners.owner(other)
    finally:
        await membership.leave()
        await ledger.close()


async def test_a_replica_that_joined_or_came_back_since_the_last_beat_is_found(tmp_path: Path) -> None:
    """The directory is read again when a replica is missing from it or dead in it."""
    ledger, membership = await _directory(tmp_path)
    try:
        owners = Owners(ledger, membership, lambda session_id: False)
        await ledger.register_replica("pod-3", "d:1", 60)  # joined after this one's last read
        await ledger.register_replica("pod-9", "z:2", 60)  # back, at a new address
        joined = await owners.replica("pod-3")
        back = await owners.replica("pod-9")
        assert (joined.address, joined.alive) == ("d:1", True)
        assert (back.address, back.epoch, back.alive) == ("z:2", 2, True)
    finally:
        await membership.leave()
        await ledger.close()


async def test_a_replica_not_reached_where_the_directory_said_is_found_where_it_came_back(
    tmp_path: Path,
) -> None:
    ledger, membership = await _directory(tmp_path)
    try:
        owners = Owners(ledger, membership, lambda session_id: False)
        assert (await owners.replica("pod-0")).address == "a:1"
        await ledger.register_replica("pod-0", "a:2", 60)  # restarted elsewhere
        assert (await owners.replica("pod-0")).address == "a:1", "the directory as last read"
        await owners.forget_address("pod-0")
        assert (await owners.replica("pod-0")).address == "a:2"
    finally:
        await membership.leave()
        await ledger.close()


async def test_the_others_are_every_living_replica_but_this_one(tmp_path: Path) -> None:
    ledger, membership = await _directory(tmp_path)
    try:
        owners = Owners(ledger, membership, lambda session_id: False)
        assert [r.replica_id for r in await owners.others()] == ["pod-0", "pod-2"]
    finally:
        await membership.leave()
        await ledger.close()


async def test_a_new_session_goes_to_the_least_loaded_living_replica_and_ties_stay_here(
    tmp_path: Path,
) -> None:
    ledger, membership = await _directory(tmp_path)
    ids = iter(f"0b7f3c1e-5a8d-4d6e-9f10-2a3b4c5d6e{n:02x}" for n in range(64))

    async def owned_by(replica_id: str, n: int) -> None:
        for _ in range(n):
            await ledger.add_session(NewSession(next(ids), "/ws", {}, True, replica=replica_id))

    try:
        local = Owners(ledger, membership, lambda session_id: False)
        least = Owners(ledger, membership, lambda session_id: False, LEAST_LOADED)
        # pod-9 is dead and owns nothing: never chosen. pod-1 (here) owns 2, pod-0 and pod-2 own 2.
        await owned_by("pod-0", 2)
        await owned_by("pod-1", 2)
        await owned_by("pod-2", 2)
        assert await least.place() is None, "a tie: here, no hop for nothing"
        await owned_by("pod-1", 1)
        placed = await least.place()
        assert placed is not None and placed.replica_id == "pod-0", "the fewest, first by id"
        assert await local.place() is None, "--placement local: always here"
        await owned_by("pod-0", 2)
        await owned_by("pod-2", 2)
        assert await least.place() is None, "this one owns the fewest"
    finally:
        await membership.leave()
        await ledger.close()
