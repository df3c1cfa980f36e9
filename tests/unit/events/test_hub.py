"""The event hub on a real SQLite ledger: replay, the seam with live delivery, cursor order
whatever the publish order, the ledger poll, retention, filters, slow watchers and shutdown.

Events are appended the way the service appends them (a rewind begun, then completed with its
event in the same transaction) and published, late, out of order or not at all, by the test.
The SQLite ledger reads inline, so a watch only lets other tasks run where it yields an item or
waits for a wake-up: the interleavings below are exactly those a real server can produce.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

import agent_rewind.events.hub as hub_module
from agent_rewind.errors import CursorExpired, InvalidArgument, ShuttingDown, SubscriberTooSlow
from agent_rewind.events.hub import CaughtUp, EventHub
from agent_rewind.store.ledger import EventRecord, NewEvent, NewRewind, NewSession
from agent_rewind.store.sqlite import SqliteLedger

SID = "0b7f3c1e-5a8d-4d6e-9f10-2a3b4c5d6e7f"
OTHER = "1c8e4d2f-6b9e-4e7f-8a21-3b4c5d6e7f80"
# How long a test waits for something that should happen at once (a failure, not a pace).
SOON = 2.0

Item = EventRecord | CaughtUp
Watch = AsyncGenerator[Item, None]
MakeHub = Callable[..., Awaitable[EventHub]]


class Log:
    """Appends events through the ledger's own API, as the rewind engine does."""

    def __init__(self, ledger: SqliteLedger) -> None:
        self.ledger = ledger
        self._count = 0

    async def append(self, session_id: str = SID) -> EventRecord:
        """Commits one event (not published: the caller decides when, or whether)."""
        self._count += 1
        rewind_id = f"rw-{self._count}"
        await self.ledger.begin_rewind(
            NewRewind(rewind_id, session_id, f"msg-{self._count}", "both", {}, principal="alice")
        )
        return await self.ledger.complete_rewind(
            rewind_id,
            {"rewind_id": rewind_id},
            None,
            NewEvent("REWOUND", session_id, rewind_id, "alice", {"n": self._count}),
        )

    async def append_many(self, count: int, session_id: str = SID) -> list[EventRecord]:
        return [await self.append(session_id) for _ in range(count)]


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[SqliteLedger]:
    db = await SqliteLedger.open(tmp_path / "l.sqlite3")
    for sid in (SID, OTHER):
        await db.add_session(NewSession(sid, f"/ws/{sid[:4]}", {}, True))
    try:
        yield db
    finally:
        await db.close()


@pytest.fixture
def log(ledger: SqliteLedger) -> Log:
    return Log(ledger)


@pytest.fixture(autouse=True)
def no_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hub's ledger poll stays out of the way unless a test asks for it."""
    monkeypatch.setattr(hub_module, "_POLL", 3600.0)


@pytest.fixture
async def hubs(ledger: SqliteLedger) -> AsyncIterator[MakeHub]:
    made: list[EventHub] = []

    async def make(max_lag: int = 1000, on_session_deleted: Callable[[str], None] | None = None) -> EventHub:
        hub = EventHub(ledger, max_lag=max_lag, on_session_deleted=on_session_deleted)
        await hub.start()
        made.append(hub)
        return hub

    yield make
    for hub in made:
        await hub.close()


def everything(_: EventRecord) -> bool:
    return True


def shown(item: Item) -> int | CaughtUp:
    """An event as its cursor; CaughtUp as itself."""
    return item.cursor if isinstance(item, EventRecord) else item


async def next_of(watch: Watch) -> Item:
    return await asyncio.wait_for(anext(watch), SOON)


async def take(watch: Watch, count: int) -> list[int | CaughtUp]:
    return [shown(await next_of(watch)) for _ in range(count)]


async def _next(watch: Watch) -> Item:
    return await anext(watch)


def waiting_for(watch: Watch) -> asyncio.Task[Item]:
    return asyncio.create_task(_next(watch))


async def spin() -> None:
    """Lets every ready task run a few rounds (the hub delivers without leaving the loop)."""
    for _ in range(20):
        await asyncio.sleep(0)


