"""Fan-out of the event log to watchers: replay from the log, then live, with no gap and no
duplicate at the seam, whatever the order in which events are published.

The ledger is the truth: every event is appended, with its gap-free cursor, in the transaction
that records what it tells. The hub keeps the newest events in memory and wakes the watchers;
each watcher delivers cursors in order from its own position: from the hub's memory when it
holds them, from the ledger otherwise (a replay, a watcher that fell behind the memory, an event
published by another replica). A watcher that falls too far behind is ended (SUBSCRIBER_TOO_SLOW,
with the last cursor it was sent) by a monitor, so it never holds back a rewind or another
watcher, and it holds nothing once gone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

import structlog

from agent_rewind import metrics
from agent_rewind.errors import CursorExpired, InvalidArgument, ShuttingDown, SubscriberTooSlow
from agent_rewind.store.ledger import EventLog, EventRecord

log = structlog.get_logger(__name__)

# How many recent events the hub keeps in memory for live delivery.
_CACHE = 4096
# How often the hub looks in the ledger for events nobody published here (another replica's, or
# one whose publisher failed after its commit).
_POLL = 1.0
_BATCH = 500
# A replay reads the ledger this many events at a time: what a watcher holds while its reader
# is slow or gone (held across the yield), whatever the log's size.
_REPLAY_BATCH = 8
# How long after a publish the watchers are woken (a burst of publishes wakes them once).
_WAKE_DELAY = 0.002


@dataclass(frozen=True)
class CaughtUp:
    """The replay is complete; live events follow. `cursor`: the newest when the watch began."""

    cursor: int


Visible = Callable[[EventRecord], bool]


class _Watcher:
    def __init__(self, position: int, max_lag: int, on_too_slow: Callable[[], None] | None) -> None:
        self.position = position  # the last cursor handed on (or skipped as not for this watcher)
        self.watermark = position  # the newest cursor when the watch began (its replay's end)
        self.max_lag = max_lag
        self.on_too_slow = on_too_slow
        self.too_slow = False
        # Woken since it last slept, and the future it sleeps on: its own, so a watcher cancelled
        # while it sleeps cancels nothing of anyone else's. (Cheaper than an asyncio.Event, which
        # a fan-out to a thousand watchers pays a thousand times per event.)
        self._woken = False
        self._sleeping: asyncio.Future[None] | None = None
        # Looked up once: asyncio.get_running_loop() costs a getpid() a call, a delivery each.
        self._loop = asyncio.get_running_loop()

    def wake(self) -> None:
        self._woken = True
        sleeping = self._sleeping
        if sleeping is not None and not sleeping.done():
            sleeping.set_result(None)

    async def sleep(self) -> None:
        """Until woken (at once if woken since it last slept)."""
        if not self._woken:
            self._sleeping = self._loop.create_future()
            try:
                await self._sleeping
            finally:
                self._sleeping = None
        self._woken = False

    def behind(self, newest: int) -> int:
        """Live events not yet handed on. A replay is not counted: its events come from the log
        at the watcher's own pace and cost no memory; live events arriving meanwhile are."""
        return newest - max(self.position, self.watermark)


