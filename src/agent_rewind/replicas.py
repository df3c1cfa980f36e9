"""The replica directory: this replica's entry in it (registered at start, renewed by a
heartbeat, retired at a clean shutdown), and which replica owns each session.

Every registration gives the replica a new epoch in the ledger (`register_replica`): the epoch is
the fencing token of this incarnation. Should another process register under the same id (a
replica restarted while this one still runs, or a takeover), this one's renewals are refused from
then on, and so is every ledger write it makes (`Ledger.fence`): it is fenced off, and says so
in its log and on its health. Leases run by the database's clock (PostgreSQL's), so the
replicas' clocks need not agree. A ledger that cannot be reached
leaves the lease to run out: the heartbeat tries again at its next beat.

Where every replica mounts the same storage (--shared-storage), a replica whose lease ran out
is taken over by the first other replica to see it at its heartbeat: in one transaction, the
dead one is fenced off (a new epoch) and its sessions become the taker's (`Ledger.take_over`).
A replica that could not renew its lease for two thirds of it then gives up before anyone can
take over (`on_lease_lost`): it ends its agents, so two replicas never run one session.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable

import structlog

from agent_rewind.errors import ReplicaUnavailable
from agent_rewind.store.ledger import Ledger, ReplicaRecord

log = structlog.get_logger(__name__)


class Membership:
    """This replica in the directory (see the module docstring)."""

    def __init__(
        self,
        ledger: Ledger,
        replica_id: str,
        address: str,
        lease_s: float,
        on_fenced: Callable[[], Awaitable[None]] | None = None,
        *,
        on_lease_lost: Callable[[], Awaitable[None]] | None = None,
        take_over: Callable[[str, list[str]], Awaitable[None]] | None = None,
    ) -> None:
        """`on_fenced`: called once when a renewal finds this incarnation fenced off.
        `on_lease_lost`: called once when no renewal succeeded for two thirds of the lease.
        `take_over`: given, this replica takes over replicas whose lease ran out and hands it
        each one's id and the sessions it took."""
        self.replica_id = replica_id
        self.address = address
        self.lease_s = lease_s
        self.epoch = 0
        # Another incarnation registered under this id since: nothing this one does may count.
        self.fenced = False
        self._ledger = ledger
        self.on_fenced = on_fenced
        self.on_lease_lost = on_lease_lost
        self.take_over = take_over
        # When the last renewal that succeeded was sent (the loop's clock): the lease runs at
        # least until then plus its length, by the database's clock.
        self._renewed_at = 0.0
        self.lease_lost = False
        self._heartbeat: asyncio.Task[None] | None = None
        # Replicas whose lease was current at the last beat (GetCapabilities.replicas).
        self.alive = 1
        # Every replica in the directory, by id, as read at the last beat (or since, on a miss).
        self.directory: dict[str, ReplicaRecord] = {}

    async def join(self) -> ReplicaRecord:
        """Registers this replica (a new epoch), fences the ledger's writes with that epoch, and
        starts the heartbeat."""
        sent = asyncio.get_running_loop().time()
        record = await self._ledger.register_replica(self.replica_id, self.address, self.lease_s)
        self._renewed_at = sent
        self.epoch = record.epoch
        self.fenced = False
        self._ledger.fence(self.replica_id, self.epoch)
        log.info("replica registered", replica_id=self.replica_id, address=self.address, epoch=self.epoch)
        await self._count()
        self._heartbeat = asyncio.create_task(self._beat(), name="replica-heartbeat")
        return record

    async def _count(self) -> None:
        await self.refresh()

    async def refresh(self) -> None:
        """Reads the directory again."""
        records = await self._ledger.replicas()
        self.directory = {r.replica_id: r for r in records}
        self.alive = max(1, sum(1 for r in records if r.alive))

    async def renew(self) -> bool:
        """One heartbeat: False when this incarnation has been fenced off."""
        if self.fenced:
            return False
        renewed = await self._ledger.renew_replica(self.replica_id, self.epoch, self.lease_s)
        if renewed is None:
            self.fenced = True
            log.error(
                "this replica was registered again elsewhere (a newer epoch); it is fenced off: "
                "its writes are refused, its health is NOT_SERVING",
                replica_id=self.replica_id,
                epoch=self.epoch,
            )
            if self.on_fenced is not None:
                await self.on_fenced()
            return False
        return True

    async def _beat(self) -> None:
        loop = asyncio.get_running_loop()
        beat = loop.time()
        while True:
            # A third of the lease apart however long a beat took (a renewal that hangs to its
            # bound included), so a lease not renewed is seen lost by two thirds of it, not later.
            beat = max(beat + self.lease_s / 3, loop.time())
            await asyncio.sleep(beat - loop.time())
            sent = loop.time()
            try:
                # Bounded, so a hung connection cannot hold the beat past the lease. Not
                # asyncio.wait_for: on 3.11 it loses a cancellation that comes as the renewal
                # ends, and `leave` would wait for this loop forever.
                async with asyncio.timeout(self.lease_s / 6):
                    renewed = await self.renew()
                if not renewed:
                    return
                self._renewed_at = sent
                self.lease_lost = False
                await self._count()
                if self.take_over is not None:
                    await self._take_over_the_dead()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # the ledger is away: the lease runs; try at the next beat
                log.warning(
                    "replica heartbeat failed (renewing, or counting the replicas)",
                    error=str(err) or repr(err),
                )
                if loop.time() - self._renewed_at >= self.lease_s * 2 / 3 and not self.lease_lost:
                    self.lease_lost = True
                    log.error(
                        "this replica's lease was not renewed for two thirds of it; it may run out",
                        replica_id=self.replica_id,
                    )
                    if self.on_lease_lost is not None:
                        await self.on_lease_lost()
                        return  # it gives up (its sessions may be taken over): no more beats

    async def _take_over_the_dead(self) -> None:
        """Takes over each replica whose lease ran out while it still owns sessions, or a deleted
        session's erasure it did not finish (its files are on the shared disk too)."""
        assert self.take_over is not None
        dead = [
            r.replica_id for r in self.directory.values() if not r.alive and r.replica_id != self.replica_id
        ]
        if not dead:
            return
        owning = await self._ledger.session_counts()
        erasing = {t.replica for t in await self._ledger.unfinished_erasures()}
        for replica_id in dead:
            if not owning.get(replica_id) and replica_id not in erasing:
                continue
            taken = await self._ledger.take_over(replica_id, self.replica_id)
            if taken is None:
                continue  # it came back meanwhile
            log.warning(
                "took over the sessions of a replica whose lease ran out",
                replica_id=replica_id,
                sessions=len(taken),
            )
            await self.take_over(replica_id, taken)

    async def replicas(self) -> list[ReplicaRecord]:
        """Every replica of the deployment whose lease is current."""
        return [r for r in await self._ledger.replicas() if r.alive]

    async def leave(self) -> None:
        """Stops the heartbeat and ends the lease now (a clean shutdown)."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
            self._heartbeat = None
        if self.epoch and not self.fenced:
            try:
                await self._ledger.retire_replica(self.replica_id, self.epoch)
            except Exception as err:
                log.warning("could not retire this replica's lease; it runs out", error=str(err))


class Elsewhere(Exception):
    """The call belongs to another replica: the RPC layer forwards it there, unchanged. Raised
    before anything of the call was done here."""

    def __init__(self, replica: ReplicaRecord) -> None:
        super().__init__(f"owned by replica {replica.replica_id} at {replica.address}")
        self.replica = replica


# Placements of new sessions (--placement).
LOCAL = "local"
LEAST_LOADED = "least-loaded"
PLACEMENTS = (LOCAL, LEAST_LOADED)


class Owners:
    """Which replica owns a session, and which one a new session goes to.

    A session is owned by the replica that created it (`sessions.replica`); it never moves
    while that replica exists, so the answer is remembered. Where a replica is reached is the
    directory's, read at each heartbeat and again on a miss.
    """

    _REMEMBERED = 100_000

    def __init__(
        self,
        ledger: Ledger,
        membership: Membership,
        local: Callable[[str], bool],
        placement: str = LOCAL,
    ) -> None:
        """`local`: whether this replica holds a session (its registry's workers)."""
        self._ledger = ledger
        self._membership = membership
        self._local = local
        self.placement = placement
        self._owners: OrderedDict[str, str] = OrderedDict()

    @property
    def replica_id(self) -> str:
        return self._membership.replica_id

    async def owner(self, session_id: str) -> ReplicaRecord | None:
        """The replica to forward a call for `session_id` to; None when this replica answers it
        (it holds the session, or no replica does: the session does not exist).
        REPLICA_UNAVAILABLE when the owner's lease has run out."""
        if self._local(session_id):
            return None
        remembered = self._owners.get(session_id)
        if remembered is not None:
            try:
                return await self.replica(remembered)
            except ReplicaUnavailable:
                self.forget(session_id)  # taken over by another, perhaps: the ledger says
        record = await self._ledger.session(session_id)
        if record is None or record.replica in ("", self.replica_id):
            return None
        self._owners[session_id] = record.replica
        if len(self._owners) > self._REMEMBERED:
            self._owners.popitem(last=False)
        return await self.replica(record.replica)

    def forget(self, session_id: str) -> None:
        """The remembered owner is asked again next time (the owner did not answer for it)."""
        self._owners.pop(session_id, None)

    async def forget_address(self, replica_id: str) -> None:
        """A replica could not be reached where the directory said: read the directory again, so
        the next call finds it where it came back (a restarted replica's new address)."""
        try:
            await self._membership.refresh()
        except Exception as err:  # the ledger is away too: the next beat reads it
            log.warning("could not read the replica directory", replica_id=replica_id, error=str(err))

    async def replica(self, replica_id: str) -> ReplicaRecord:
        """A replica whose lease is current; REPLICA_UNAVAILABLE otherwise."""
        found = self._membership.directory.get(replica_id)
        if found is None or not found.alive:
            await self._membership.refresh()  # one that joined, or came back, since the last beat
            found = self._membership.directory.get(replica_id)
        if found is None:
            raise ReplicaUnavailable(replica_id, "it is not in the replica directory")
        if not found.alive:
            raise ReplicaUnavailable(replica_id, "its lease has run out: it is down or cut off")
        return found

    async def others(self) -> list[ReplicaRecord]:
        """Every other replica whose lease is current (ListSessions asks each)."""
        await self._membership.refresh()
        return [r for r in self._membership.directory.values() if r.alive and r.replica_id != self.replica_id]

    async def place(self) -> ReplicaRecord | None:
        """Where a new session goes: None for this replica (--placement local, or this one is
        the least loaded), else the replica owning the fewest sessions among those alive."""
        if self.placement == LOCAL:
            return None
        await self._membership.refresh()
        alive = [r for r in self._membership.directory.values() if r.alive]
        if not alive:
            return None
        counts = await self._ledger.session_counts()
        mine = counts.get(self.replica_id, 0)
        best = min(alive, key=lambda r: (counts.get(r.replica_id, 0), r.replica_id))
        if best.replica_id == self.replica_id or counts.get(best.replica_id, 0) >= mine:
            return None  # ties stay here: no hop for nothing
        return best