async def until(condition: Callable[[], bool]) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.001)

    await asyncio.wait_for(poll(), SOON)


async def nothing_more(watch: Watch) -> None:
    """Nothing else is handed on (no duplicate, nothing out of thin air)."""
    task = waiting_for(watch)
    await spin()
    done = task.done()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert not done, f"unexpected {shown(task.result())}"


class Reader:
    """Reads a watch as fast as items come. Once it has an event, the hub has weighed every
    watcher's lag against that event (the same wake-up round wakes them all)."""

    def __init__(self, watch: Watch) -> None:
        self._items: asyncio.Queue[int | CaughtUp] = asyncio.Queue()
        self.last = -1  # the cursor of the last event (or CaughtUp) read
        self.task = asyncio.create_task(self._read(watch))

    async def _read(self, watch: Watch) -> None:
        async for item in watch:
            self.last = item.cursor
            self._items.put_nowait(shown(item))

    async def reached(self, cursor: int) -> None:
        await until(lambda: self.last >= cursor)

    async def got(self, count: int = 1) -> list[int | CaughtUp]:
        return [await asyncio.wait_for(self._items.get(), SOON) for _ in range(count)]

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


# 1. Live only


async def test_a_watch_without_a_cursor_starts_with_caught_up_then_only_new_events(
    log: Log, hubs: MakeHub
) -> None:
    hub = await hubs()
    for event in await log.append_many(3):
        hub.publish(event)
    watch = hub.watch(None, None, everything)
    assert shown(await next_of(watch)) == CaughtUp(3)
    for event in await log.append_many(2):
        hub.publish(event)
    assert await take(watch, 2) == [4, 5]
    await nothing_more(watch)


# 2. Replay, then live: the seam


@pytest.mark.parametrize("source", ["memory", "ledger"])
async def test_replay_then_live_has_no_gap_and_no_duplicate_while_events_land_mid_replay(
    source: str, log: Log, hubs: MakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hub_module, "_BATCH", 4)  # the replay reads in several rounds
    monkeypatch.setattr(hub_module, "_REPLAY_BATCH", 4)
    if source == "memory":
        hub = await hubs()
        for event in await log.append_many(7):
            hub.publish(event)
    else:  # the hub learns of these only from the ledger: its memory holds none of them
        await log.append_many(7)
        hub = await hubs()
    late = await log.append()  # 8: committed before the watch begins, published mid-replay

    held: list[EventRecord] = []

    async def hold() -> None:
        held.append(await log.append())

    async def publish_new_then_held() -> None:
        new = await log.append()
        hub.publish(new)
        hub.publish(held.pop())

    async def publish_late() -> None:
        hub.publish(late)

    async def append_and_publish() -> None:
        hub.publish(await log.append())

    # What lands while the watch is suspended after handing on each replayed event.
    script = {
        3: hold,  # 9 committed, not published yet
        4: publish_new_then_held,  # 10 published before 9
        5: publish_late,  # 8 published at last
        6: append_and_publish,  # 11
        7: hold,  # 12
        8: publish_new_then_held,  # 13 before 12: the last publish happens before CaughtUp
    }
    # A live watcher beside it: once it has an event, the hub has woken every watcher for it.
    probe = Reader(hub.watch(None, None, everything))
    await probe.reached(8)
    watch = hub.watch(2, None, everything)
    seen: list[int | CaughtUp] = []
    try:
        while len(seen) < 12:
            item = await next_of(watch)
            seen.append(shown(item))
            if isinstance(item, EventRecord) and item.cursor in script:
                await script.pop(item.cursor)()
                await probe.reached(hub.newest)
        assert seen == [3, 4, 5, 6, 7, 8, CaughtUp(8), 9, 10, 11, 12, 13]
        await nothing_more(watch)
    finally:
        await probe.stop()


