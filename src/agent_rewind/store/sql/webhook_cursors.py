"""Webhook delivery (`WebhookCursors`) over SQL: a cursor per URL, moved only under the current
lease (leases by the dialect's clock, like the replica directory's), and the events a URL was
given up on."""

from __future__ import annotations

from collections.abc import Sequence

from agent_rewind.store.dialect import Row, Spelling, Work
from agent_rewind.store.records import (
    WebhookFailure,
    WebhookLease,
    WebhookMove,
    WebhookRecord,
    now,
)
from agent_rewind.store.sql.database import Database

# How many failed events the ledger keeps per webhook URL (the newest).
WEBHOOK_FAILURES_KEPT = 1000


class _Sql:
    """Webhook delivery's statements, as the dialect spells them: made once, with the ledger."""

    def __init__(self, s: Spelling) -> None:
        p, clock = s.p, s.clock
        self.first_seen = (
            "INSERT INTO webhooks (url, cursor, lease_expires, update_time)"
            f" SELECT {p}, value, {clock}, {p} FROM counters WHERE name = 'event_cursor'"
            " ON CONFLICT (url) DO NOTHING"
        )
        self.claim = (
            f"UPDATE webhooks SET holder = {p}, lease_epoch = lease_epoch + 1, lease_expires = {s.lease_end}"
            f" WHERE url = {p} AND (holder = {p} OR lease_expires <= {clock}) RETURNING cursor, lease_epoch"
        )
        self.renew = (
            f"UPDATE webhooks SET lease_expires = {s.lease_end} WHERE url = {p} AND holder = {p}"
            f" AND lease_epoch = {p} AND lease_expires > {clock}"
        )
        self.advance = (
            f"UPDATE webhooks SET cursor = {p}, delivered = delivered + {p}, failed = failed + {p},"
            f" last_error = CASE WHEN {p} THEN {p} ELSE last_error END, update_time = {p}"
            f" WHERE url = {p} AND lease_epoch = {p} AND lease_expires > {clock} AND cursor < {p}"
        )
        self.failure = (
            "INSERT INTO webhook_failures (url, cursor, attempts, error, occur_time)"
            f" VALUES ({s.marks(5)}) ON CONFLICT (url, cursor) DO NOTHING"
        )
        self.keep_failures = (
            f"DELETE FROM webhook_failures WHERE url = {p} AND cursor <= (SELECT cursor FROM"
            f" webhook_failures WHERE url = {p} ORDER BY cursor DESC LIMIT 1 OFFSET {p})"
        )
        self.release = f"UPDATE webhooks SET lease_expires = {clock} WHERE url = {p} AND lease_epoch = {p}"
        self.webhooks = f"SELECT *, lease_expires > {clock} AS held FROM webhooks ORDER BY url"
        self.failures = f"SELECT * FROM webhook_failures WHERE url = {p} ORDER BY cursor DESC LIMIT {p}"


class SqlWebhookCursors:
    def __init__(self, db: Database) -> None:
        self._db, self._d = db, db.dialect
        self._sql = _Sql(db.dialect.SPELLING)

    async def claim_webhook(self, url: str, holder: str, lease_s: float) -> WebhookLease | None:
        end, clock = self._d.lease_args(lease_s), self._d.clock_args()
        stamp = self._d.encode_time(now())

        def claim() -> Work[WebhookLease | None]:
            yield self._sql.first_seen, (url, *clock, stamp)
            row = (yield self._sql.claim, (holder, *end, url, holder, *clock)).one()
            return WebhookLease(url, int(row["cursor"]), int(row["lease_epoch"])) if row is not None else None

        return await self._db.transaction(claim)

    async def renew_webhook(self, lease: WebhookLease, holder: str, lease_s: float) -> bool:
        end, clock = self._d.lease_args(lease_s), self._d.clock_args()
        return bool(await self._db.execute(self._sql.renew, *end, lease.url, holder, lease.epoch, *clock))

    async def advance_webhook(
        self, lease: WebhookLease, cursor: int, *, delivered: int = 0, failure: WebhookFailure | None = None
    ) -> bool:
        [moved] = await self.advance_webhooks([WebhookMove(lease, cursor, delivered, failure)])
        return moved

    async def advance_webhooks(self, moves: Sequence[WebhookMove]) -> list[bool]:
        clock = self._d.clock_args()
        stamp = self._d.encode_time(now())

        def advance(move: WebhookMove) -> Work[bool]:
            lease, failure = move.lease, move.failure
            moved = yield (
                self._sql.advance,
                (
                    move.cursor,
                    move.delivered,
                    1 if failure is not None else 0,
                    failure is not None,
                    failure.error if failure is not None else "",
                    stamp,
                    lease.url,
                    lease.epoch,
                    *clock,
                    move.cursor,
                ),
            )
            if not moved.rowcount:
                return False
            if failure is not None:
                yield self._sql.failure, (lease.url, failure.cursor, failure.attempts, failure.error, stamp)
                yield self._sql.keep_failures, (lease.url, lease.url, WEBHOOK_FAILURES_KEPT)
            return True

        def advance_all() -> Work[list[bool]]:
            # In URL order, so two replicas' batches lock the rows in one order.
            done: dict[int, bool] = {}
            for n, move in sorted(enumerate(moves), key=lambda m: (m[1].lease.url, m[1].cursor)):
                done[n] = yield from advance(move)
            return [done[n] for n in range(len(moves))]

        return await self._db.transaction(advance_all)

    async def release_webhook(self, lease: WebhookLease) -> None:
        await self._db.execute(self._sql.release, *self._d.clock_args(), lease.url, lease.epoch)

    async def webhooks(self) -> list[WebhookRecord]:
        return [self._record(r) for r in await self._db.rows(self._sql.webhooks, *self._d.clock_args())]

    async def webhook_failures(self, url: str, limit: int = 100) -> list[WebhookFailure]:
        rows = await self._db.rows(self._sql.failures, url, limit)
        return [
            WebhookFailure(
                r["url"],
                int(r["cursor"]),
                int(r["attempts"]),
                r["error"],
                self._d.decode_time(r["occur_time"]),
            )
            for r in rows
        ]

    def _record(self, row: Row) -> WebhookRecord:
        return WebhookRecord(
            url=row["url"],
            cursor=int(row["cursor"]),
            holder=row["holder"],
            lease_expires=self._d.decode_time(row["lease_expires"]),
            held=bool(row["held"]),
            delivered=int(row["delivered"]),
            failed=int(row["failed"]),
            last_error=row["last_error"],
            update_time=self._d.decode_time(row["update_time"]),
        )
