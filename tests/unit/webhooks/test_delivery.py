"""Delivery loops on a real SQLite ledger to a real HTTP receiver on loopback: order, retries,
failures recorded and stepped over, a hanging URL that holds up no other, the lease that lets
one holder deliver, and a restart that resumes after the cursor."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from agent_rewind import metrics
from agent_rewind.rpc.convert import rewind_event_json
from agent_rewind.store.ledger import EventRecord, NewEvent, NewSession
from agent_rewind.store.sqlite import SqliteLedger
from agent_rewind.webhooks import Subscription, Webhooks
from agent_rewind.webhooks.delivery import Deliverer, Settings
from agent_rewind.webhooks.secrets import new_key
from agent_rewind.webhooks.signing import Signer
from agent_rewind.webhooks.subscriptions import visibility
from tests.webhook_receiver import Receiver

KEYS = [new_key(), new_key()]


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[SqliteLedger]:
    opened = await SqliteLedger.open(tmp_path / "ledger.sqlite3")
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    made = Receiver(KEYS)
    await made.start()
    try:
        yield made
    finally:
        await made.stop()


def _settings(holder: str = "pod-0", **kw: float) -> Settings:
    values: dict[str, float] = {"lease_s": 30.0, "max_attempts": 3, "timeout_s": 5.0, "backoff_base": 0.01}
    values.update(kw)
    return Settings(holder=holder, **values)  # type: ignore[arg-type]


async def _append(ledger: SqliteLedger, webhooks: list[Webhooks], owner: str = "alice") -> EventRecord:
    sid = str(uuid.uuid4())
    await ledger.add_session(NewSession(sid, "/ws", {}, True, principal=owner))
    event = await ledger.erase_session(
        sid, NewEvent("SESSION_DELETED", sid, principal=owner, data={"owner": owner})
    )
    for w in webhooks:
        w.publish(event)
    return event


async def _start(
    ledger: SqliteLedger, urls: list[str], settings: Settings, principal: str | None = None
) -> Webhooks:
    webhooks = Webhooks([Subscription(u, principal) for u in urls], ledger, settings, KEYS, rewind_event_json)
    await webhooks.start()
    return webhooks


async def _claimed(ledger: SqliteLedger, count: int) -> None:
    """Until `count` URLs are held (a URL's cursor starts at the newest event when first claimed)."""
    async with asyncio.timeout(10):
        while sum(r.held for r in await ledger.webhooks()) < count:
            await asyncio.sleep(0.01)


async def _cursor(ledger: SqliteLedger, cursor: int) -> None:
    async with asyncio.timeout(10):
        while (await ledger.webhooks())[0].cursor < cursor:
            await asyncio.sleep(0.01)


async def test_events_arrive_in_order_retried_and_a_hopeless_one_recorded_and_stepped_over(
    ledger: SqliteLedger, receiver: Receiver
) -> None:
    # The 2nd event fails twice then goes through; the 3rd fails every time (3 attempts).
    def plan(msg_id: str, attempt: int) -> str:
        if msg_id == "2":
            return "fail" if attempt <= 2 else "ok"
        return "fail" if msg_id == "3" else "ok"

    receiver.plan = plan
    webhooks = await _start(ledger, [receiver.url], _settings())
    try:
        await _claimed(ledger, 1)
        events = [await _append(ledger, [webhooks]) for _ in range(4)]
        await receiver.wait_for(3)
        assert receiver.cursors() == [1, 2, 4]
        assert [a for a in receiver.attempts if a[0] == "3"] == [("3", "fail")] * 3
        assert receiver.bad_signatures == 0
        assert receiver.accepted[0].headers["user-agent"].startswith("agent-rewind/")
        first = receiver.accepted[0].document
        assert (first["type"], first["subject"], first["data"]["cursor"]) == (
            "agent_rewind.v1.session_deleted",
            events[0].session_id,
            "1",
        )
        await _cursor(ledger, 4)
        [record] = await ledger.webhooks()
        assert (record.cursor, record.delivered, record.failed, record.last_error) == (4, 3, 1, "HTTP 500")
        [failed] = await ledger.webhook_failures(receiver.url)
        assert (failed.cursor, failed.attempts) == (3, 3)
        label = Subscription(receiver.url).shown
        assert (
            metrics.REGISTRY.get_sample_value(
                "agent_rewind_webhook_events_total", {"webhook": label, "outcome": "failed"}
            )
            == 1
        )
    finally:
        await webhooks.stop()


async def test_a_hanging_url_holds_up_no_other_and_times_out(
    ledger: SqliteLedger, receiver: Receiver
) -> None:
    stuck = Receiver(KEYS, plan=lambda msg_id, attempt: "hang")
    await stuck.start("/stuck")
    webhooks = await _start(ledger, [stuck.url, receiver.url], _settings(timeout_s=30.0, max_attempts=1))
    try:
        await _claimed(ledger, 2)
        for _ in range(5):
            await _append(ledger, [webhooks])
        await receiver.wait_for(5)
        assert receiver.cursors() == [1, 2, 3, 4, 5]
        assert stuck.hanging.is_set() and not stuck.accepted
    finally:
        await webhooks.stop()
        await stuck.stop()


async def test_an_attempt_that_gets_no_answer_times_out_and_the_event_is_recorded_failed(
    ledger: SqliteLedger,
) -> None:
    stuck = Receiver(KEYS, plan=lambda msg_id, attempt: "hang")
    await stuck.start()
    webhooks = await _start(ledger, [stuck.url], _settings(timeout_s=0.3, max_attempts=2))
    try:
        await _claimed(ledger, 1)
        await _append(ledger, [webhooks])
        async with asyncio.timeout(20):
            while not (await ledger.webhooks())[0].failed:
                await asyncio.sleep(0.05)
        [failed] = await ledger.webhook_failures(stuck.url)
        assert (failed.cursor, failed.attempts) == (1, 2)
        assert failed.error.startswith("no answer within")
        assert 0.2 <= float(failed.error.split()[3]) < 20, "the seconds the attempt waited"
        assert stuck.attempts == [("1", "hang"), ("1", "hang")]
    finally:
        await webhooks.stop()
        await stuck.stop()


async def test_one_holder_at_a_time_and_the_next_resumes_after_the_cursor(
    ledger: SqliteLedger, receiver: Receiver
) -> None:
    first = await _start(ledger, [receiver.url], _settings("pod-0"))
    await _claimed(ledger, 1)
    second = await _start(ledger, [receiver.url], _settings("pod-1", lease_s=1.0))
    try:
        for _ in range(3):
            await _append(ledger, [first, second])
        await receiver.wait_for(3)
        await _cursor(ledger, 3)  # (a stop while the last one is in flight sends it again: at least once)
        assert [r.holder for r in await ledger.webhooks()] == ["pod-0"]
        await first.stop()  # a clean stop gives the lease back: pod-1 claims it within a third of its lease
        for _ in range(2):
            await _append(ledger, [second])
        await receiver.wait_for(5)
        assert receiver.cursors() == [1, 2, 3, 4, 5], "no event twice, none missed"
        assert [r.holder for r in await ledger.webhooks()] == ["pod-1"]
    finally:
        await first.stop()
        await second.stop()


async def test_a_restart_resumes_after_the_cursor_and_a_principal_gets_only_its_events(
    ledger: SqliteLedger, receiver: Receiver
) -> None:
    webhooks = await _start(ledger, [receiver.url], _settings(), principal="alice")
    await _claimed(ledger, 1)
    await _append(ledger, [webhooks], owner="alice")
    await _append(ledger, [webhooks], owner="bob")
    await receiver.wait_for(1)
    await _cursor(ledger, 2)
    await webhooks.stop()
    await _append(ledger, [], owner="alice")  # while no one delivers
    await _append(ledger, [], owner="bob")
    again = await _start(ledger, [receiver.url], _settings(), principal="alice")
    try:
        await receiver.wait_for(2)
        await _cursor(ledger, 4)
        assert receiver.cursors() == [1, 3], "bob's sessions' events are not alice's URL's"
    finally:
        await again.stop()


async def test_a_redirect_is_a_failed_attempt_never_a_delivery(
    ledger: SqliteLedger, receiver: Receiver
) -> None:
    """The slip of issue 37: a 3xx (never followed) counted as delivered, so the event was lost."""
    receiver.plan = lambda msg_id, attempt: "redirect" if msg_id == "1" else "ok"
    webhooks = await _start(ledger, [receiver.url], _settings())
    try:
        await _claimed(ledger, 1)
        for _ in range(2):
            await _append(ledger, [webhooks])
        await receiver.wait_for(1)
        await _cursor(ledger, 2)
        assert receiver.cursors() == [2]
        assert [a for a in receiver.attempts if a[0] == "1"] == [("1", "redirect")] * 3
        [record] = await ledger.webhooks()
        assert (record.delivered, record.failed, record.last_error) == (1, 1, "HTTP 307")
        [failed] = await ledger.webhook_failures(receiver.url)
        assert failed.cursor == 1
    finally:
        await webhooks.stop()


async def test_a_batch_that_starts_with_another_principal_s_event_ends_past_the_last_delivered(
    ledger: SqliteLedger, receiver: Receiver
) -> None:
    """The slip of issue 37: the skip counter not reset after a delivered event sent the cursor
    back to the skipped event, which the ledger refuses: the loop took that for a lost lease,
    dropped it and claimed the URL again, once per such batch."""
    webhooks = await _start(ledger, [receiver.url], _settings(), principal="alice")
    await _claimed(ledger, 1)
    await webhooks.stop()
    await _append(ledger, [], owner="bob")  # one batch for the next holder: bob's, then alice's
    await _append(ledger, [], owner="alice")
    again = Webhooks([Subscription(receiver.url, "alice")], ledger, _settings(), KEYS, rewind_event_json)
    [deliverer] = again.deliverers
    claims = []
    claim = deliverer.claim

    async def counted() -> Any:
        claims.append(await claim())
        return claims[-1]

    deliverer.claim = counted  # type: ignore[method-assign]
    await again.start()
    try:
        await receiver.wait_for(1)
        await _cursor(ledger, 2)
        await asyncio.sleep(0.3)  # a loop that lost its lease would have claimed it again meanwhile
        assert [r.cursor for r in await ledger.webhooks()] == [2]
        assert len(claims) == 1, f"the lease was dropped and claimed again: {claims}"
    finally:
        await again.stop()
    third = await _start(ledger, [receiver.url], _settings(), principal="alice")
    try:
        await asyncio.sleep(0.3)
    finally:
        await third.stop()
    assert receiver.cursors() == [2], "alice's event once, bob's never"


def _sample(name: str, url: str, **labels: str) -> float:
    """A webhook metric's value for `url` (0 when never set)."""
    value = metrics.REGISTRY.get_sample_value(name, {"webhook": Subscription(url).shown, **labels})
    return value or 0.0


def _counted_claims(webhooks: Webhooks) -> list[tuple[float, Any]]:
    """Every claim the (one) URL's loop makes from now on: (the loop's time, the lease or None)."""
    [deliverer] = webhooks.deliverers
    claims: list[tuple[float, Any]] = []
    claim = deliverer.claim

    async def counted() -> Any:
        lease = await claim()
        claims.append((asyncio.get_running_loop().time(), lease))
        return lease

    deliverer.claim = counted  # type: ignore[method-assign]
    return claims


async def _until(check: Any, within: float = 20.0) -> None:
    async with asyncio.timeout(within):
        while not check():
            await asyncio.sleep(0.01)


async def test_answers_200_to_299_are_deliveries_and_300_is_not(
    ledger: SqliteLedger, receiver: Receiver
) -> None:
    """The 2xx bounds exactly: a receiver's 200 and 299 take the event; a 300 (not followed) fails it."""
    answers = {"1": "status 200", "2": "status 299", "3": "status 300"}
    receiver.plan = lambda msg_id, attempt: answers.get(msg_id, "ok")
    webhooks = await _start(ledger, [receiver.url], _settings(max_attempts=1))
    try:
        await _claimed(ledger, 1)
        for _ in range(4):
            await _append(ledger, [webhooks])
        await _cursor(ledger, 4)
        assert receiver.cursors() == [1, 2, 4]
        [record] = await ledger.webhooks()
        assert (record.delivered, record.failed, record.last_error) == (3, 1, "HTTP 300")
        [failed] = await ledger.webhook_failures(receiver.url)
        assert failed.cursor == 3
    finally:
        await webhooks.stop()


async def test_a_failed_attempt_is_retried_only_after_the_backoff(
    ledger: SqliteLedger, receiver: Receiver
) -> None:
    """The first retry waits between half and all of `backoff_base` (here 0.4 s): a receiver that
    failed is not asked again at once."""
    asked: list[float] = []

    def plan(msg_id: str, attempt: int) -> str:
        asked.append(asyncio.get_running_loop().time())
        return "fail" if attempt == 1 else "ok"

    receiver.plan = plan
    webhooks = await _start(ledger, [receiver.url], _settings(max_attempts=2, backoff_base=0.4))
    try:
        await _claimed(ledger, 1)
        await _append(ledger, [webhooks])
        await receiver.wait_for(1)
        assert len(asked) == 2
        assert asked[1] - asked[0] >= 0.19
    finally:
        await webhooks.stop()


async def test_an_event_s_last_failed_attempt_is_not_followed_by_a_backoff(
    ledger: SqliteLedger, receiver: Receiver
) -> None:
    """With one attempt per event and a backoff of 30 to 60 s, a failed event is recorded and the
    next one delivered at once: only a retry waits."""
    receiver.plan = lambda msg_id, attempt: "fail" if msg_id == "1" else "ok"
    webhooks = await _start(ledger, [receiver.url], _settings(max_attempts=1, backoff_base=60.0))
    try:
        await _claimed(ledger, 1)
        for _ in range(2):
            await _append(ledger, [webhooks])
        await receiver.wait_for(1, within=20.0)
        assert receiver.cursors() == [2]
    finally:
        await webhooks.stop()


async def _read_request(reader: asyncio.StreamReader) -> None:
    """One whole HTTP request (headers and body), so closing after it resets nothing."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    await reader.readexactly(length)


async def test_a_connection_error_is_recorded_by_its_cause_never_with_the_url_s_token(
    ledger: SqliteLedger,
) -> None:
    """What a failed event records: a refused connection's cause, a dropped one's, and for an
    error whose text holds the URL (a garbled answer) only "failed": the query's token stays out."""

    async def garbled(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HELLO THERE\r\n\r\n")
        await writer.drain()
        writer.close()

    async def dropped(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.close()

    servers = [await asyncio.start_server(h, "127.0.0.1", 0) for h in (garbled, dropped)]
    ports = [s.sockets[0].getsockname()[1] for s in servers]
    with socket.socket() as unheard:  # bound, never listening: every connection refused
        unheard.bind(("127.0.0.1", 0))
        ports.append(unheard.getsockname()[1])
        urls = [f"http://127.0.0.1:{port}/hook?token=s3cret" for port in ports]
        webhooks = await _start(ledger, urls, _settings(max_attempts=1))
        try:
            await _claimed(ledger, 3)
            await _append(ledger, [webhooks])
            async with asyncio.timeout(20):
                while sum(r.failed for r in await ledger.webhooks()) < 3:
                    await asyncio.sleep(0.05)
            errors = [(await ledger.webhook_failures(url))[0].error for url in urls]
        finally:
            await webhooks.stop()
            for server in servers:
                server.close()
    assert errors == [
        "ClientResponseError: failed",
        "ServerDisconnectedError: Server disconnected",
        f"ClientConnectorError: Connect call failed ('127.0.0.1', {ports[2]})",
    ]


async def test_a_proxy_in_the_service_s_environment_is_not_used(
    ledger: SqliteLedger, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service's own POSTs go straight to the URL: an http_proxy in its environment (here one
    nobody listens on) is not theirs."""
    with socket.socket() as unheard:
        unheard.bind(("127.0.0.1", 0))
        for name in ("no_proxy", "NO_PROXY"):
            monkeypatch.delenv(name, raising=False)
        for name in ("http_proxy", "HTTP_PROXY"):
            monkeypatch.setenv(name, f"http://127.0.0.1:{unheard.getsockname()[1]}")
        webhooks = await _start(ledger, [receiver.url], _settings())
        try:
            await _claimed(ledger, 1)
            await _append(ledger, [webhooks])
            await _cursor(ledger, 1)
            assert receiver.cursors() == [1]
        finally:
            await webhooks.stop()


async def test_a_deliverer_made_alone_keeps_its_own_cursor_writer_and_memory(
    ledger: SqliteLedger, receiver: Receiver
) -> None:
    """A `Deliverer` built without the shared parts `Webhooks` hands it reads the log and moves
    its cursor by itself."""
    subscription = Subscription(receiver.url)
    deliverer = Deliverer(
        subscription, ledger, _settings(), Signer(KEYS), rewind_event_json, visibility(subscription, None)
    )
    running = asyncio.create_task(deliverer.run())
    try:
        await _claimed(ledger, 1)
        await _append(ledger, [])
        deliverer.wake()
        await _cursor(ledger, 1)
        assert receiver.cursors() == [1]
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


async def test_events_dropped_by_retention_before_they_were_sent_are_counted_once(
    ledger: SqliteLedger, receiver: Receiver
) -> None:
    """A URL at cursor 2 whose next events (3 to 5) the log's retention dropped meanwhile: the
    missed counter grows by 3, with one warning; a batch with no gap after it warns of nothing."""
    for _ in range(2):
        await _append(ledger, [])
    webhooks = await _start(ledger, [receiver.url], _settings())
    await _claimed(ledger, 1)  # first seen: at cursor 2
    await webhooks.stop()
    for _ in range(5):
        await _append(ledger, [])
    await ledger.trim_events(keep=2, older_than=None)  # 6 and 7 left
    missed = _sample("agent_rewind_webhook_events_missed_total", receiver.url)
    with capture_logs() as logged:
        again = await _start(ledger, [receiver.url], _settings())
        try:
            await receiver.wait_for(2)
            await _append(ledger, [again])
            await receiver.wait_for(3)
        finally:
            await again.stop()
    assert receiver.cursors() == [6, 7, 8]
    assert _sample("agent_rewind_webhook_events_missed_total", receiver.url) - missed == 3
    dropped = [e for e in logged if e["event"].startswith("events dropped by the log's retention")]
    assert [(e["after_cursor"], e["missed"]) for e in dropped] == [(2, 3)]


async def test_the_lag_gauge_counts_the_events_not_yet_done_with(
    ledger: SqliteLedger, receiver: Receiver
) -> None:
    """Three events waiting, the first delivered, the second's attempt under way: a lag of 2."""
    webhooks = await _start(ledger, [receiver.url], _settings())
    await _claimed(ledger, 1)
    await webhooks.stop()
    for _ in range(3):
        await _append(ledger, [])
    receiver.plan = lambda msg_id, attempt: "hang" if msg_id == "2" else "ok"
    again = await _start(ledger, [receiver.url], _settings())
    try:
        async with asyncio.timeout(20):
            await receiver.hanging.wait()
        assert _sample("agent_rewind_webhook_lag_events", receiver.url) == 2
    finally:
        await again.stop()


async def test_a_batch_that_ends_with_another_principal_s_events_moves_past_them_and_keeps_the_lease(
    ledger: SqliteLedger, receiver: Receiver
) -> None:
    """alice's URL given alice's event then bob's: its cursor moves past bob's, the loop keeps its
    lease (it claims no more) and delivers alice's next event."""
    webhooks = await _start(ledger, [receiver.url], _settings(), principal="alice")
    await _claimed(ledger, 1)
    await webhooks.stop()
    await _append(ledger, [], owner="alice")
    await _append(ledger, [], owner="bob")
    again = Webhooks([Subscription(receiver.url, "alice")], ledger, _settings(), KEYS, rewind_event_json)
    claims = _counted_claims(again)
    await again.start()
    try:
        await _cursor(ledger, 2)
        await _append(ledger, [again], owner="alice")
        await receiver.wait_for(2)
        assert receiver.cursors() == [1, 3]
        assert len(claims) == 1, f"the lease was dropped and claimed again: {claims}"
    finally:
        await again.stop()


async def test_a_url_given_back_at_a_stop_is_claimed_by_the_other_within_a_third_of_its_lease(
    ledger: SqliteLedger, receiver: Receiver
) -> None:
    """pod-1 (a 3 s lease) tries again every second while pod-0 holds the URL: pod-0's clean stop
    hands it over well before a lease's length."""
    first = await _start(ledger, [receiver.url], _settings("pod-0"))
    await _claimed(ledger, 1)
    second = Webhooks(
        [Subscription(receiver.url)], ledger, _settings("pod-1", lease_s=3.0), KEYS, rewind_event_json
    )
    claims = _counted_claims(second)
    await second.start()
    try:
        await _until(lambda: len(claims) >= 2)  # refused at its start, and again in its loop
        assert [lease for _, lease in claims] == [None, None]
        await first.stop()
        async with asyncio.timeout(7):  # a third of the lease is 1 s; three times it, 9 s
            while [r.holder for r in await ledger.webhooks()] != ["pod-1"]:
                await asyncio.sleep(0.01)
    finally:
        await first.stop()
        await second.stop()


async def test_a_ledger_failure_while_delivering_is_retried_after_a_third_of_the_lease(
    ledger: SqliteLedger, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log's first read fails: the loop claims again and reads after about a third of its
    1.6 s lease (not at once, and not after 5 s)."""
    reads: list[float] = []
    events_after = ledger.events_after

    async def failing_once(
        cursor: int, session_id: str | None = None, limit: int = 1000
    ) -> list[EventRecord]:
        reads.append(asyncio.get_running_loop().time())
        if len(reads) == 1:
            raise OSError("the database is away")
        return await events_after(cursor, session_id, limit)

    monkeypatch.setattr(ledger, "events_after", failing_once)
    webhooks = await _start(ledger, [receiver.url], _settings(lease_s=1.6))
    try:
        await _until(lambda: len(reads) >= 2)
        assert 0.5 <= reads[1] - reads[0] < 4.0
        await _append(ledger, [webhooks])
        await receiver.wait_for(1)
    finally:
        await webhooks.stop()


async def test_a_held_lease_is_renewed_in_time_and_never_let_go_while_its_holder_runs(
    ledger: SqliteLedger, receiver: Receiver
) -> None:
    """pod-0 (a 3 s lease, renewed every second) keeps the URL past its first lease's end while
    pod-1 tries to claim it every 0.2 s; pod-0 claims it once and never again."""
    first = Webhooks(
        [Subscription(receiver.url)], ledger, _settings("pod-0", lease_s=3.0), KEYS, rewind_event_json
    )
    held = _counted_claims(first)
    await first.start()
    second = Webhooks(
        [Subscription(receiver.url)], ledger, _settings("pod-1", lease_s=0.6), KEYS, rewind_event_json
    )
    tried = _counted_claims(second)
    await second.start()
    try:
        [(claimed_at, lease)] = held
        assert lease is not None
        await _until(lambda: any(t >= claimed_at + 3.6 or got is not None for t, got in tried))
        assert [got for _, got in tried if got is not None] == [], "pod-1 got the URL"
        assert len(held) == 1, "pod-0 let its lease go and claimed it again"
        assert [r.holder for r in await ledger.webhooks()] == ["pod-0"]
    finally:
        await first.stop()
        await second.stop()


async def test_a_lease_taken_over_stops_the_holder_which_delivers_again_once_it_is_free(
    ledger: SqliteLedger, receiver: Receiver
) -> None:
    """Another holder takes pod-0's lease: pod-0's next renewal is refused, it stops holding, and
    once the lease is free again it claims it and delivers the event committed meanwhile, once."""
    webhooks = await _start(ledger, [receiver.url], _settings(lease_s=0.6))
    [deliverer] = webhooks.deliverers
    try:
        await _claimed(ledger, 1)
        thief = None
        async with asyncio.timeout(10):
            while thief is None:
                if deliverer.lease is not None:
                    await ledger.release_webhook(deliverer.lease)
                thief = await ledger.claim_webhook(receiver.url, "thief", 30.0)
        await _until(lambda: deliverer.lease is None)
        await _append(ledger, [webhooks])
        await ledger.release_webhook(thief)
        await receiver.wait_for(1, within=20.0)
        await _cursor(ledger, 1)
        assert receiver.cursors() == [1]
        assert [r.holder for r in await ledger.webhooks()] == ["pod-0"]
    finally:
        await webhooks.stop()