async def test_the_seam_holds_while_another_task_appends_and_publishes(
    log: Log, hubs: MakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hub_module, "_BATCH", 3)
    monkeypatch.setattr(hub_module, "_REPLAY_BATCH", 3)
    await log.append_many(5)  # before the hub: read back from the ledger
    hub = await hubs()
    for event in await log.append_many(5):  # in the hub's memory
        hub.publish(event)
    watch = hub.watch(0, None, everything)
    seen = [shown(await next_of(watch))]  # the watch has begun: its replay ends at 10
    written: asyncio.Queue[int] = asyncio.Queue()

    async def writer() -> None:
        for _ in range(10):
            first, second = await log.append(), await log.append()
            hub.publish(second)
            written.put_nowait(second.cursor)
            await asyncio.sleep(0)
            hub.publish(first)

    task = asyncio.create_task(writer())
    while seen[-1] != 30:
        item = await next_of(watch)
        seen.append(shown(item))
        if isinstance(item, EventRecord) and item.cursor <= 10:
            # Not faster than the writer: live events land while the replay is still reading.
            await asyncio.wait_for(written.get(), SOON)
    await task
    assert seen == [*range(1, 11), CaughtUp(10), *range(11, 31)]
    await nothing_more(watch)


# 3. Publish order


async def test_events_published_out_of_order_reach_a_live_watcher_in_cursor_order(
    log: Log, hubs: MakeHub
) -> None:
    hub = await hubs()
    for event in await log.append_many(4):
        hub.publish(event)
    watch = hub.watch(None, None, everything)
    assert shown(await next_of(watch)) == CaughtUp(4)
    fifth, sixth = await log.append(), await log.append()
    waiting = waiting_for(watch)
    hub.publish(sixth)
    await spin()
    assert hub.newest == 4  # 5 is not known here yet: nothing beyond it counts as known
    hub.publish(fifth)
    assert hub.newest == 6
    assert shown(await asyncio.wait_for(waiting, SOON)) == 5
    assert shown(await next_of(watch)) == 6
    await nothing_more(watch)


# 4. Events nobody published here


async def test_an_event_nobody_published_reaches_live_watchers_through_the_poll(
    log: Log, hubs: MakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hub_module, "_POLL", 0.05)
    hub = await hubs()
    watch = hub.watch(None, None, everything)
    assert shown(await next_of(watch)) == CaughtUp(0)
    await log.append()  # 1: its publisher failed after the commit
    hub.publish(await log.append())  # 2: published, but behind 1
    await log.append()  # 3: another replica's
    assert await take(watch, 3) == [1, 2, 3]
    assert hub.newest == 3
    await nothing_more(watch)


async def test_notify_reads_events_appended_elsewhere_at_once(log: Log, hubs: MakeHub) -> None:
    hub = await hubs()
    watch = hub.watch(None, None, everything)
    assert shown(await next_of(watch)) == CaughtUp(0)
    await log.append_many(2)  # another replica's
    waiting = waiting_for(watch)
    await spin()
    assert not waiting.done()  # (the poll is off: nothing else would tell the hub)
    await hub.notify()
    assert shown(await asyncio.wait_for(waiting, SOON)) == 1
    assert shown(await next_of(watch)) == 2
    assert hub.newest == 2


# 5. Cursors: retention and range


async def test_after_zero_replays_from_the_oldest_retained_event(
    log: Log, hubs: MakeHub, ledger: SqliteLedger
) -> None:
    hub = await hubs()
    for event in await log.append_many(6):
        hub.publish(event)
    assert await take(hub.watch(0, None, everything), 7) == [1, 2, 3, 4, 5, 6, CaughtUp(6)]
    await ledger.trim_events(keep=3, older_than=None)
    assert await take(hub.watch(0, None, everything), 4) == [4, 5, 6, CaughtUp(6)]


async def test_a_cursor_older_than_retention_is_expired_and_the_one_just_before_the_oldest_is_not(
    log: Log, hubs: MakeHub, ledger: SqliteLedger
) -> None:
    hub = await hubs()
    for event in await log.append_many(6):
        hub.publish(event)
    await ledger.trim_events(keep=3, older_than=None)  # the oldest retained is 4
    for after in (1, 2):
        with pytest.raises(CursorExpired) as expired:
            await next_of(hub.watch(after, None, everything))
        assert expired.value.metadata == {"oldest_cursor": "4"}
    assert await take(hub.watch(3, None, everything), 4) == [4, 5, 6, CaughtUp(6)]
    assert hub.watchers == 1  # the expired ones were never held


