"""One URL's delivery: holds the URL's lease in the ledger, sends its events after the cursor in
order, and moves the cursor past each once it is done with (delivered, or failed for good).

At least once, in cursor order: the cursor moves only after the receiver's 2xx (or the event's
last failed attempt), in a ledger write that commits only while this replica's lease on the URL
is current (`WebhookCursors.advance_webhook`) and its replica epoch too (`Ledger.fence`). So
after a crash, a restart, or another replica's takeover of a lapsed lease, delivery resumes at
the first event not known done: the only duplicates are the events that were in flight (sent,
their cursor not yet moved) when the previous holder stopped.

Exactly one holder at a time: a lease of `lease_s` seconds, renewed every third of it by a
task beside the sending; a renewal refused (the lease lapsed, or another holder took it) stops
the sending at once, and the loop goes back to claiming. Everything here waits on the network
or the ledger, never on a rewind: a URL that fails or hangs holds up nothing but itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import structlog

from agent_rewind import __version__, metrics
from agent_rewind.store.ledger import (
    EventLog,
    EventRecord,
    WebhookCursors,
    WebhookFailure,
    WebhookLease,
    WebhookMove,
    now,
)
from agent_rewind.webhooks import backoff
from agent_rewind.webhooks.cursors import CursorWriter
from agent_rewind.webhooks.envelope import Encode
from agent_rewind.webhooks.recent import Recent
from agent_rewind.webhooks.signing import Signer
from agent_rewind.webhooks.subscriptions import Subscription, Visible

if TYPE_CHECKING:
    # Imported where a URL is served (`run`): a server with no webhook never loads aiohttp,
    # about half a second of its start.
    import aiohttp

log = structlog.get_logger(__name__)

USER_AGENT = f"agent-rewind/{__version__}"
# Events read from the log at a time.
BATCH = 100
# How often an idle loop looks in the log for events it was not woken for (another replica's).
POLL = 1.0


class Store(EventLog, WebhookCursors, Protocol):
    """The ledger parts delivery uses."""


@dataclass(frozen=True)  # gremlin: pardon[equivalent] nothing assigns to or hashes one
class Settings:
    holder: str  # this replica's id
    lease_s: float
    max_attempts: int
    timeout_s: float  # one attempt, connecting included
    backoff_base: float = backoff.BASE
    backoff_cap: float = backoff.CAP
    poll_s: float = POLL


class LeaseLost(Exception):
    """The lease lapsed or was taken: this replica no longer delivers the URL."""


class Deliverer:
    def __init__(
        self,
        subscription: Subscription,
        store: Store,
        settings: Settings,
        signer: Signer,
        encode: Encode,
        visible: Visible,
        cursors: CursorWriter | None = None,
        recent: Recent | None = None,
    ) -> None:
        self.subscription = subscription
        self._cursors = cursors or CursorWriter(store)
        self._recent = recent or Recent(store, encode)
        self._store = store
        self._settings = settings
        self._signer = signer
        self._visible = visible
        self._wake = asyncio.Event()
        self._label = subscription.shown
        self.lease: WebhookLease | None = None
        self._advancing: asyncio.Future[bool] | None = None

    def wake(self) -> None:
        """An event was committed: look in the log now."""
        self._wake.set()

    async def claim(self) -> WebhookLease | None:
        """The URL's lease, if no one else holds it (None too when the ledger fails now)."""
        settings = self._settings
        try:
            return await self._store.claim_webhook(self.subscription.url, settings.holder, settings.lease_s)
        except Exception as err:
            log.warning("could not claim a webhook URL", webhook=self._label, error=str(err))
            return None

    async def run(self, first: WebhookLease | None = None) -> None:
        """Delivers the URL's events (from `first`, a lease claimed already) until cancelled,
        claiming it whenever it is free; a lease lost or a ledger that fails is waited out and
        claimed again."""
        import aiohttp

        settings = self._settings
        async with aiohttp.ClientSession(
            # The service's own requests: no proxy from its environment, no cookies kept.
            trust_env=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(total=settings.timeout_s, connect=settings.timeout_s),
        ) as http:
            while True:
                lease, first = first or await self.claim(), None
                if lease is None:
                    await self._idle(settings.lease_s / 3)
                    continue
                log.info("delivering to a webhook URL", webhook=self._label, after_cursor=lease.cursor)
                metrics.WEBHOOK_HELD.labels(self._label).set(1)
                self.lease = lease
                try:
                    await self._hold(lease, http)
                except asyncio.CancelledError:
                    # The server stops: the cursor's move under way is let finish, and the lease is
                    # given back, so another replica need not wait for it to lapse (an attempt in
                    # flight is sent again by whoever holds it next).
                    with contextlib.suppress(Exception):
                        if self._advancing is not None:
                            await asyncio.wait_for(self._advancing, 5)
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(self._store.release_webhook(lease), 5)
                    raise
                except LeaseLost:
                    log.info("no longer delivering to a webhook URL: its lease lapsed", webhook=self._label)
                except Exception as err:
                    log.warning(
                        "webhook delivery stopped; claiming again", webhook=self._label, error=str(err)
                    )
                    await asyncio.sleep(min(settings.lease_s / 3, 5.0))
                finally:
                    self.lease = None
                    metrics.WEBHOOK_HELD.labels(self._label).set(0)
                    metrics.WEBHOOK_LAG.labels(self._label).set(0)

    async def _idle(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)
        self._wake.clear()

    async def _hold(self, lease: WebhookLease, http: aiohttp.ClientSession) -> None:
        """Sends while a renewal task keeps the lease; whichever ends first ends the other."""
        sending = asyncio.create_task(self._send_all(lease, http), name=f"webhook-send {self._label}")
        renewing = asyncio.create_task(self._renew(lease), name=f"webhook-lease {self._label}")
        try:
            await asyncio.wait({sending, renewing}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sending, renewing):
                task.cancel()
            # gremlin: pardon[equivalent] not returned, the same first error is raised (by gather); the cancelled task ends a step later
            results = await asyncio.gather(sending, renewing, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                raise result

    async def _renew(self, lease: WebhookLease) -> None:
        settings = self._settings
        while True:
            await asyncio.sleep(settings.lease_s / 3)
            try:
                renewed = await self._store.renew_webhook(lease, settings.holder, settings.lease_s)
            except Exception as err:  # the ledger away: the lease may lapse; advances then fail
                log.warning("could not renew a webhook lease", webhook=self._label, error=str(err))
                continue
            if not renewed:
                raise LeaseLost()

    async def _send_all(self, lease: WebhookLease, http: aiohttp.ClientSession) -> None:
        cursor = lease.cursor
        while True:
            self._wake.clear()
            batch = await self._recent.after(cursor, BATCH)
            if not batch:
                metrics.WEBHOOK_LAG.labels(self._label).set(0)
                await self._idle(self._settings.poll_s)
                continue
            if batch[0].cursor > cursor + 1:
                missed = batch[0].cursor - cursor - 1
                metrics.WEBHOOK_MISSED.labels(self._label).inc(missed)
                log.warning(
                    "events dropped by the log's retention before this URL was sent them",
                    webhook=self._label,
                    after_cursor=cursor,
                    missed=missed,
                )
            newest = max(self._recent.newest, batch[-1].cursor)
            skipped = 0
            for event in batch:
                metrics.WEBHOOK_LAG.labels(self._label).set(max(0, newest - cursor))
                if not self._visible(event):
                    skipped = event.cursor
                    continue
                failure = await self._deliver(event, http)
                outcome = "failed" if failure is not None else "delivered"
                metrics.WEBHOOK_EVENTS.labels(self._label, outcome).inc()
                delivered = 0 if failure is not None else 1
                if not await self._advance(lease, event.cursor, delivered=delivered, failure=failure):
                    raise LeaseLost()
                cursor, skipped = event.cursor, 0
            if skipped:  # the batch ended with events not for this URL: past them too
                if not await self._advance(lease, skipped):
                    raise LeaseLost()
                cursor = skipped

    async def _advance(
        self, lease: WebhookLease, cursor: int, *, delivered: int = 0, failure: WebhookFailure | None = None
    ) -> bool:
        """Moves the cursor, in a task a stop does not cancel (`run` waits for it before giving
        the lease back): an event the receiver took is not sent again after a clean stop."""
        self._advancing = asyncio.ensure_future(
            self._cursors.advance(WebhookMove(lease, cursor, delivered, failure))
        )
        try:
            return await asyncio.shield(self._advancing)
        finally:
            if self._advancing.done():
                self._advancing = None

    async def _deliver(self, event: EventRecord, http: aiohttp.ClientSession) -> WebhookFailure | None:
        """POSTs the event until a 2xx, or its attempts run out (then the failure to record)."""
        settings = self._settings
        sealed = self._recent.envelope(event)
        body = sealed.body.encode("utf-8")
        error = ""
        for attempt in range(1, settings.max_attempts + 1):
            headers = {
                "content-type": sealed.content_type,
                "user-agent": USER_AGENT,
                **self._signer.headers(sealed.msg_id, sealed.body),
            }
            result, error = await self._attempt(http, body, headers)
            metrics.WEBHOOK_ATTEMPTS.labels(self._label, result).inc()
            if result == "ok":
                metrics.WEBHOOK_DELIVERY_SECONDS.labels(self._label).observe(
                    max(0.0, (now() - event.occur_time).total_seconds())
                )
                return None
            if attempt < settings.max_attempts:
                await asyncio.sleep(
                    backoff.delay(attempt, base=settings.backoff_base, cap=settings.backoff_cap)
                )
        log.warning(
            "webhook delivery failed; the event is recorded as failed and delivery goes on",
            webhook=self._label,
            cursor=event.cursor,
            attempts=settings.max_attempts,
            error=error,
        )
        return WebhookFailure(self.subscription.url, event.cursor, settings.max_attempts, error, now())

    async def _attempt(
        self, http: aiohttp.ClientSession, body: bytes, headers: dict[str, str]
    ) -> tuple[str, str]:
        """One POST: ("ok", "") for a 2xx, else its result label and what went wrong. A redirect
        is not followed (it is a failure: the URL is the operator's to correct)."""
        import aiohttp

        started = time.monotonic()
        try:
            async with http.post(
                self.subscription.url, data=body, headers=headers, allow_redirects=False
            ) as answer:
                if 200 <= answer.status < 300:
                    return "ok", ""
                return "http_error", f"HTTP {answer.status}"
        except TimeoutError:
            return "timeout", f"no answer within {time.monotonic() - started:.1f} s"
        except aiohttp.ClientError as err:
            return "connection_error", f"{type(err).__name__}: {_reason(err, self.subscription.url)}"


def _reason(err: aiohttp.ClientError, url: str) -> str:
    """What went wrong, without the URL (which may hold a token in its query)."""
    import aiohttp

    if isinstance(err, aiohttp.ClientConnectorError):
        return str(err.os_error.strerror or err.os_error)
    text = str(err)
    return "failed" if not text or url in text else text
