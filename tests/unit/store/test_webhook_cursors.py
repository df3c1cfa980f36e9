"""The ledger's webhook part (`WebhookCursors`), against every implementation: a cursor per URL
that only the current lease holder moves, and the events a URL was given up on."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from agent_rewind.errors import ReplicaUnavailable
from agent_rewind.store.ledger import Ledger, NewEvent, NewSession, WebhookFailure, now

URL = "http://127.0.0.1:9/hook"


async def _append(ledger: Ledger, count: int) -> list[int]:
    """`count` events (each a session made and deleted); their cursors."""
    cursors = []
    for _ in range(count):
        sid = str(uuid.uuid4())
        await ledger.add_session(NewSession(sid, "/ws", {}, True))
        event = await ledger.erase_session(sid, NewEvent("SESSION_DELETED", sid, data={"owner": "a"}))
        cursors.append(event.cursor)
    return cursors


async def test_a_new_url_starts_at_the_newest_event_and_its_holder_moves_its_cursor(ledger: Ledger) -> None:
    await _append(ledger, 2)
    lease = await ledger.claim_webhook(URL, "pod-0", 30)
    assert lease is not None and lease.cursor == 2, "events from before its first start are not sent"
    assert await ledger.claim_webhook(URL, "pod-1", 30) is None, "held by pod-0"
    await _append(ledger, 2)
    assert await ledger.advance_webhook(lease, 3, delivered=1)
    failure = WebhookFailure(URL, 4, 5, "HTTP 500", now())
    assert await ledger.advance_webhook(lease, 4, failure=failure)
    assert not await ledger.advance_webhook(lease, 4), "never backwards nor twice"
    [record] = await ledger.webhooks()
    assert (record.url, record.cursor, record.holder, record.held) == (URL, 4, "pod-0", True)
    assert (record.delivered, record.failed, record.last_error) == (1, 1, "HTTP 500")
    [failed] = await ledger.webhook_failures(URL)
    assert (failed.cursor, failed.attempts, failed.error) == (4, 5, "HTTP 500")
    # The same holder (a restart of the replica) claims it again at once, from the cursor.
    again = await ledger.claim_webhook(URL, "pod-0", 30)
    assert again is not None and (again.cursor, again.epoch) == (4, lease.epoch + 1)
    assert not await ledger.advance_webhook(lease, 5), "the previous epoch's advance changes nothing"


async def test_a_lapsed_lease_moves_nothing_and_another_holder_takes_it_from_the_cursor(
    ledger: Ledger,
) -> None:
    await _append(ledger, 1)
    lease = await ledger.claim_webhook(URL, "pod-0", 30)
    assert lease is not None
    await _append(ledger, 3)
    assert await ledger.advance_webhook(lease, 2, delivered=1)
    assert await ledger.renew_webhook(lease, "pod-0", 0.05)  # then not renewed in time
    await asyncio.sleep(0.2)
    assert not await ledger.renew_webhook(lease, "pod-0", 30), "lapsed: it must claim again"
    assert not await ledger.advance_webhook(lease, 3), "a lapsed lease never moves the cursor"
    taken = await ledger.claim_webhook(URL, "pod-1", 30)
    assert taken is not None and taken.cursor == 2
    assert await ledger.claim_webhook(URL, "pod-0", 30) is None
    assert await ledger.renew_webhook(taken, "pod-1", 30)
    await ledger.release_webhook(taken)  # a clean stop: free at once
    back = await ledger.claim_webhook(URL, "pod-0", 30)
    assert back is not None and back.cursor == 2
    [record] = await ledger.webhooks()
    assert (record.cursor, record.holder, record.delivered) == (2, "pod-0", 1)


async def test_a_fenced_replica_cannot_move_a_webhook_cursor(ledger: Ledger) -> None:
    first = await ledger.register_replica("pod-0", "a:1", 30)
    ledger.fence("pod-0", first.epoch)
    await _append(ledger, 2)
    lease = await ledger.claim_webhook(URL, "pod-0", 30)
    assert lease is not None
    await ledger.register_replica("pod-0", "b:1", 30)  # a newer incarnation, elsewhere
    with pytest.raises(ReplicaUnavailable):
        await ledger.advance_webhook(lease, 1)
    ledger.fence("pod-0", first.epoch + 1)
    assert [r.cursor for r in await ledger.webhooks()] == [2]


async def test_only_the_newest_failures_are_kept(ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    from agent_rewind.store.sql import webhook_cursors

    monkeypatch.setattr(webhook_cursors, "WEBHOOK_FAILURES_KEPT", 3)
    lease = await ledger.claim_webhook(URL, "pod-0", 30)
    assert lease is not None
    for cursor in await _append(ledger, 5):
        assert await ledger.advance_webhook(
            lease, cursor, failure=WebhookFailure(URL, cursor, 2, "timeout", now())
        )
    assert [f.cursor for f in await ledger.webhook_failures(URL)] == [5, 4, 3]
    assert [r.failed for r in await ledger.webhooks()] == [5]