async def test_a_cursor_beyond_the_newest_is_an_invalid_after_cursor(log: Log, hubs: MakeHub) -> None:
    hub = await hubs()
    for event in await log.append_many(3):
        hub.publish(event)
    with pytest.raises(InvalidArgument) as invalid:
        await next_of(hub.watch(4, None, everything))
    assert invalid.value.field == "after_cursor"
    assert invalid.value.metadata == {"field": "after_cursor"}
    assert await take(hub.watch(3, None, everything), 1) == [CaughtUp(3)]  # the newest itself is fine


# 6. Retention during a replay


async def test_events_trimmed_away_mid_replay_end_the_watch_with_cursor_expired(
    log: Log, hubs: MakeHub, ledger: SqliteLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hub_module, "_REPLAY_BATCH", 2)
    await log.append_many(10)
    hub = await hubs()  # after the appends: its memory is empty, the replay reads the ledger
    watch = hub.watch(0, None, everything)
    assert await take(watch, 2) == [1, 2]
    await ledger.trim_events(keep=3, older_than=None)  # 3..7, not yet handed on, are gone
    with pytest.raises(CursorExpired) as expired:
        await next_of(watch)
    assert expired.value.metadata == {"oldest_cursor": "8"}
    assert hub.watchers == 0


# 7. Session filter


@pytest.mark.parametrize("source", ["memory", "ledger"])
async def test_a_session_watch_gets_only_that_sessions_events_and_the_global_caught_up(
    source: str, log: Log, hubs: MakeHub
) -> None:
    sessions = [SID, OTHER, SID, OTHER, OTHER]  # cursors 1..5: the newest is OTHER's
    if source == "memory":
        hub = await hubs()
        for sid in sessions:
            hub.publish(await log.append(sid))
    else:
        for sid in sessions:
            await log.append(sid)
        hub = await hubs()
    watch = hub.watch(0, SID, everything)
    first = await next_of(watch)
    assert isinstance(first, EventRecord) and first.session_id == SID
    assert [shown(first), *await take(watch, 2)] == [1, 3, CaughtUp(5)]
    assert await take(hub.watch(None, SID, everything), 1) == [CaughtUp(5)]
    for sid in (OTHER, SID, OTHER, SID):  # 6..9
        hub.publish(await log.append(sid))
    assert await take(watch, 2) == [7, 9]
    await nothing_more(watch)


# 8. Visibility


async def test_invisible_events_are_skipped_without_breaking_order_or_position(
    log: Log, hubs: MakeHub
) -> None:
    hub = await hubs()
    for event in await log.append_many(6):
        hub.publish(event)

    def visible(event: EventRecord) -> bool:
        return event.cursor % 3 != 0  # 3, 6, 9 are someone else's

    watch = hub.watch(0, None, visible)
    assert await take(watch, 5) == [1, 2, 4, 5, CaughtUp(6)]
    for event in await log.append_many(4):  # 7..10
        hub.publish(event)
    assert await take(watch, 3) == [7, 8, 10]
    await nothing_more(watch)


# 9. Slow watchers


async def test_a_watcher_that_stops_reading_is_ended_with_subscriber_too_slow_and_others_go_on(
    log: Log, hubs: MakeHub
) -> None:
    hub = await hubs(max_lag=2)
    slow = hub.watch(None, None, everything)
    assert await take(slow, 1) == [CaughtUp(0)]
    fast = Reader(hub.watch(None, None, everything))
    try:
        assert await fast.got() == [CaughtUp(0)]
        hub.publish(await log.append())
        assert await take(slow, 1) == [1]  # then it stops reading
        assert await fast.got() == [1]
        for expected in range(2, 7):
            hub.publish(await log.append())
            assert await fast.got() == [expected]  # every event, in order
        with pytest.raises(SubscriberTooSlow) as too_slow:
            await next_of(slow)
        assert too_slow.value.metadata == {"last_cursor": "1"}
        assert hub.watchers == 1
        hub.publish(await log.append())
        assert await fast.got() == [7]
    finally:
        await fast.stop()


