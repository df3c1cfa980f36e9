"""This replica's entry in the replica directory: registered at start, renewed by a heartbeat,
retired at a clean shutdown.

Every registration gives the replica a new epoch in the ledger (`register_replica`): the epoch is
the fencing token of this incarnation. Should another process register under the same id (a
replica restarted while this one still runs, or a takeover), this one's renewals are refused from
then on, and so is every ledger write it makes (`Ledger.fence`): it is fenced off, and says so
in its log and on its health. Leases run by the database's clock (PostgreSQL's), so the
replicas' clocks need not agree. A ledger that cannot be reached
leaves the lease to run out: the heartbeat tries again at its next beat.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import structlog

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
    ) -> None:
        """`on_fenced`: called once when a renewal finds this incarnation fenced off."""
        self.replica_id = replica_id
        self.address = address
        self.lease_s = lease_s
        self.epoch = 0
        # Another incarnation registered under this id since: nothing this one does may count.
        self.fenced = False
        self._ledger = ledger
        self.on_fenced = on_fenced
        self._heartbeat: asyncio.Task[None] | None = None
        # Replicas whose lease was current at the last beat (GetCapabilities.replicas).
        self.alive = 1

    async def join(self) -> ReplicaRecord:
        """Registers this replica (a new epoch), fences the ledger's writes with that epoch, and
        starts the heartbeat."""
        record = await self._ledger.register_replica(self.replica_id, self.address, self.lease_s)
        self.epoch = record.epoch
        self.fenced = False
        self._ledger.fence(self.replica_id, self.epoch)
        log.info("replica registered", replica_id=self.replica_id, address=self.address, epoch=self.epoch)
        await self._count()
        self._heartbeat = asyncio.create_task(self._beat(), name="replica-heartbeat")
        return record

    async def _count(self) -> None:
        self.alive = max(1, len(await self.replicas()))

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
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                if not await self.renew():
                    return
                await self._count()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # the ledger is away: the lease runs; try at the next beat
                log.warning("replica heartbeat failed (renewing, or counting the replicas)", error=str(err))

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
