"""The ledger: an embedded SQLite database under the state dir.

It holds what the transcript alone cannot: each session's creation parameters (reused
verbatim on every rebuild), the pending conversation cut of a rewind until a new turn
makes it visible in the transcript (SDK-FACTS: the SDK's cut is not durable on its
own), and every rewind with its request id, written as an intent before anything is
applied so a crash between the halves is finished on restart.

Every write is one transaction with synchronous=FULL: when a call returns, it is on disk.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    cwd TEXT NOT NULL,
    options_json TEXT NOT NULL,
    checkpointing INTEGER NOT NULL,
    create_time TEXT NOT NULL,
    update_time TEXT NOT NULL,
    closed INTEGER NOT NULL DEFAULT 0,
    started INTEGER NOT NULL DEFAULT 0,
    request_id TEXT
);
CREATE UNIQUE INDEX IF NOT EXISTS sessions_request_id ON sessions(request_id) WHERE request_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS anchors (
    session_id TEXT PRIMARY KEY REFERENCES sessions(session_id),
    anchor_uuid TEXT NOT NULL,
    target_message_id TEXT NOT NULL,
    transcript_size INTEGER NOT NULL,
    drops_turn TEXT,
    rewind_id TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS rewinds (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    -- The event cursor: assigned when the rewind is applied, so it is gap-free.
    cursor INTEGER UNIQUE,
    rewind_id TEXT NOT NULL UNIQUE,
    session_id TEXT NOT NULL REFERENCES sessions(session_id),
    request_id TEXT,
    fingerprint TEXT NOT NULL,
    message_id TEXT NOT NULL,
    mode TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('pending', 'applied')),
    -- Set once the CLI restored the files: from then on the intent must be finished, not dropped.
    files_applied INTEGER NOT NULL DEFAULT 0,
    plan_json TEXT NOT NULL,
    result_json TEXT,
    principal TEXT NOT NULL DEFAULT '',
    occur_time TEXT NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS rewinds_request_id ON rewinds(request_id) WHERE request_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS rewinds_pending ON rewinds(state) WHERE state = 'pending';
-- Deployment-wide secrets (e.g. the page-token signing key), made once.
CREATE TABLE IF NOT EXISTS secrets (
    name TEXT PRIMARY KEY,
    value BLOB NOT NULL
);
"""


def _now() -> str:
    return datetime.now(UTC).isoformat()


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text)


@dataclass(frozen=True)
class SessionRecord:
    session_id: str
    cwd: str
    options: dict[str, Any]
    checkpointing: bool
    create_time: datetime
    update_time: datetime
    closed: bool
    # Whether the CLI has been started once, so a transcript exists to resume.
    started: bool


@dataclass(frozen=True)
class Anchor:
    """A conversation cut the transcript does not show yet."""

    session_id: str
    anchor_uuid: str
    target_message_id: str
    transcript_size: int
    drops_turn: str | None
    rewind_id: str


@dataclass(frozen=True)
class RewindRecord:
    cursor: int | None
    rewind_id: str
    session_id: str
    request_id: str | None
    fingerprint: str
    message_id: str
    mode: str
    state: str
    files_applied: bool
    plan: dict[str, Any]
    result: dict[str, Any] | None
    principal: str
    occur_time: datetime


