"""WatchRewindEvents end to end: a real server, real Claude Code processes, real watchers.

The promises: every applied rewind is one event; a stream delivers each event at most once, in
cursor order, with no gap, through the seam between replay and live; a watcher resumes with its
cursor across a restart and a SIGKILL; a slow watcher is cut off without delaying anyone.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent_rewind.api.v1 import rewind_pb2, rewind_service_pb2, rewind_service_pb2_grpc
from agent_rewind.testing.server_process import ServerProcess
from tests.integration.harness import (
    BOTH,
    CONVERSATION,
    FILES,
    Client,
    client_of,
    error_info,
    prompt_id,
    serve,
)

REWOUND = rewind_pb2.REWIND_EVENT_KIND_REWOUND
P0 = "write a.txt v0"
# (No hex digits in the written text: the wire holds UUIDs, where "bee" can turn up by chance.)
P1 = "edit a.txt v0 => v1\nwrite b.txt buzz"
P2 = "edit a.txt v1 => v2"
# A watcher's transport that holds almost nothing: it stops taking messages after about one.
TINY_WINDOW = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1024)]


class Watch:
    """One WatchRewindEvents stream, read in the background: `items` holds ("event", RewindEvent)
    and ("caught_up", cursor) in arrival order, `error` how it ended."""

    def __init__(self, stub: rewind_service_pb2_grpc.RewindServiceStub, **request: Any) -> None:
        self.call = stub.WatchRewindEvents(rewind_service_pb2.WatchRewindEventsRequest(**request))
        self.items: list[tuple[str, Any]] = []
        self.error: grpc.aio.AioRpcError | None = None
        self._changed = asyncio.Event()
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for response in self.call:
                if response.HasField("event"):
                    self.items.append(("event", response.event))
                else:
                    self.items.append(("caught_up", response.caught_up.cursor))
                self._changed.set()
        except grpc.aio.AioRpcError as err:
            self.error = err
        self._changed.set()

    @property
    def events(self) -> list[rewind_pb2.RewindEvent]:
        return [value for kind, value in self.items if kind == "event"]

    @property
    def cursors(self) -> list[int]:
        return [e.cursor for e in self.events]

    async def until(self, done: Any, within: float = 30.0) -> None:
        async def wait() -> None:
            while not done(self):
                if self.error is not None:
                    raise AssertionError(f"the watch ended: {self.error.code()} {self.error.details()}")
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(wait(), within)

    async def caught_up(self) -> int:
        await self.until(lambda w: any(kind == "caught_up" for kind, _ in w.items))
        return int(next(value for kind, value in self.items if kind == "caught_up"))

    async def through(self, cursor: int) -> None:
        await self.until(lambda w: bool(w.cursors) and w.cursors[-1] >= cursor)

    async def ended(self, within: float = 30.0) -> grpc.aio.AioRpcError:
        await asyncio.wait_for(asyncio.shield(self._task), within)
        assert self.error is not None, "the stream ended without an error"
        return self.error

    async def close(self) -> None:
        self.call.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


@pytest.fixture
async def watches() -> AsyncIterator[list[Watch]]:
    made: list[Watch] = []
    yield made
    await asyncio.gather(*(w.close() for w in made))


def watch(made: list[Watch], c: Client, **request: Any) -> Watch:
    w = Watch(c.rewinds, **request)
    made.append(w)
    return w


async def _session(c: Client, prompts: Sequence[str] = (P0, P1, P2)) -> tuple[str, list[str]]:
    session = await c.create()
    return session.session_id, [prompt_id(await c.prompt(session.session_id, p)) for p in prompts]


def _assert_seamless(w: Watch, first: int, last: int) -> None:
    """Every cursor from `first` to `last` exactly once, in order, and one caught_up whose cursor
    splits them into what came before it and what came after."""
    assert w.cursors == list(range(first, last + 1)), w.cursors
    marks = [i for i, (kind, _) in enumerate(w.items) if kind == "caught_up"]
    assert len(marks) == 1, w.items
    mark = w.items[marks[0]][1]
    before = [v.cursor for kind, v in w.items[: marks[0]] if kind == "event"]
    after = [v.cursor for kind, v in w.items[marks[0] + 1 :] if kind == "event"]
    assert all(c <= mark for c in before) and all(c > mark for c in after), (mark, w.items)


async def test_an_applied_rewind_is_one_event_telling_what_happened_and_no_text(
    tmp_path: Path, watches: list[Watch]
) -> None:
    async with serve(tmp_path) as c:
        sid, ids = await _session(c)
        w = watch(watches, c)
        assert await w.caught_up() == 0, "no events yet: caught up at once, at cursor 0"
        # A dry run and a refused rewind change nothing: no event.
        await c.dry_run(sid, ids[1], BOTH)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.rewind(sid, ids[1], BOTH, expected_last_message_id="msg_not_the_last")
        assert error_info(err.value).reason == "REWIND_CONFLICT"
        result = await c.rewind(sid, ids[1], BOTH)
        await w.through(1)
        [event] = w.events
        assert event.cursor == 1 and event.kind == REWOUND
        assert (event.rewind_id, event.session_id, event.message_id) == (result.rewind_id, sid, ids[1])
        assert event.mode == BOTH and event.principal == "local"
        assert event.files == result.files and event.files.files_changed
        assert event.messages_dropped == result.conversation.messages_dropped > 0
        assert event.conversation_changed and event.last_message_id == result.last_message_id
        assert event.occur_time.seconds > 0
        # Nothing of the prompts' text travels with an event.
        wire = event.SerializeToString()
        assert b"buzz" not in wire and b"edit a.txt" not in wire and b"=> v1" not in wire
        # A files-only rewind changes no conversation.
        result = await c.rewind(sid, ids[0], FILES)
        await w.through(2)
        assert not w.events[1].conversation_changed and w.events[1].mode == FILES
        assert w.events[1].last_message_id == result.last_message_id


async def test_a_hundred_watchers_each_get_every_event_of_a_burst_once_in_order(
    tmp_path: Path, watches: list[Watch]
) -> None:
    async with serve(tmp_path) as c:
        sessions = [await _session(c, (P0, P1)) for _ in range(3)]
        made = [watch(watches, c) for _ in range(100)]
        assert set(await asyncio.gather(*(w.caught_up() for w in made))) == {0}

        async def burst(sid: str, ids: list[str]) -> list[str]:
            # Files rewinds to alternate points: each one is applied, each one an event.
            return [(await c.rewind(sid, ids[i % 2], FILES)).rewind_id for i in range(6)]

        applied = [r for rs in await asyncio.gather(*(burst(*s) for s in sessions)) for r in rs]
        await asyncio.gather(*(w.through(len(applied)) for w in made))
        for w in made:
            _assert_seamless(w, 1, len(applied))
            assert sorted(e.rewind_id for e in w.events) == sorted(applied)
            # Per session, the events come in the order their rewinds were applied.
            for sid, _ in sessions:
                mine = [e for e in w.events if e.session_id == sid]
                assert len(mine) == 6
        assert c.running is not None and c.running.hub.watchers == 100


async def test_a_watcher_resumes_with_its_cursor_and_misses_nothing(
    tmp_path: Path, watches: list[Watch]
) -> None:
    async with serve(tmp_path) as c:
        sid, ids = await _session(c)
        first = watch(watches, c)
        await first.caught_up()
        await c.rewind(sid, ids[2], FILES)
        await first.through(1)
        await first.close()
        # Missed while away.
        missed = [(await c.rewind(sid, ids[i], FILES)).rewind_id for i in (1, 2)]
        again = watch(watches, c, after_cursor=first.cursors[-1])
        await again.caught_up()
        assert [e.rewind_id for e in again.events] == missed
        live = await c.rewind(sid, ids[1], FILES)
        await again.through(4)
        _assert_seamless(again, 2, 4)
        assert again.items[2] == ("caught_up", 3) and again.events[-1].rewind_id == live.rewind_id
        # 0 replays everything retained; an unknown future cursor is refused, not waited for.
        everything = watch(watches, c, after_cursor=0)
        await everything.through(4)
        assert everything.cursors == [1, 2, 3, 4]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            [
                r
                async for r in c.rewinds.WatchRewindEvents(
                    rewind_service_pb2.WatchRewindEventsRequest(after_cursor=99), timeout=20
                )
            ]
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(err.value).reason == "INVALID_ARGUMENT"


async def test_a_watcher_started_while_rewinds_are_applied_sees_no_gap_and_no_duplicate(
    tmp_path: Path, watches: list[Watch]
) -> None:
    async with serve(tmp_path) as c:
        sessions = [await _session(c, (P0, P1)) for _ in range(2)]
        stop = asyncio.Event()
        applied: list[str] = []

        async def keep_rewinding(sid: str, ids: list[str]) -> None:
            i = 0
            while not stop.is_set():
                applied.append((await c.rewind(sid, ids[i % 2], FILES)).rewind_id)
                i += 1

        writers = [asyncio.create_task(keep_rewinding(*s)) for s in sessions]
        late: list[Watch] = []
        # Watchers join at different moments of the burst, replaying from the start or live only.
        while len(late) < 8:
            await asyncio.sleep(0)
            if len(applied) >= 2 * len(late) + 1:
                late.append(watch(watches, c, after_cursor=0))
                late.append(watch(watches, c))
        await asyncio.gather(*(w.caught_up() for w in late))
        while len(applied) < 30:
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.gather(*writers)
        total = len(applied)
        await asyncio.gather(*(w.through(total) for w in late))
        for replaying, live_only in zip(late[::2], late[1::2], strict=True):
            _assert_seamless(replaying, 1, total)
            mark = await live_only.caught_up()
            _assert_seamless(live_only, mark + 1, total)


async def test_the_session_filter_delivers_that_sessions_events_only(
    tmp_path: Path, watches: list[Watch]
) -> None:
    async with serve(tmp_path) as c:
        (mine, my_ids), (other, other_ids) = await _session(c), await _session(c)
        await c.rewind(other, other_ids[1], FILES)
        await c.rewind(mine, my_ids[1], FILES)
        filtered = watch(watches, c, session_id=mine, after_cursor=0)
        # Caught up at the deployment's newest cursor, whatever the filter.
        assert await filtered.caught_up() == 2
        await c.rewind(other, other_ids[0], FILES)
        await c.rewind(mine, my_ids[1], CONVERSATION)
        await filtered.through(4)
        assert filtered.cursors == [2, 4] and {e.session_id for e in filtered.events} == {mine}
        with pytest.raises(grpc.aio.AioRpcError) as err:
            request = rewind_service_pb2.WatchRewindEventsRequest(session_id=str(uuid.uuid4()))
            [r async for r in c.rewinds.WatchRewindEvents(request, timeout=20)]
        assert error_info(err.value).reason == "SESSION_NOT_FOUND"


async def test_a_watcher_that_never_reads_is_cut_off_and_delays_nobody(
    tmp_path: Path, watches: list[Watch]
) -> None:
    async with serve(tmp_path, watcher_buffer=3) as c:
        sid, ids = await _session(c)
        slow_channel = grpc.aio.insecure_channel(c.running.address if c.running else "", options=TINY_WINDOW)
        try:
            stub = rewind_service_pb2_grpc.RewindServiceStub(slow_channel)
            slow = stub.WatchRewindEvents(rewind_service_pb2.WatchRewindEventsRequest(after_cursor=0))
            brisk = watch(watches, c)
            await brisk.caught_up()
            assert c.running is not None
            while c.running.hub.watchers < 2:
                await asyncio.sleep(0.01)
            # The slow watcher reads nothing while rewinds go on; they and the brisk watcher do not wait.
            rewound = [(await c.rewind(sid, ids[1 + i % 2], FILES)).rewind_id for i in range(12)]
            await brisk.through(12)
            assert [e.rewind_id for e in brisk.events] == rewound
            while c.running.hub.watchers > 1:  # the slow one is gone from the hub: it holds nothing
                await asyncio.sleep(0.01)
            # When it finally reads: what its transport held, then the reason and where to resume.
            got: list[int] = []
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for response in slow:
                    if response.HasField("event"):
                        got.append(response.event.cursor)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            info = error_info(err.value)
            assert info.reason == "SUBSCRIBER_TOO_SLOW"
            last = int(info.metadata["last_cursor"])
            assert got == list(range(1, len(got) + 1)) and len(got) < 12
            assert last <= (got[-1] if got else 0), "it never claims more than was sent"
            # Resuming after last_cursor delivers the rest, with no gap.
            resumed = watch(watches, c, after_cursor=last)
            await resumed.through(12)
            assert resumed.cursors == list(range(last + 1, 13))
        finally:
            await slow_channel.close()


async def test_an_expired_cursor_is_refused_with_the_oldest_kept(
    tmp_path: Path, watches: list[Watch]
) -> None:
    async with serve(tmp_path) as c:
        sid, ids = await _session(c)
        for i in range(5):
            await c.rewind(sid, ids[i % 3], FILES)
    # Restarted keeping two events: the trim runs at start, then periodically.
    async with serve(tmp_path, event_retention_count=2) as c:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            request = rewind_service_pb2.WatchRewindEventsRequest(after_cursor=2)
            [r async for r in c.rewinds.WatchRewindEvents(request, timeout=20)]
        assert err.value.code() == grpc.StatusCode.OUT_OF_RANGE
        info = error_info(err.value)
        assert (info.reason, info.metadata["oldest_cursor"]) == ("CURSOR_EXPIRED", "4")
        # The cursor just before the oldest kept still resumes; 0 replays from the oldest kept.
        resumed = watch(watches, c, after_cursor=3)
        assert await resumed.caught_up() == 5 and resumed.cursors == [4, 5]
        everything = watch(watches, c, after_cursor=0)
        assert await everything.caught_up() == 5 and everything.cursors == [4, 5]


async def test_shutdown_ends_every_watch_with_shutting_down(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        made = [Watch(c.rewinds) for _ in range(3)]
        await asyncio.gather(*(w.caught_up() for w in made))
        assert c.running is not None
        await c.running.stop(grace=1)
        for w in made:
            err = await w.ended()
            assert err.code() == grpc.StatusCode.UNAVAILABLE
            assert error_info(err).reason == "SHUTTING_DOWN"


async def test_a_watcher_resumes_across_a_restart_and_a_sigkill(
    server: ServerProcess, watches: list[Watch]
) -> None:
    await server.start()
    c = client_of(server)
    sid, ids = await _session(c)
    w = watch(watches, c)
    await w.caught_up()
    await c.rewind(sid, ids[2], FILES)
    await w.through(1)
    # A graceful restart: the stream ends with SHUTTING_DOWN, nothing is lost.
    await server.stop()
    assert error_info(await w.ended()).reason == "SHUTTING_DOWN"
    await server.start()
    c = client_of(server)
    await c.rewind(sid, ids[1], FILES)
    w = watch(watches, c, after_cursor=1)
    assert await w.caught_up() == 2 and w.cursors == [2]
    # A SIGKILL in the middle of a rewind whose intent was recorded: the restart finishes it, and
    # its event is there for the watcher that reconnects with its cursor.
    await server.stop()
    await server.start(fault="rewind.files_restored")
    c = client_of(server)
    with pytest.raises(grpc.aio.AioRpcError):
        await c.rewind(sid, ids[1], BOTH)
    assert await server.wait() == -9
    await server.start()
    c = client_of(server)
    w = watch(watches, c, after_cursor=2)
    assert await w.caught_up() == 3
    [event] = w.events
    assert event.cursor == 3 and event.message_id == ids[1] and event.conversation_changed
    live = await c.rewind(sid, ids[0], FILES)
    await w.through(4)
    assert w.events[-1].rewind_id == live.rewind_id
    _assert_seamless(w, 3, 4)


class _Lines:
    """The stdout of a process, line by line, waited on with a timeout."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.seen: list[str] = []

    async def until(self, start: str, within: float = 30.0) -> None:
        """Reads until a line starting with `start`."""
        assert self.proc.stdout is not None
        async with asyncio.timeout(within):
            while not any(line.startswith(start) for line in self.seen):
                got = await self.proc.stdout.readline()
                assert got, f"the example exited ({await self.proc.wait()}) having printed {self.seen}"
                self.seen.append(got.decode().strip())

    def events(self) -> list[str]:
        return [line.split()[1] for line in self.seen if line.startswith("REWOUND")]