async def test_a_watcher_exactly_max_lag_behind_is_kept(log: Log, hubs: MakeHub) -> None:
    hub = await hubs(max_lag=2)
    watch = hub.watch(None, None, everything)
    assert await take(watch, 1) == [CaughtUp(0)]
    probe = Reader(hub.watch(None, None, everything))
    try:
        assert await probe.got() == [CaughtUp(0)]
        for _ in range(2):
            for event in await log.append_many(2):
                hub.publish(event)
            await probe.got(2)  # the hub has weighed the watcher 2 behind
            assert await take(watch, 2) == [event.cursor - 1, event.cursor]
    finally:
        await probe.stop()


async def test_with_on_too_slow_it_is_called_once_and_the_hub_lets_go_of_the_watcher_at_once(
    log: Log, hubs: MakeHub
) -> None:
    hub = await hubs(max_lag=2)
    calls: list[int] = []
    slow = hub.watch(None, None, everything, on_too_slow=lambda: calls.append(hub.newest))
    assert await take(slow, 1) == [CaughtUp(0)]
    probe = Reader(hub.watch(None, None, everything))
    try:
        assert await probe.got() == [CaughtUp(0)]
        for event in await log.append_many(2):
            hub.publish(event)
        assert await probe.got(2) == [1, 2]
        assert (calls, hub.watchers) == ([], 2)  # max_lag behind: still held
        hub.publish(await log.append())
        assert await probe.got() == [3]
        # Let go of in the round that found it too slow, though nothing has read it since.
        assert (calls, hub.watchers) == ([3], 1)
        for expected in (4, 5, 6):
            hub.publish(await log.append())
            assert await probe.got() == [expected]
        assert calls == [3]
    finally:
        await probe.stop()
    await slow.aclose()


# 10. A replay is not lag


async def test_a_replay_far_behind_the_newest_is_not_cut_off(log: Log, hubs: MakeHub) -> None:
    hub = await hubs(max_lag=2)
    for event in await log.append_many(20):
        hub.publish(event)
    probe = Reader(hub.watch(None, None, everything))
    try:
        assert await probe.got() == [CaughtUp(20)]
        watch = hub.watch(0, None, everything)
        seen = await take(watch, 3)  # 17 behind the newest, mid-replay
        for event in await log.append_many(2):  # live events meanwhile: within max_lag
            hub.publish(event)
        assert await probe.got(2) == [21, 22]  # the hub has weighed the replaying watcher
        seen += await take(watch, 20)
        assert seen == [*range(1, 21), CaughtUp(20), 21, 22]
        hub.publish(await log.append())
        assert await take(watch, 1) == [23]
    finally:
        await probe.stop()


# 11. Shutdown


async def test_close_ends_live_watchers_with_shutting_down_and_refuses_new_ones(
    log: Log, hubs: MakeHub
) -> None:
    hub = await hubs()
    reader = Reader(hub.watch(None, None, everything))
    assert await reader.got() == [CaughtUp(0)]
    hub.publish(await log.append())
    assert await reader.got() == [1]  # (no wake-up is pending any more)
    new_only, replayed = hub.watch(None, None, everything), hub.watch(0, None, everything)
    assert await take(new_only, 1) == [CaughtUp(1)]
    assert await take(replayed, 2) == [1, CaughtUp(1)]
    waiting = [reader.task, waiting_for(new_only), waiting_for(replayed)]
    await spin()
    assert not any(task.done() for task in waiting)
    await hub.close()
    for task in waiting:
        with pytest.raises(ShuttingDown):
            await asyncio.wait_for(task, SOON)
    assert hub.watchers == 0
    for after in (None, 0):
        with pytest.raises(ShuttingDown):
            await next_of(hub.watch(after, None, everything))
    assert hub.watchers == 0


# 12. Abandoned watches