class Ledger:
    """Thread-safe access to the ledger file. Calls are short; callers may run them inline."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _write(self, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for sql, args in statements:
                    self._db.execute(sql, args)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return list(self._db.execute(sql, args).fetchall())

    def secret(self, name: str, size: int = 32) -> bytes:
        """A random secret of the deployment, made on first use and the same ever after."""
        self._write(
            [
                (
                    "INSERT INTO secrets (name, value) VALUES (?, ?) ON CONFLICT DO NOTHING",
                    (name, os.urandom(size)),
                )
            ]
        )
        rows = self._rows("SELECT value FROM secrets WHERE name = ?", (name,))
        return bytes(rows[0]["value"])

    # Sessions

    def add_session(
        self, session_id: str, cwd: str, options: dict[str, Any], checkpointing: bool, request_id: str | None
    ) -> SessionRecord:
        now = _now()
        self._write(
            [
                (
                    "INSERT INTO sessions (session_id, cwd, options_json, checkpointing, create_time,"
                    " update_time, request_id) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (session_id, cwd, json.dumps(options), int(checkpointing), now, now, request_id),
                )
            ]
        )
        record = self.session(session_id)
        assert record is not None
        return record

    def remove_session(self, session_id: str) -> None:
        self._write([("DELETE FROM sessions WHERE session_id = ?", (session_id,))])

    @staticmethod
    def _session(row: sqlite3.Row) -> SessionRecord:
        return SessionRecord(
            session_id=row["session_id"],
            cwd=row["cwd"],
            options=json.loads(row["options_json"]),
            checkpointing=bool(row["checkpointing"]),
            create_time=parse_time(row["create_time"]),
            update_time=parse_time(row["update_time"]),
            closed=bool(row["closed"]),
            started=bool(row["started"]),
        )

    def session(self, session_id: str) -> SessionRecord | None:
        rows = self._rows("SELECT * FROM sessions WHERE session_id = ?", (session_id,))
        return self._session(rows[0]) if rows else None

    def session_by_request(self, request_id: str) -> SessionRecord | None:
        rows = self._rows("SELECT * FROM sessions WHERE request_id = ?", (request_id,))
        return self._session(rows[0]) if rows else None

    def sessions(self) -> list[SessionRecord]:
        return [
            self._session(r) for r in self._rows("SELECT * FROM sessions ORDER BY create_time, session_id")
        ]

    def touch_session(
        self, session_id: str, *, closed: bool | None = None, started: bool | None = None
    ) -> datetime:
        now = _now()
        sets, args = ["update_time = ?"], [now]
        if closed is not None:
            sets.append("closed = ?")
            args.append(str(int(closed)))
        if started is not None:
            sets.append("started = ?")
            args.append(str(int(started)))
        self._write([(f"UPDATE sessions SET {', '.join(sets)} WHERE session_id = ?", (*args, session_id))])
        return parse_time(now)

    # Pending conversation cuts

    def anchor(self, session_id: str) -> Anchor | None:
        rows = self._rows("SELECT * FROM anchors WHERE session_id = ?", (session_id,))
        if not rows:
            return None
        r = rows[0]
        return Anchor(
            r["session_id"],
            r["anchor_uuid"],
            r["target_message_id"],
            r["transcript_size"],
            r["drops_turn"],
            r["rewind_id"],
        )

    def clear_anchor(self, session_id: str, anchor_uuid: str) -> None:
        """Forgets a cut once the transcript shows it; a newer cut is left alone."""
        self._write(
            [("DELETE FROM anchors WHERE session_id = ? AND anchor_uuid = ?", (session_id, anchor_uuid))]
        )

    # Rewinds

    @staticmethod
    def _rewind(row: sqlite3.Row) -> RewindRecord:
        return RewindRecord(
            cursor=row["cursor"],
            rewind_id=row["rewind_id"],
            session_id=row["session_id"],
            request_id=row["request_id"],
            fingerprint=row["fingerprint"],
            message_id=row["message_id"],
            mode=row["mode"],
            state=row["state"],
            files_applied=bool(row["files_applied"]),
            plan=json.loads(row["plan_json"]),
            result=json.loads(row["result_json"]) if row["result_json"] else None,
            principal=row["principal"],
            occur_time=parse_time(row["occur_time"]),
        )

    def rewind(self, rewind_id: str) -> RewindRecord | None:
        rows = self._rows("SELECT * FROM rewinds WHERE rewind_id = ?", (rewind_id,))
        return self._rewind(rows[0]) if rows else None

    def rewind_by_request(self, request_id: str) -> RewindRecord | None:
        rows = self._rows("SELECT * FROM rewinds WHERE request_id = ?", (request_id,))
        return self._rewind(rows[0]) if rows else None

    def pending_rewinds(self) -> list[RewindRecord]:
        return [
            self._rewind(r) for r in self._rows("SELECT * FROM rewinds WHERE state = 'pending' ORDER BY id")
        ]

    def rewinds(self, session_id: str | None = None) -> list[RewindRecord]:
        if session_id is None:
            return [self._rewind(r) for r in self._rows("SELECT * FROM rewinds ORDER BY id")]
        rows = self._rows("SELECT * FROM rewinds WHERE session_id = ? ORDER BY id", (session_id,))
        return [self._rewind(r) for r in rows]

    def begin_rewind(
        self,
        *,
        rewind_id: str,
        session_id: str,
        request_id: str | None,
        fingerprint: str,
        message_id: str,
        mode: str,
        plan: dict[str, Any],
        principal: str,
    ) -> None:
        """Records the intent before anything is applied."""
        self._write(
            [
                (
                    "INSERT INTO rewinds (rewind_id, session_id, request_id, fingerprint, message_id, mode,"
                    " state, plan_json, principal, occur_time) VALUES (?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?)",
                    (
                        rewind_id,
                        session_id,
                        request_id,
                        fingerprint,
                        message_id,
                        mode,
                        json.dumps(plan),
                        principal,
                        _now(),
                    ),
                )
            ]
        )

    def complete_rewind(self, rewind_id: str, result: dict[str, Any], anchor: Anchor | None) -> None:
        """Marks the rewind applied and, for a conversation half, stores its cut, in one transaction."""
        statements: list[tuple[str, tuple[Any, ...]]] = [
            (
                "UPDATE rewinds SET state = 'applied', result_json = ?,"
                " cursor = (SELECT COALESCE(MAX(cursor), 0) + 1 FROM rewinds)"
                " WHERE rewind_id = ? AND state = 'pending'",
                (json.dumps(result), rewind_id),
            )
        ]
        if anchor is not None:
            statements.append(
                (
                    "INSERT INTO anchors (session_id, anchor_uuid, target_message_id, transcript_size,"
                    " drops_turn, rewind_id) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(session_id) DO UPDATE SET"
                    " anchor_uuid = excluded.anchor_uuid, target_message_id = excluded.target_message_id,"
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
            )
        statements.append(
            (
                "UPDATE sessions SET update_time = ? WHERE session_id = (SELECT session_id FROM rewinds"
                " WHERE rewind_id = ?)",
                (_now(), rewind_id),
            )
        )
        self._write(statements)

    def mark_files_applied(self, rewind_id: str) -> None:
        self._write([("UPDATE rewinds SET files_applied = 1 WHERE rewind_id = ?", (rewind_id,))])

    def abandon_rewind(self, rewind_id: str) -> None:
        """Drops an intent of which nothing was applied (or that can no longer be finished)."""
        self._write([("DELETE FROM rewinds WHERE rewind_id = ? AND state = 'pending'", (rewind_id,))])
