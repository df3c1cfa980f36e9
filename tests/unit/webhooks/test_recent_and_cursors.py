"""What the delivery loops share: the events published here (read from memory while it holds
the next one in order, from the ledger otherwise, a deleted session's dropped), and the cursor
writer (every URL's moves that come together in one transaction, each told whether it moved)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent_rewind.rpc.convert import rewind_event_json
from agent_rewind.store.ledger import EventRecord, NewEvent, NewSession, WebhookMove
from agent_rewind.store.sqlite import SqliteLedger
from agent_rewind.webhooks.cursors import CursorWriter
from agent_rewind.webhooks.recent import Recent


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[SqliteLedger]:
    opened = await SqliteLedger.open(tmp_path / "ledger.sqlite3")
    try:
        yield opened
    finally:
        await opened.close()


async def _deleted(ledger: SqliteLedger) -> EventRecord:
    sid = str(uuid.uuid4())
    await ledger.add_session(NewSession(sid, "/ws", {}, True))
    return await ledger.erase_session(sid, NewEvent("SESSION_DELETED", sid))


class Counting:
    """The ledger, counting the log reads and the transactions of cursor moves."""

    def __init__(self, ledger: SqliteLedger) -> None:
        self.ledger = ledger
        self.reads = 0
        self.batches: list[int] = []

    async def events_after(self, cursor: int, session_id: str | None = None, limit: int = 1000) -> Any:
        self.reads += 1
        return await self.ledger.events_after(cursor, session_id, limit)

    async def advance_webhooks(self, moves: Any) -> list[bool]:
        self.batches.append(len(moves))
        return await self.ledger.advance_webhooks(moves)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ledger, name)


async def test_published_events_come_from_memory_in_order_and_anything_else_from_the_log(
    ledger: SqliteLedger,
) -> None:
    store: Any = Counting(ledger)
    recent = Recent(store, rewind_event_json)
    _, second, third = [await _deleted(ledger) for _ in range(3)]
    recent.remember(second)  # the first was not published here (another replica's, say)
    recent.remember(third)
    assert [e.cursor for e in await recent.after(0, 10)] == [1, 2, 3] and store.reads == 1
    assert [e.cursor for e in await recent.after(1, 10)] == [2, 3] and store.reads == 1
    assert await recent.after(3, 10) == [] and store.reads == 2
    assert recent.envelope(second) is recent.envelope(second), "one document for every URL"


async def test_a_deleted_sessions_events_are_read_again_from_the_log(ledger: SqliteLedger) -> None:
    sid = str(uuid.uuid4())
    await ledger.add_session(NewSession(sid, "/ws", {}, True))
    store: Any = Counting(ledger)
    recent = Recent(store, rewind_event_json)
    named = EventRecord(1, "REWOUND", sid, "r", "", (await _deleted(ledger)).occur_time, {"files": {}})
    recent.remember(named)
    deletion = EventRecord(2, "SESSION_DELETED", sid, "", "", named.occur_time, {})
    recent.remember(deletion)
    await recent.after(0, 10)
    assert store.reads == 1, "its earlier event is no longer in memory"


async def test_moves_that_come_together_are_one_transaction_each_told_its_outcome(
    ledger: SqliteLedger,
) -> None:
    leases = [await ledger.claim_webhook(f"http://127.0.0.1:9/{n}", "pod-0", 30) for n in range(5)]
    for _ in range(2):
        await _deleted(ledger)
    taken = await ledger.claim_webhook("http://127.0.0.1:9/4", "pod-0", 30)  # a newer epoch for /4
    assert all(leases) and taken is not None
    store: Any = Counting(ledger)
    writer = CursorWriter(store)
    moved = await asyncio.gather(*(writer.advance(WebhookMove(lease, 1, 1)) for lease in leases if lease))
    assert moved == [True, True, True, True, False], "the old epoch's move changes nothing"
    assert store.batches == [5], "the five moves that came together: one transaction"
    assert sorted(r.cursor for r in await ledger.webhooks()) == [0, 1, 1, 1, 1]