class EventHub:
    def __init__(
        self,
        ledger: EventLog,
        *,
        max_lag: int = 1000,
        on_session_deleted: Callable[[str], None] | None = None,
    ) -> None:
        self._ledger = ledger
        self._max_lag = max_lag
        self._cache: OrderedDict[int, EventRecord] = OrderedDict()
        self._newest = 0  # the highest cursor such that every cursor up to it is known to exist
        self._watchers: set[_Watcher] = set()
        self._closed = False
        self._chore: asyncio.Task[None] | None = None
        self._wake_scheduled = False
        # Told the id of every session whose SESSION_DELETED the hub learns of (published here,
        # or read from the log): whatever holds copies of its events drops them.
        self._on_session_deleted = on_session_deleted

    async def start(self) -> None:
        _, newest = await self._ledger.event_bounds()
        self._newest = newest
        self._chore = asyncio.create_task(self._watch_ledger(), name="event-hub")

    @property
    def watchers(self) -> int:
        return len(self._watchers)

    @property
    def newest(self) -> int:
        return self._newest

    async def close(self) -> None:
        """Ends every watch (SHUTTING_DOWN)."""
        self._closed = True
        for watcher in self._watchers:
            watcher.wake()
        if self._chore is not None:
            self._chore.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._chore

    def publish(self, event: EventRecord) -> None:
        """An event just committed to the ledger (called by whoever appended it, in this process)."""
        if event.cursor <= self._newest:
            self._remember(event)
            return
        self._remember(event)
        while self._newest + 1 in self._cache:
            self._newest += 1
        self._schedule_wake()

    def _schedule_wake(self) -> None:
        if not self._wake_scheduled:
            # Not at once: whoever published (a Rewind) answers its caller first, and the
            # watchers follow a moment later, however many there are.
            self._wake_scheduled = True
            asyncio.get_running_loop().call_later(_WAKE_DELAY, self._wake_all)

    def _remember(self, event: EventRecord) -> None:
        if event.kind == "SESSION_DELETED":
            # The deletion blanked what the session's earlier events said of its files (the
            # ledger's copies): watchers that replay them now read them from the ledger.
            for cursor in [c for c, e in self._cache.items() if e.session_id == event.session_id]:
                del self._cache[cursor]
            if self._on_session_deleted is not None:
                self._on_session_deleted(event.session_id)
        self._cache[event.cursor] = event
        self._cache.move_to_end(event.cursor)
        while len(self._cache) > _CACHE:
            self._cache.popitem(last=False)

    def _wake_all(self) -> None:
        self._wake_scheduled = False
        for watcher in list(self._watchers):
            if not watcher.too_slow and watcher.behind(self._newest) > watcher.max_lag:
                # It is not keeping up (its reader is slow or gone, and its transport is full):
                # end it, so it resumes from the log, instead of anyone waiting on it.
                watcher.too_slow = True
                if watcher.on_too_slow is not None:
                    watcher.on_too_slow()
                    # Ended by its owner: the hub no longer holds it, whatever its owner waits on.
                    self._watchers.discard(watcher)
            watcher.wake()

    async def _watch_ledger(self) -> None:
        while not self._closed:
            # Woken at once by another replica's append (PostgreSQL's NOTIFY), else every _POLL.
            try:
                await self._ledger.wait_for_events(_POLL)
            except Exception as err:
                log.warning("could not wait for the event log", error=str(err))
                await asyncio.sleep(_POLL)
            try:
                await self._catch_up()
            except Exception as err:  # a failing read now is retried at the next round
                log.warning("could not read the event log", error=str(err))

    async def _catch_up(self) -> None:
        """Learns of events appended without being published here. The ledger is the truth: what
        it holds after `newest` is every event there is, so a cursor it lacks in between was
        trimmed away and is stepped over (only a publish can arrive out of order)."""
        while True:
            found = await self._ledger.events_after(self._newest, limit=_BATCH)
            for event in found:
                self._remember(event)
            if found and found[-1].cursor > self._newest:
                self._newest = found[-1].cursor
                self._schedule_wake()
            if len(found) < _BATCH:
                return

    async def notify(self) -> None:
        """Something was appended elsewhere (another replica): read it now."""
        await self._catch_up()

    async def _events(self, after: int, until: int, session_id: str | None) -> list[EventRecord]:
        """Events after `after` up to `until`, in order: from memory when it holds all of them."""
        wanted = range(after + 1, until + 1)
        if wanted and all(c in self._cache for c in wanted[:_BATCH]):
            return [self._cache[c] for c in wanted[:_BATCH]]
        found = await self._ledger.events_after(after, session_id, limit=_REPLAY_BATCH)
        oldest, _ = await self._ledger.event_bounds()
        if after + 1 < oldest:
            # Retention dropped events this watcher had yet to see: it must resync, not skip them.
            raise CursorExpired(after, oldest)
        return [e for e in found if e.cursor <= until]

    async def watch(
        self,
        after: int | None,
        session_id: str | None,
        visible: Visible,
        *,
        on_too_slow: Callable[[], None] | None = None,
    ) -> AsyncGenerator[EventRecord | CaughtUp, None]:
        """Events after `after` (None: only new ones), then CaughtUp, then live events.

        Raises CursorExpired for an `after` older than the oldest retained event, InvalidArgument
        for one beyond the newest, ShuttingDown when the hub closes. A watcher that falls more
        than `max_lag` live events behind is ended: `on_too_slow` is called (once) to end it
        even while it waits on its transport; without it, SubscriberTooSlow is raised here.
        """
        if self._closed:
            raise ShuttingDown()
        oldest, newest = await self._ledger.event_bounds()
        newest = max(newest, self._newest)
        if after is not None and after > newest:
            raise InvalidArgument(
                "after_cursor",
                f"{after} is beyond the newest event ({newest}): not a cursor of this deployment",
            )
        if after is not None and after > 0 and after + 1 < oldest:
            raise CursorExpired(after, oldest)
        if after is not None and after == 0 and oldest > 1:
            after = oldest - 1  # 0: from the oldest retained event
        # Registered before the replay reads anything: what is published meanwhile wakes it.
        watcher = _Watcher(newest if after is None else after, self._max_lag, on_too_slow)
        watcher.watermark = newest
        self._watchers.add(watcher)
        try:
            until = newest  # first the replay, up to the newest cursor when the watch began
            replayed = False
            while True:
                while watcher.position < until:
                    # The one new event, in memory (live, the common case), without a call to await.
                    cached = self._cache.get(until) if until == watcher.position + 1 else None
                    batch = (
                        [cached]
                        if cached is not None
                        else await self._events(watcher.position, until, session_id)
                    )
                    if not batch:
                        # Only events of other sessions (or trimmed ones) lie in between.
                        watcher.position = until
                        break
                    batch.reverse()
                    while batch:
                        # Each event let go of as it is handed on: a reader that stops holds no more.
                        event = batch.pop()
                        watcher.position = event.cursor
                        if (session_id is None or event.session_id == session_id) and visible(event):
                            metrics.EVENTS_SENT.inc()
                            yield event
                        del event
                if not replayed:
                    replayed = True
                    yield CaughtUp(newest)
                await watcher.sleep()
                if self._closed:
                    raise ShuttingDown()
                if watcher.too_slow and on_too_slow is None:
                    raise SubscriberTooSlow(watcher.position)
                until = self._newest
        finally:
            self._watchers.discard(watcher)
