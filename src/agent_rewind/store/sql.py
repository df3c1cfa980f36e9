"""The ledger's logic written once, over SQL: every `Ledger` method, for SQLite and PostgreSQL.

Each method is its statements and what it makes of their rows, run by a dialect
(`store/dialect.py` says what one supplies; `store/sqlite.py` and `store/postgres.py` are the
two). What the two databases need done differently is the dialect's; everything else is here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from agent_rewind.errors import SessionAlreadyExists
from agent_rewind.store.dialect import Dialect, Work, insert_statement
from agent_rewind.store.ledger import (
    Anchor,
    EgressRecord,
    EventRecord,
    NewEvent,
    NewRequest,
    NewRewind,
    NewSession,
    NewSnapshot,
    PointRow,
    PointsHead,
    PointsUpdate,
    ReplicaRecord,
    RequestIdTaken,
    RequestRecord,
    RewindRecord,
    SessionRecord,
    SnapshotRecord,
    Tombstone,
    WebhookFailure,
    WebhookLease,
    WebhookMove,
    WebhookRecord,
    now,
)

if TYPE_CHECKING:
    from agent_rewind.store.ledger import Ledger

# How many failed events the ledger keeps per webhook URL (the newest).
WEBHOOK_FAILURES_KEPT = 1000

# What DeleteSession deletes or rewrites rows of (what a dialect cleans after it commits).
ERASED_TABLES = (
    "sessions",
    "anchors",
    "rewinds",
    "snapshots",
    "requests",
    "events",
    "egress",
    "point_heads",
    "points",
)
_HEAD_COLUMNS = (
    "covered, digest, leaf, seed, points_count, last_message_id, snapshot_count, leaf_compactions,"
    " holds_newest, cut"
)
_POINT_COLUMNS = (
    "idx, uuid, message_id, resume_at_message_id, anchor, preview, create_time, snapshot_pos,"
    " compactions, is_copy"
)


def _text(value: str) -> str:
    """A string as the points index stores it: its JSON escape, which both databases take
    whatever it holds (PostgreSQL refuses NUL in text; a lone surrogate is no UTF-8). The same
    string for printable ASCII without quotes or backslashes (an id); `_untext` gives the
    original back."""
    if value.isascii() and value.isprintable() and '"' not in value and "\\" not in value:
        return value
    return json.dumps(value)[1:-1]


def _untext(value: str) -> str:
    if "\\" not in value:  # nothing was escaped (an escape always holds a backslash)
        return value
    decoded: str = json.loads(f'"{value}"')
    return decoded


class SqlLedger(Dialect):
    """`Ledger` over SQL; a dialect, subclassing it, supplies the rest (`Dialect`)."""

    # Secrets

    async def secret(self, name: str, size: int = 32) -> bytes:
        row = await self._row("SELECT value FROM secrets WHERE name = ?", name)
        if row is not None:
            return bytes(row["value"])

        def insert() -> Work[bytes]:
            yield (
                "INSERT INTO secrets (name, value) VALUES (?, ?) ON CONFLICT DO NOTHING",
                (name, os.urandom(size)),
            )
            made = (yield "SELECT value FROM secrets WHERE name = ?", (name,)).one()
            assert made is not None
            return bytes(made["value"])

        return await self._transaction(insert)

    # Sessions

    async def add_session(self, new: NewSession, request: NewRequest | None = None) -> SessionRecord:
        stamp = now()
        sql, args = insert_statement(
            "sessions",
            {
                "session_id": new.session_id,
                "cwd": new.cwd,
                "options_json": self._encode_json(new.options),
                "checkpointing": new.checkpointing,
                "create_time": self._encode_time(stamp),
                "update_time": self._encode_time(stamp),
                "principal": new.principal,
                "workspace_snapshots": new.workspace_snapshots,
                "replica": new.replica,
                "forked_from_session": new.forked_from.session_id if new.forked_from else "",
                "forked_from_message": new.forked_from.message_id if new.forked_from else "",
                **self._legacy_columns("sessions", request),
            },
        )

        def insert() -> Work[SessionRecord]:
            if request is not None:
                yield from self._insert_request(request, stamp)
            row = (yield f"{sql} ON CONFLICT (session_id) DO NOTHING RETURNING *", args).one()
            if row is None:  # the id is taken (a tombstone's included), maybe by another replica
                raise SessionAlreadyExists(new.session_id)
            return self._session(row)

        return await self._transaction(insert)

    async def remove_session(self, session_id: str) -> None:
        def delete() -> Work[None]:
            yield "DELETE FROM requests WHERE session_id = ? AND method = 'CreateSession'", (session_id,)
            yield "DELETE FROM sessions WHERE session_id = ?", (session_id,)

        await self._transaction(delete)

    async def session(self, session_id: str) -> SessionRecord | None:
        row = await self._row(
            "SELECT * FROM sessions WHERE session_id = ? AND deleted_time IS NULL", session_id
        )
        return self._session(row) if row is not None else None

    async def sessions(self) -> list[SessionRecord]:
        rows = await self._rows(
            "SELECT * FROM sessions WHERE deleted_time IS NULL ORDER BY create_time, session_id"
        )
        return [self._session(r) for r in rows]

    async def touch_session(
        self, session_id: str, *, closed: bool | None = None, started: bool | None = None
    ) -> datetime:
        stamp = now()
        await self._execute(
            "UPDATE sessions SET update_time = ?, closed = COALESCE(?, closed),"
            " started = COALESCE(?, started) WHERE session_id = ?",
            *(self._encode_time(stamp), closed, started, session_id),
        )
        return stamp

    async def claim_sessions(self, replica_id: str, *, every: bool = False) -> int:
        if every:
            return await self._execute(
                "UPDATE sessions SET replica = ? WHERE replica <> ?", replica_id, replica_id
            )
        return await self._execute("UPDATE sessions SET replica = ? WHERE replica = ''", replica_id)

    async def session_counts(self) -> dict[str, int]:
        rows = await self._rows(
            "SELECT replica, COUNT(*) AS n FROM sessions WHERE deleted_time IS NULL GROUP BY replica"
        )
        return {r["replica"]: int(r["n"]) for r in rows}

    # Egress

    async def record_egress(self, record: EgressRecord) -> None:
        await self._execute(
            "INSERT INTO egress (session_id, prompt_id, host, port) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (session_id, prompt_id, host, port) DO NOTHING",
            *(record.session_id, record.prompt_id, record.host, record.port),
        )

    async def egress(self, session_id: str) -> list[EgressRecord]:
        rows = await self._rows(
            "SELECT session_id, prompt_id, host, port FROM egress WHERE session_id = ? ORDER BY seq",
            session_id,
        )
        return [EgressRecord(r["session_id"], r["prompt_id"], r["host"], int(r["port"])) for r in rows]

    # The replica directory (leases by the dialect's clock: the database's, where it has one)

    def _replica_columns(self) -> tuple[str, tuple[Any, ...]]:
        clock, args = self._clock()
        return f"replica_id, address, epoch, lease_expires, lease_expires > {clock} AS alive", args

    async def register_replica(self, replica_id: str, address: str, lease_s: float) -> ReplicaRecord:
        (end, end_args), (columns, args) = self._lease_end(lease_s), self._replica_columns()
        sql = (
            f"INSERT INTO replicas (replica_id, address, epoch, lease_expires) VALUES (?, ?, 1, {end})"
            " ON CONFLICT (replica_id) DO UPDATE SET address = excluded.address,"
            f" epoch = replicas.epoch + 1, lease_expires = excluded.lease_expires RETURNING {columns}"
        )

        def upsert() -> Work[ReplicaRecord]:
            row = (yield sql, (replica_id, address, *end_args, *args)).one()
            assert row is not None
            return self._replica(row)

        return await self._transaction(upsert, fenced=False)

    async def renew_replica(self, replica_id: str, epoch: int, lease_s: float) -> ReplicaRecord | None:
        (end, end_args), (columns, args) = self._lease_end(lease_s), self._replica_columns()
        sql = f"UPDATE replicas SET lease_expires = {end} WHERE replica_id = ? AND epoch = ? RETURNING {columns}"

        def renew() -> Work[ReplicaRecord | None]:
            row = (yield sql, (*end_args, replica_id, epoch, *args)).one()
            return self._replica(row) if row is not None else None

        return await self._transaction(renew, fenced=False)

    async def retire_replica(self, replica_id: str, epoch: int) -> None:
        clock, args = self._clock()
        sql = f"UPDATE replicas SET lease_expires = {clock} WHERE replica_id = ? AND epoch = ?"
        await self._execute(sql, *args, replica_id, epoch, fenced=False)

    async def take_over(self, replica_id: str, by: str) -> list[str] | None:
        clock, args = self._clock()

        def take() -> Work[list[str] | None]:
            sql = f"UPDATE replicas SET epoch = epoch + 1 WHERE replica_id = ? AND lease_expires <= {clock}"
            if not (yield sql, (replica_id, *args)).rowcount:
                return None
            moved = yield (
                "UPDATE sessions SET replica = ? WHERE replica = ? RETURNING session_id",
                (by, replica_id),
            )
            return sorted(r["session_id"] for r in moved.rows)

        return await self._transaction(take)

    async def replicas(self) -> list[ReplicaRecord]:
        columns, args = self._replica_columns()
        return [
            self._replica(r)
            for r in await self._rows(f"SELECT {columns} FROM replicas ORDER BY replica_id", *args)
        ]

    # Request ids

    def _insert_request(
        self,
        request: NewRequest,
        stamp: datetime,
        result: dict[str, Any] | None = None,
        *,
        done: bool = False,
    ) -> Work[None]:
        """Records a request id, or raises RequestIdTaken with the record that has it. A concurrent
        insert of the same id is waited for: its row is then found, or, rolled back, this one goes in."""
        sql, args = insert_statement(
            "requests",
            {
                "request_id": request.request_id,
                "method": request.method,
                "fingerprint": request.fingerprint,
                "session_id": request.session_id,
                "done": done,
                "result_json": self._encode_json(result, text=True),
                "create_time": self._encode_time(stamp),
            },
        )
        while True:
            if (yield f"{sql} ON CONFLICT (request_id) DO NOTHING RETURNING 1", args).rows:
                return
            existing = (yield "SELECT * FROM requests WHERE request_id = ?", (request.request_id,)).one()
            if existing is not None:
                raise RequestIdTaken(self._request(existing))
            # Deleted between the two statements (forgotten by another replica): try again.

    async def request(self, request_id: str) -> RequestRecord | None:
        row = await self._row("SELECT * FROM requests WHERE request_id = ?", request_id)
        return self._request(row) if row is not None else None

    async def begin_request(self, request: NewRequest, result: dict[str, Any] | None = None) -> None:
        stamp = now()
        await self._transaction(lambda: self._insert_request(request, stamp, result))

    async def finish_request(self, request_id: str, result: dict[str, Any]) -> None:
        await self._execute(
            "UPDATE requests SET done = true, result_json = ? WHERE request_id = ?",
            *(self._encode_json(result, text=True), request_id),
        )

    async def forget_request(self, request_id: str) -> None:
        await self._execute("DELETE FROM requests WHERE request_id = ?", request_id)

    async def forget_requests(self, older_than: datetime) -> int:
        return await self._execute(
            "DELETE FROM requests WHERE create_time < ?", self._encode_time(older_than)
        )

    # Pending conversation cuts

    async def anchor(self, session_id: str) -> Anchor | None:
        row = await self._row("SELECT * FROM anchors WHERE session_id = ?", session_id)
        return self._anchor(row) if row is not None else None

    async def clear_anchor(self, session_id: str, anchor_uuid: str) -> None:
        await self._execute(
            "DELETE FROM anchors WHERE session_id = ? AND anchor_uuid = ?", session_id, anchor_uuid
        )

    # The points index

    def _write_points(self, update: PointsUpdate) -> Work[None]:
        head = update.head
        sid = head.session_id
        values = (
            head.covered,
            head.digest,
            _text(head.leaf),
            json.dumps(head.seed),
            head.count,
            _text(head.last_message_id),
            head.snapshot_count,
            head.leaf_compactions,
            head.holds_newest,
            _text(head.cut),
        )
        marks = ", ".join("?" * len(values))
        updates = ", ".join(f"{c.strip()} = excluded.{c.strip()}" for c in _HEAD_COLUMNS.split(","))
        yield (
            f"INSERT INTO point_heads (session_id, {_HEAD_COLUMNS}) VALUES (?, {marks})"
            f" ON CONFLICT (session_id) DO UPDATE SET {updates}",
            (sid, *values),
        )
        yield "DELETE FROM points WHERE session_id = ? AND idx >= ?", (sid, update.keep)
        for uuid, position in update.positions:
            yield (
                "UPDATE points SET snapshot_pos = ? WHERE session_id = ? AND uuid = ? AND idx < ?",
                (position, sid, _text(uuid), update.keep),
            )
        for row in update.added:
            yield (
                f"INSERT INTO points (session_id, {_POINT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    sid,
                    row.idx,
                    _text(row.uuid),
                    _text(row.message_id),
                    _text(row.resume_at_message_id),
                    _text(row.anchor),
                    _text(row.text),
                    self._encode_time(row.create_time) if row.create_time is not None else None,
                    row.snapshot_pos,
                    row.compactions,
                    row.copy,
                ),
            )

    async def record_points(
        self, update: PointsUpdate, *, touch: bool = False, durable: bool = True
    ) -> datetime | None:
        stamp = now() if touch else None

        def write() -> Work[datetime | None]:
            if stamp is not None:
                yield (
                    "UPDATE sessions SET update_time = ? WHERE session_id = ?",
                    (self._encode_time(stamp), update.head.session_id),
                )
            # Only a session that is not deleted has an index: an erasure that won the race
            # leaves nothing behind for this write to bring back.
            live = "SELECT 1 FROM sessions WHERE session_id = ? AND deleted_time IS NULL"
            if (yield f"{live}{self.LOCK}", (update.head.session_id,)).one() is None:
                return stamp
            yield from self._write_points(update)
            return stamp

        return await self._transaction(write, durable=durable)

    def _points_head(self, row: Any) -> PointsHead:
        return PointsHead(
            session_id=row["session_id"],
            covered=int(row["covered"]),
            digest=row["digest"],
            leaf=_untext(row["leaf"]),
            seed=json.loads(row["seed"]),
            count=int(row["points_count"]),
            last_message_id=_untext(row["last_message_id"]),
            snapshot_count=int(row["snapshot_count"]),
            leaf_compactions=int(row["leaf_compactions"]),
            holds_newest=bool(row["holds_newest"]),
            cut=_untext(row["cut"]),
        )

    def _point_row(self, row: Any) -> PointRow:
        return PointRow(
            idx=int(row["idx"]),
            uuid=_untext(row["uuid"]),
            message_id=_untext(row["message_id"]),
            resume_at_message_id=_untext(row["resume_at_message_id"]),
            anchor=_untext(row["anchor"]),
            text=_untext(row["preview"]),
            create_time=self._decode_time(row["create_time"]) if row["create_time"] is not None else None,
            snapshot_pos=int(row["snapshot_pos"]) if row["snapshot_pos"] is not None else None,
            compactions=int(row["compactions"]),
            copy=bool(row["is_copy"]),
        )

    async def points_head(self, session_id: str) -> PointsHead | None:
        row = await self._row(
            f"SELECT session_id, {_HEAD_COLUMNS} FROM point_heads WHERE session_id = ?", session_id
        )
        return self._points_head(row) if row is not None else None

    async def points_page(
        self, session_id: str, start: int, size: int
    ) -> tuple[PointsHead, list[PointRow]] | None:
        # One statement: the head and its rows from one snapshot of the database.
        point_columns = ", ".join(f"p.{c.strip()}" for c in _POINT_COLUMNS.split(","))
        head_columns = ", ".join(f"h.{c.strip()}" for c in _HEAD_COLUMNS.split(","))
        rows = await self._rows(
            f"SELECT h.session_id, {head_columns}, {point_columns} FROM point_heads h"
            " LEFT JOIN points p ON p.session_id = h.session_id AND p.idx >= ? AND p.idx < ?"
            " WHERE h.session_id = ? ORDER BY p.idx",
            *(start, start + size, session_id),
        )
        if not rows:
            return None
        return self._points_head(rows[0]), [self._point_row(r) for r in rows if r["idx"] is not None]

    async def point_uuid(self, session_id: str, idx: int) -> str | None:
        row = await self._row("SELECT uuid FROM points WHERE session_id = ? AND idx = ?", session_id, idx)
        return _untext(row["uuid"]) if row is not None else None

    # Rewinds

    async def begin_rewind(self, new: NewRewind) -> None:
        stamp = now()
        sql, args = insert_statement(
            "rewinds",
            {
                "rewind_id": new.rewind_id,
                "session_id": new.session_id,
                "request_id": new.request.request_id if new.request else None,
                "message_id": new.message_id,
                "mode": new.mode,
                "state": "pending",
                "plan_json": self._encode_json(new.plan),
                "principal": new.principal,
                "occur_time": self._encode_time(stamp),
                "kind": new.kind,
                **self._legacy_columns("rewinds", new.request),
            },
        )

        def insert() -> Work[None]:
            if new.request is not None:
                yield from self._insert_request(new.request, stamp, result={"rewind_id": new.rewind_id})
            yield sql, args

        await self._transaction(insert)

    async def mark_files_applied(self, rewind_id: str) -> None:
        await self._execute("UPDATE rewinds SET files_applied = true WHERE rewind_id = ?", rewind_id)

    async def complete_rewind(
        self,
        rewind_id: str,
        result: dict[str, Any],
        anchor: Anchor | None,
        event: NewEvent,
        points: PointsUpdate | None = None,
    ) -> EventRecord:
        stamp = now()

        def complete() -> Work[EventRecord]:
            # The session's row first (erase_session takes it first too), the counter last.
            yield (
                "UPDATE sessions SET update_time = ? WHERE session_id = (SELECT session_id FROM rewinds"
                " WHERE rewind_id = ? AND state = 'pending')",
                (self._encode_time(stamp), rewind_id),
            )
            row = (
                yield (
                    "UPDATE rewinds SET state = 'applied', result_json = ? WHERE rewind_id = ? AND state = 'pending'"
                    " RETURNING request_id",
                    (self._encode_json(result), rewind_id),
                )
            ).one()
            if row is None:
                raise LookupError(f"no pending rewind {rewind_id}")
            if row["request_id"] is not None:
                yield "UPDATE requests SET done = true WHERE request_id = ?", (row["request_id"],)
            if anchor is not None:
                yield (
                    "INSERT INTO anchors (session_id, anchor_uuid, target_message_id, transcript_size,"
                    " drops_turn, rewind_id) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (session_id) DO UPDATE"
                    " SET anchor_uuid = excluded.anchor_uuid, target_message_id = excluded.target_message_id,"
                    " transcript_size = excluded.transcript_size, drops_turn = excluded.drops_turn,"
                    " rewind_id = excluded.rewind_id",
                    (
                        anchor.session_id,
                        anchor.anchor_uuid,
                        anchor.target_message_id,
                        anchor.transcript_size,
                        anchor.drops_turn,
                        anchor.rewind_id,
                    ),
                )
            if points is not None:
                yield from self._write_points(points)
            cursor = yield from self._append_event(event, stamp, rewind_id)
            return _appended(cursor, event, stamp)

        return await self._transaction(complete)

    async def abandon_rewind(self, rewind_id: str) -> None:
        def delete() -> Work[None]:
            sql = "DELETE FROM rewinds WHERE rewind_id = ? AND state = 'pending' RETURNING request_id"
            row = (yield sql, (rewind_id,)).one()
            if row is not None and row["request_id"] is not None:
                yield "DELETE FROM requests WHERE request_id = ?", (row["request_id"],)

        await self._transaction(delete)

    async def rewind(self, rewind_id: str) -> RewindRecord | None:
        row = await self._row("SELECT * FROM rewinds WHERE rewind_id = ?", rewind_id)
        return self._rewind(row) if row is not None else None

    async def pending_rewinds(self, session_id: str | None = None) -> list[RewindRecord]:
        if session_id is None:
            rows = await self._rows("SELECT * FROM rewinds WHERE state = 'pending' ORDER BY id")
        else:
            rows = await self._rows(
                "SELECT * FROM rewinds WHERE state = 'pending' AND session_id = ? ORDER BY id", session_id
            )
        return [self._rewind(r) for r in rows]

    async def rewinds(self, session_id: str | None = None) -> list[RewindRecord]:
        if session_id is None:
            rows = await self._rows("SELECT * FROM rewinds ORDER BY id")
        else:
            rows = await self._rows("SELECT * FROM rewinds WHERE session_id = ? ORDER BY id", session_id)
        return [self._rewind(r) for r in rows]

    # Workspace snapshots

    async def add_snapshot(self, new: NewSnapshot) -> SnapshotRecord:
        stamp = now()
        sql, args = insert_statement(
            "snapshots",
            {
                "session_id": new.session_id,
                "kind": new.kind,
                "ref": new.ref,
                "tree": new.tree,
                "complete": new.complete,
                "reason": new.reason,
                "occur_time": self._encode_time(stamp),
            },
        )

        def insert() -> Work[int]:
            row = (yield f"{sql} RETURNING seq", args).one()
            assert row is not None
            return int(row["seq"])

        seq = await self._transaction(insert)
        return SnapshotRecord(
            seq, new.session_id, new.kind, new.ref, new.tree, new.complete, new.reason, stamp
        )

    async def snapshots(self, session_id: str) -> list[SnapshotRecord]:
        rows = await self._rows("SELECT * FROM snapshots WHERE session_id = ? ORDER BY seq", session_id)
        return [self._snapshot(row) for row in rows]

    async def prune_snapshots(self, session_id: str, before_seq: int) -> int:
        return await self._execute(
            "UPDATE snapshots SET tree = NULL, complete = false, reason = 'pruned'"
            " WHERE session_id = ? AND seq < ? AND tree IS NOT NULL",
            *(session_id, before_seq),
        )

    # The event log

    async def events_after(
        self, cursor: int, session_id: str | None = None, limit: int = 1000
    ) -> list[EventRecord]:
        if session_id is None:
            rows = await self._rows(
                "SELECT * FROM events WHERE cursor > ? ORDER BY cursor LIMIT ?", cursor, limit
            )
        else:
            rows = await self._rows(
                "SELECT * FROM events WHERE session_id = ? AND cursor > ? ORDER BY cursor LIMIT ?",
                *(session_id, cursor, limit),
            )
        return [self._event(row) for row in rows]

    async def event_bounds(self) -> tuple[int, int]:
        # One statement, one snapshot: the newest and the oldest agree.
        row = await self._row(
            "SELECT (SELECT value FROM counters WHERE name = 'event_cursor') AS newest,"
            " (SELECT MIN(cursor) FROM events) AS oldest"
        )
        assert row is not None
        newest = int(row["newest"])
        if newest == 0:
            return 0, 0
        return (int(row["oldest"]) if row["oldest"] is not None else newest + 1), newest

    async def trim_events(self, keep: int | None, older_than: datetime | None) -> int:
        def trim() -> Work[int]:
            dropped = 0
            if older_than is not None:
                # Always a prefix of the log (a clock set back must not punch holes in it).
                sql = (
                    "DELETE FROM events WHERE cursor <= (SELECT MAX(cursor) FROM events WHERE occur_time < ?)"
                )
                dropped += (yield sql, (self._encode_time(older_than),)).rowcount
            if keep is not None:
                sql = "DELETE FROM events WHERE cursor <= (SELECT value FROM counters WHERE name = 'event_cursor') - ?"
                dropped += (yield sql, (keep,)).rowcount
            return dropped

        return await self._transaction(trim)

    # Erasure

    async def erase_session(
        self,
        session_id: str,
        event: NewEvent,
        request: NewRequest | None = None,
        erasure: dict[str, Any] | None = None,
    ) -> EventRecord:
        stamp = now()
        legacy = self._legacy_columns("sessions", None)
        blanked = "".join(f", {name} = ?" for name in legacy)

        def erase() -> Work[EventRecord]:
            sql = f"SELECT 1 FROM sessions WHERE session_id = ? AND deleted_time IS NULL{self.LOCK}"
            if (yield sql, (session_id,)).one() is None:
                raise LookupError(f"no session {session_id}")
            if request is not None:
                yield from self._insert_request(request, stamp, result={}, done=True)
            yield (
                "UPDATE sessions SET cwd = '', options_json = '{}', closed = true, update_time = ?,"
                f" deleted_time = ?, erasure_json = ?{blanked} WHERE session_id = ?",
                (
                    self._encode_time(stamp),
                    self._encode_time(stamp),
                    self._encode_json(erasure),
                    *legacy.values(),
                    session_id,
                ),
            )
            yield "DELETE FROM anchors WHERE session_id = ?", (session_id,)
            yield "DELETE FROM rewinds WHERE session_id = ?", (session_id,)
            yield "DELETE FROM snapshots WHERE session_id = ?", (session_id,)
            yield "DELETE FROM egress WHERE session_id = ?", (session_id,)
            # The points index holds the prompts' text.
            yield "DELETE FROM points WHERE session_id = ?", (session_id,)
            yield "DELETE FROM point_heads WHERE session_id = ?", (session_id,)
            # Every request id of the session but the delete's own, recorded above.
            yield (
                "DELETE FROM requests WHERE session_id = ? AND request_id IS DISTINCT FROM ?",
                (session_id, request.request_id if request is not None else None),
            )
            # The events stay (cursors are gap-free, and watchers must learn of the deletion), but
            # the paths a rewind changed are the workspace's content: they go.
            yield self.BLANK_FILES, (session_id,)
            cursor = yield from self._append_event(event, stamp, None)
            return _appended(cursor, event, stamp)

        committed = await self._transaction(erase)
        await self._erased(ERASED_TABLES, True)
        return committed

    async def tombstone(self, session_id: str) -> Tombstone | None:
        sql = "SELECT * FROM sessions WHERE session_id = ? AND deleted_time IS NOT NULL"
        row = await self._row(sql, session_id)
        return self._tombstone(row) if row is not None else None

    async def unfinished_erasures(self) -> list[Tombstone]:
        rows = await self._rows(
            "SELECT * FROM sessions WHERE deleted_time IS NOT NULL AND erasure_json IS NOT NULL"
            " ORDER BY deleted_time, session_id"
        )
        return [self._tombstone(r) for r in rows]

    async def finish_erasure(self, session_id: str) -> None:
        changed = await self._execute(
            "UPDATE sessions SET erasure_json = NULL WHERE session_id = ? AND deleted_time IS NOT NULL"
            " AND erasure_json IS NOT NULL",
            session_id,
        )
        await self._erased(("sessions",), bool(changed))

    # Webhook delivery (leases by the dialect's clock, like the replica directory's)

    async def claim_webhook(self, url: str, holder: str, lease_s: float) -> WebhookLease | None:
        (end, end_args), (clock, clock_args) = self._lease_end(lease_s), self._clock()
        stamp = self._encode_time(now())

        def claim() -> Work[WebhookLease | None]:
            yield (
                "INSERT INTO webhooks (url, cursor, lease_expires, update_time)"
                f" SELECT ?, value, {clock}, ? FROM counters WHERE name = 'event_cursor'"
                " ON CONFLICT (url) DO NOTHING",
                (url, *clock_args, stamp),
            )
            row = (
                yield (
                    f"UPDATE webhooks SET holder = ?, lease_epoch = lease_epoch + 1, lease_expires = {end}"
                    f" WHERE url = ? AND (holder = ? OR lease_expires <= {clock})"
                    " RETURNING cursor, lease_epoch",
                    (holder, *end_args, url, holder, *clock_args),
                )
            ).one()
            return WebhookLease(url, int(row["cursor"]), int(row["lease_epoch"])) if row is not None else None

        return await self._transaction(claim)

    async def renew_webhook(self, lease: WebhookLease, holder: str, lease_s: float) -> bool:
        (end, end_args), (clock, clock_args) = self._lease_end(lease_s), self._clock()
        return bool(
            await self._execute(
                f"UPDATE webhooks SET lease_expires = {end} WHERE url = ? AND holder = ? AND lease_epoch = ?"
                f" AND lease_expires > {clock}",
                *end_args,
                *(lease.url, holder, lease.epoch),
                *clock_args,
            )
        )

    async def advance_webhook(
        self, lease: WebhookLease, cursor: int, *, delivered: int = 0, failure: WebhookFailure | None = None
    ) -> bool:
        [moved] = await self.advance_webhooks([WebhookMove(lease, cursor, delivered, failure)])
        return moved

    async def advance_webhooks(self, moves: Sequence[WebhookMove]) -> list[bool]:
        clock, clock_args = self._clock()
        stamp = self._encode_time(now())

        def advance(move: WebhookMove) -> Work[bool]:
            lease, failure = move.lease, move.failure
            moved = yield (
                "UPDATE webhooks SET cursor = ?, delivered = delivered + ?, failed = failed + ?,"
                " last_error = CASE WHEN ? THEN ? ELSE last_error END, update_time = ?"
                f" WHERE url = ? AND lease_epoch = ? AND lease_expires > {clock} AND cursor < ?",
                (
                    move.cursor,
                    move.delivered,
                    1 if failure is not None else 0,
                    failure is not None,
                    failure.error if failure is not None else "",
                    stamp,
                    lease.url,
                    lease.epoch,
                    *clock_args,
                    move.cursor,
                ),
            )
            if not moved.rowcount:
                return False
            if failure is not None:
                yield (
                    "INSERT INTO webhook_failures (url, cursor, attempts, error, occur_time)"
                    " VALUES (?, ?, ?, ?, ?) ON CONFLICT (url, cursor) DO NOTHING",
                    (lease.url, failure.cursor, failure.attempts, failure.error, stamp),
                )
                yield (
                    "DELETE FROM webhook_failures WHERE url = ? AND cursor <= (SELECT cursor FROM"
                    " webhook_failures WHERE url = ? ORDER BY cursor DESC LIMIT 1 OFFSET ?)",
                    (lease.url, lease.url, WEBHOOK_FAILURES_KEPT),
                )
            return True

        def advance_all() -> Work[list[bool]]:
            # In URL order, so two replicas' batches lock the rows in one order.
            done: dict[int, bool] = {}
            for n, move in sorted(enumerate(moves), key=lambda m: (m[1].lease.url, m[1].cursor)):
                done[n] = yield from advance(move)
            return [done[n] for n in range(len(moves))]

        return await self._transaction(advance_all)

    async def release_webhook(self, lease: WebhookLease) -> None:
        clock, args = self._clock()
        await self._execute(
            f"UPDATE webhooks SET lease_expires = {clock} WHERE url = ? AND lease_epoch = ?",
            *args,
            *(lease.url, lease.epoch),
        )

    async def webhooks(self) -> list[WebhookRecord]:
        clock, args = self._clock()
        rows = await self._rows(
            f"SELECT *, lease_expires > {clock} AS held FROM webhooks ORDER BY url", *args
        )
        return [
            WebhookRecord(
                url=r["url"],
                cursor=int(r["cursor"]),
                holder=r["holder"],
                lease_expires=self._decode_time(r["lease_expires"]),
                held=bool(r["held"]),
                delivered=int(r["delivered"]),
                failed=int(r["failed"]),
                last_error=r["last_error"],
                update_time=self._decode_time(r["update_time"]),
            )
            for r in rows
        ]

    async def webhook_failures(self, url: str, limit: int = 100) -> list[WebhookFailure]:
        rows = await self._rows(
            "SELECT * FROM webhook_failures WHERE url = ? ORDER BY cursor DESC LIMIT ?", url, limit
        )
        return [
            WebhookFailure(
                r["url"], int(r["cursor"]), int(r["attempts"]), r["error"], self._decode_time(r["occur_time"])
            )
            for r in rows
        ]


def _appended(cursor: int, event: NewEvent, stamp: datetime) -> EventRecord:
    return EventRecord(
        cursor, event.kind, event.session_id, event.rewind_id, event.principal, stamp, dict(event.data)
    )


if TYPE_CHECKING:

    def _is_a_ledger(ledger: SqlLedger) -> Ledger:
        return ledger