async def test_an_abandoned_watch_is_let_go(log: Log, hubs: MakeHub) -> None:
    hub = await hubs()
    for event in await log.append_many(3):
        hub.publish(event)

    closed_live = hub.watch(None, None, everything)
    assert await take(closed_live, 1) == [CaughtUp(3)]
    closed_mid_replay = hub.watch(0, None, everything)
    assert await take(closed_mid_replay, 1) == [1]
    assert hub.watchers == 2
    await closed_live.aclose()
    await closed_mid_replay.aclose()
    assert hub.watchers == 0

    async def consume(watch: Watch) -> None:
        async for _ in watch:
            pass

    reader = asyncio.create_task(consume(hub.watch(0, None, everything)))
    await until(lambda: hub.watchers == 1)
    await spin()  # it waits for live events now
    reader.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await reader
    assert hub.watchers == 0


# Retention ahead of the hub (found while writing these tests: the hub used to stall here)


async def test_events_trimmed_before_the_hub_learned_of_them_do_not_stall_live_delivery(
    log: Log, hubs: MakeHub, ledger: SqliteLedger
) -> None:
    hub = await hubs()
    behind = hub.watch(None, None, everything)
    assert await take(behind, 1) == [CaughtUp(0)]
    await log.append_many(5)  # another replica's (or their publisher failed after the commit)
    await ledger.trim_events(keep=2, older_than=None)  # retention drops 1..3 before the hub polls
    await hub.notify()
    assert hub.newest == 5
    # The live watcher never saw 1..3: it must resync, not skip them.
    with pytest.raises(CursorExpired) as expired:
        await next_of(behind)
    assert expired.value.metadata == {"oldest_cursor": "4"}
    # Live delivery goes on past the gap.
    watch = hub.watch(None, None, everything)
    assert await take(watch, 1) == [CaughtUp(5)]
    hub.publish(await log.append())
    assert await take(watch, 1) == [6]


async def test_a_session_s_deletion_replays_its_earlier_events_as_the_ledger_now_has_them(
    hubs: MakeHub, log: Log, ledger: SqliteLedger
) -> None:
    """DeleteSession blanks what the session's earlier events said of its files in the ledger:
    the hub does not hand on the copies it held in memory."""
    hub = await hubs()
    await ledger.begin_rewind(NewRewind("rw-files", SID, "m", "files", {}, principal="alice"))
    rewound = await ledger.complete_rewind(
        "rw-files",
        {},
        None,
        NewEvent("REWOUND", SID, "rw-files", "alice", {"files": {"files_changed": ["/ws/secret.txt"]}}),
    )
    theirs = await log.append(OTHER)
    for event in (rewound, theirs):
        hub.publish(event)
    deleted = await ledger.erase_session(SID, NewEvent("SESSION_DELETED", SID, data={"owner": ""}))
    hub.publish(deleted)
    watch = hub.watch(0, None, everything)
    replay = [await next_of(watch) for _ in range(4)]
    await watch.aclose()
    assert [shown(i) for i in replay] == [
        rewound.cursor,
        theirs.cursor,
        deleted.cursor,
        CaughtUp(deleted.cursor),
    ]
    assert isinstance(replay[0], EventRecord) and replay[0].data == {"files": {"files_changed": []}}
    assert replay[1] == theirs


async def test_whatever_keeps_a_session_s_copies_hears_of_its_deletion_published_or_read_from_the_log(
    ledger: SqliteLedger, log: Log, hubs: MakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The RPC layer's caches (events, pages of prompts, records) drop a deleted session's copies
    when the hub learns of its deletion: here, or on another replica (from the log)."""
    monkeypatch.setattr(hub_module, "_POLL", 0.05)
    heard: list[str] = []
    hub = await hubs(on_session_deleted=heard.append)
    hub.publish(await log.append())  # not a deletion
    hub.publish(await ledger.erase_session(SID, NewEvent("SESSION_DELETED", SID, data={"owner": ""})))
    assert heard == [SID]
    await ledger.erase_session(OTHER, NewEvent("SESSION_DELETED", OTHER, data={"owner": ""}))
    async with asyncio.timeout(10):
        while len(heard) < 2:
            await asyncio.sleep(0.01)
    assert heard == [SID, OTHER]