async def _example(address: str, cursor_file: Path) -> _Lines:
    script = Path(__file__).resolve().parents[2] / "docs" / "examples" / "watch_events.py"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), address, str(cursor_file), stdout=asyncio.subprocess.PIPE
    )
    return _Lines(proc)


async def test_the_documented_consumer_resumes_across_restarts_and_resyncs_an_expired_cursor(
    server: ServerProcess, tmp_path: Path
) -> None:
    cursor_file = tmp_path / "last-cursor"
    await server.start()
    c = client_of(server)
    sid, ids = await _session(c)
    consumer = await _example(server.address, cursor_file)
    try:
        await consumer.until("CAUGHT_UP cursor=0")
        for i in range(2):
            await c.rewind(sid, ids[1 + i % 2], FILES)
        await consumer.until("REWOUND cursor=2")
        # The server restarts on another port: the example is pointed at the old one, so for this
        # step it is restarted too, with its cursor file (what a pod would do).
        await server.stop()
        consumer.proc.kill()
        await consumer.proc.wait()
        await server.start()
        c = client_of(server)
        await c.rewind(sid, ids[1], FILES)
        consumer = await _example(server.address, cursor_file)
        await consumer.until("CAUGHT_UP cursor=3")
        assert consumer.events() == ["cursor=3"], "exactly the one missed"
        consumer.proc.kill()
        await consumer.proc.wait()
        for i in range(3):
            await c.rewind(sid, ids[i % 3], FILES)
        # Restarted keeping one event: cursor 3 has expired; the consumer resyncs and goes on.
        await server.stop()
        server.args = ["--event-retention-count", "1"]
        await server.start()
        consumer = await _example(server.address, cursor_file)
        await consumer.until("CAUGHT_UP cursor=6")
        assert [line.split()[:2] for line in consumer.seen] == [
            ["RESYNC"],
            ["REWOUND", "cursor=6"],
            ["CAUGHT_UP", "cursor=6"],
        ]
        assert cursor_file.read_text() == "6"
    finally:
        consumer.proc.kill()
        await consumer.proc.wait()
