"""Benchmark 4: how soon watchers hear of a rewind, and what an idle watcher costs the server.

The real server runs in a process of its own (`agent-rewind serve`, as `make run` starts it),
the watchers in other processes (`benchmarks/watcher.py`, at most `PER_PROCESS` streams each),
and this process makes the rewinds. Every process stamps times with CLOCK_MONOTONIC, one clock
for the whole machine, so a receipt time in a watcher minus the time `Rewind` returned here is
the latency. The rewinds are files rewinds of one session to alternating points (each one
applied, each one an event), one at a time: the next starts once every watcher has the last.
On this machine the watchers, the server and its CLI share two cores: the figures include the
watchers' own Python clients reading their streams.

- latency, at 1, 100 and 1,000 watchers: median, p99 and max over every (event, watcher) pair;
  the groups take turns, round by round;
- an idle watcher's memory: the server's VmRSS (from /proc) with 1,000 idle watchers open, less
  before they were opened, over 1,000.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

import grpc

from agent_rewind.api.v1 import rewind_service_pb2, rewind_service_pb2_grpc, session_service_pb2
from agent_rewind.store.ledger import NewEvent, NewRewind
from agent_rewind.store.sqlite import SqliteLedger
from agent_rewind.testing.server_process import ServerProcess
from benchmarks.common import Report, Target, cpu_seconds, fmt_kb, fmt_time, percentile

GROUPS = (0, 1, 100, 1000)
PER_PROCESS = 250
P99_GOAL_S = 0.100  # the goal: p99 at most 100 ms at 1,000 watchers
IDLE_GOAL_KB = 64.0  # an idle watcher holds less than a small stream buffer's worth
LOG_EVENTS = 2000  # the log the replaying watchers read: events like a rewind of a few files
TIMEOUT_S = 600.0
FILES = 1


class _Watchers:
    """`count` watcher streams over ceil(count / PER_PROCESS) processes; `replay`: streams from
    the oldest event that never read."""

    def __init__(self, address: str, count: int, *, replay: bool = False) -> None:  # count 0: none
        self.address = address
        self.count = count
        self.replay = replay
        self.procs: list[asyncio.subprocess.Process] = []

    async def open(self) -> None:
        # Replaying streams each hold a transport's worth of events the client does not read: a
        # quarter as many share a connection.
        per_process = PER_PROCESS // 4 if self.replay else PER_PROCESS
        sizes = [per_process] * (self.count // per_process)
        if self.count % per_process:
            sizes.append(self.count % per_process)
        for size in sizes:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "benchmarks.watcher",
                self.address,
                str(size),
                *(["replay"] if self.replay else []),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                limit=64 * 1024 * 1024,
            )
            self.procs.append(proc)
        try:
            for proc in self.procs:
                await self._expect(proc, "ready")
        except BaseException:
            self.kill()  # none left behind, whatever failed
            raise

    def kill(self) -> None:
        for proc in self.procs:
            if proc.returncode is None:
                proc.kill()

    @staticmethod
    async def _expect(proc: asyncio.subprocess.Process, line: str) -> None:
        assert proc.stdout is not None
        got = (await proc.stdout.readline()).decode().strip()
        if got != line:
            raise RuntimeError(f"a watcher process said {got!r}, not {line!r}")

    async def all_got(self, cursor: int) -> None:
        for proc in self.procs:
            await self._expect(proc, f"got {cursor}")

    async def close(self) -> dict[int, list[float]]:
        """Receipt times by cursor, over every stream."""
        out: dict[int, list[float]] = {}
        if self.replay:
            for proc in self.procs:
                assert proc.stdin is not None
                proc.stdin.write(b"done\n")
                await proc.stdin.drain()
                await proc.wait()
            return out
        for proc in self.procs:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(b"report\n")
            await proc.stdin.drain()
            for cursor, times in json.loads(await proc.stdout.readline()).items():
                out.setdefault(int(cursor), []).extend(times)
            await proc.wait()
        return out


class _Floor:
    """The fan-out floor (`benchmarks/fanout_floor.py`) as a process of its own, serving the
    same two methods the latency measure calls."""

    def __init__(self) -> None:
        self.proc: asyncio.subprocess.Process | None = None
        self.address = ""
        self.rewinds: rewind_service_pb2_grpc.RewindServiceStub | None = None
        self._channel: grpc.aio.Channel | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "benchmarks.fanout_floor", stdout=asyncio.subprocess.PIPE
        )
        assert self.proc.stdout is not None
        said = (await self.proc.stdout.readline()).decode().split()
        if said[:1] != ["listening"]:
            raise RuntimeError(f"the fan-out floor said {said!r}, not its port")
        self.address = f"127.0.0.1:{said[1]}"
        self._channel = grpc.aio.insecure_channel(self.address)
        self.rewinds = rewind_service_pb2_grpc.RewindServiceStub(self._channel)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            await self.proc.wait()


def _rss_kb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return float(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


async def _session(server: ServerProcess) -> tuple[str, list[str]]:
    assert server.sessions is not None
    session = await server.sessions.CreateSession(
        session_service_pb2.CreateSessionRequest(workspace_snapshots=False)
    )
    ids = []
    for text in ("write a.txt v0", "edit a.txt v0 => v1\nwrite b.txt bee"):
        call = server.sessions.Prompt(
            session_service_pb2.PromptRequest(session_id=session.session_id, text=text)
        )
        events = [e async for e in call]
        ids.append(
            next(e.message_id for e in events if e.HasField("user_prompt") and not e.parent_tool_use_id)
        )
    return session.session_id, ids


async def _latencies(
    server: ServerProcess | _Floor, sid: str, ids: list[str], watchers: int, rewinds: int
) -> tuple[list[float], list[float], float]:
    """With `watchers` open: each receipt less its Rewind's return, each Rewind's duration, and
    the server's CPU seconds per rewind (the rewind, its event and the fan-out)."""
    assert server.rewinds is not None and server.proc is not None
    group = _Watchers(server.address, watchers)
    await group.open()
    returned: dict[int, float] = {}
    durations: list[float] = []
    cpu = cpu_seconds(server.proc.pid)
    try:
        for i in range(rewinds):
            request = rewind_service_pb2.RewindRequest(session_id=sid, message_id=ids[i % 2], mode=FILES)
            called = time.monotonic()
            await server.rewinds.Rewind(request)
            done = time.monotonic()
            durations.append(done - called)
            # The cursor is the deployment's newest: ask the log rather than assume.
            cursor = await _newest(server)
            returned[cursor] = done
            if watchers:
                await group.all_got(cursor)
        cpu = cpu_seconds(server.proc.pid) - cpu
    finally:
        received = await group.close()
    heard = [t - returned[c] for c, times in received.items() if c in returned for t in times]
    return heard, durations, cpu / rewinds


async def _newest(server: ServerProcess | _Floor) -> int:
    assert server.rewinds is not None
    call = server.rewinds.WatchRewindEvents(rewind_service_pb2.WatchRewindEventsRequest())
    try:
        async for response in call:
            return int(response.caught_up.cursor)
    finally:
        call.cancel()
    raise RuntimeError("the watch ended before caught_up")


async def _idle_kb(server: ServerProcess, watchers: int) -> tuple[float, float]:
    """The server's VmRSS before and with `watchers` idle watchers open."""
    assert server.proc is not None
    await asyncio.sleep(1.0)
    before = _rss_kb(server.proc.pid)
    group = _Watchers(server.address, watchers)
    await group.open()
    await asyncio.sleep(1.0)
    with_them = _rss_kb(server.proc.pid)
    await group.close()
    return before, with_them


async def _replaying_kb(
    server: ServerProcess, sid: str, ids: list[str], watchers: int
) -> tuple[float, float, int]:
    """The server's VmRSS before and with `watchers` replaying the whole log without reading,
    after a restart (so the replay reads the ledger), and the log's length. The log: this
    session's rewinds, and LOG_EVENTS more like them appended as the engine appends them."""
    assert server.rewinds is not None
    await server.rewinds.Rewind(
        rewind_service_pb2.RewindRequest(session_id=sid, message_id=ids[1], mode=FILES)
    )
    await server.stop()
    ledger = await SqliteLedger.open(server.state_dir / "ledger.sqlite3")
    try:
        (*_, model) = await ledger.events_after(0)
        for _ in range(LOG_EVENTS):
            rewind_id = str(uuid.uuid4())
            await ledger.begin_rewind(
                NewRewind(rewind_id, sid, model.data["message_id"], "files", {}, principal=model.principal)
            )
            await ledger.complete_rewind(
                rewind_id,
                {"rewind_id": rewind_id},
                None,
                NewEvent("REWOUND", sid, rewind_id, model.principal, dict(model.data)),
            )
        _, newest = await ledger.event_bounds()
    finally:
        await ledger.close()
    await server.start()
    assert server.proc is not None
    await asyncio.sleep(1.0)
    before = _rss_kb(server.proc.pid)
    group = _Watchers(server.address, watchers, replay=True)
    await group.open()
    during = before
    for _ in range(60):  # until the server's memory stops growing: each stream holds what it holds
        await asyncio.sleep(0.5)
        now = _rss_kb(server.proc.pid)
        if during > before and now <= during * 1.005:
            break
        during = max(during, now)
    await group.close()
    return before, during, newest


async def _run(work: Path, rounds: int, rewinds: int) -> Report:
    # Every watcher here is one principal's: its bound on streams is raised past the groups'.
    server = ServerProcess(work / "state", args=["--max-watch-streams-per-principal", str(4 * GROUPS[-1])])
    floor = _Floor()
    most = GROUPS[-1]
    try:
        await asyncio.gather(server.start(), floor.start())
        sid, ids = await _session(server)
        before, with_idle = await _idle_kb(server, most)
        samples: dict[int, list[float]] = {g: [] for g in GROUPS}
        durations: dict[int, list[float]] = {g: [] for g in GROUPS}
        cpu: dict[int, list[float]] = {g: [] for g in GROUPS}
        floor_heard: list[float] = []
        floor_cpu: list[float] = []
        for r in range(rounds):
            for group in GROUPS if r % 2 == 0 else reversed(GROUPS):
                heard, took, used = await _latencies(server, sid, ids, group, rewinds)
                samples[group] += heard
                durations[group] += took
                cpu[group].append(used)
                if group == most:  # the floor right after (or before) the same group
                    heard, _, used = await _latencies(floor, sid, ids, most, rewinds)
                    floor_heard += heard
                    floor_cpu.append(used)
        replay_before, replaying, log_length = await _replaying_kb(server, sid, ids, most)
    finally:
        await asyncio.gather(server.close(), floor.close())

    report = Report(
        "Events: from Rewind returning to each watcher's receipt",
        ["watchers", "receipts", "median", "p99", "max", "Rewind itself (median)"],
    )
    for group in GROUPS:
        got = samples[group]
        report.rows.append(
            [
                f"{group:,}",
                f"{len(got):,}",
                fmt_time(statistics.median(got)) if got else "-",
                fmt_time(percentile(got, 0.99)),
                fmt_time(max(got)) if got else "-",
                fmt_time(statistics.median(durations[group])),
            ]
        )
    report.rows.append(
        [
            f"{most:,} (floor: a bare grpc.aio fan-out)",
            f"{len(floor_heard):,}",
            fmt_time(statistics.median(floor_heard)),
            fmt_time(percentile(floor_heard, 0.99)),
            fmt_time(max(floor_heard)),
            "-",
        ]
    )
    per_watcher = (with_idle - before) / GROUPS[-1]
    fan_out = (statistics.median(cpu[most]) - statistics.median(cpu[0])) / most
    report.infos.append(
        f"the server's CPU per event per watcher: {fmt_time(fan_out)} (CPU per rewind with {most:,} "
        f"watchers less with none, over {most:,}); the fan-out is this times the watchers"
    )
    floor_p99 = percentile(floor_heard, 0.99)
    report.infos.append(
        f"the floor (benchmarks/fanout_floor.py: the same watchers, one asyncio.Event per event, the same "
        f"bytes written to every stream, nothing else): p99 {fmt_time(floor_p99)} at {most:,} watchers, "
        f"CPU per event per watcher {fmt_time(statistics.median(floor_cpu) / most)}; the service's p99 "
        f"is {percentile(samples[most], 0.99) / floor_p99:.2f}x the floor's"
    )
    p99 = percentile(samples[GROUPS[-1]], 0.99)
    report.targets += [
        Target(
            f"p99 at {GROUPS[-1]:,} watchers at most {P99_GOAL_S * 1e3:.0f} ms",
            p99 <= P99_GOAL_S,
            f"p99 {fmt_time(p99)} over {len(samples[GROUPS[-1]]):,} receipts",
        ),
        Target(
            f"an idle watcher holds at most {IDLE_GOAL_KB:.0f} KB of the server's memory",
            per_watcher <= IDLE_GOAL_KB,
            f"VmRSS {fmt_kb(before)} -> {fmt_kb(with_idle)} with {GROUPS[-1]:,} idle watchers: "
            f"{per_watcher:.1f} KB each",
        ),
        Target(
            f"a watcher replaying the log that never reads holds at most {IDLE_GOAL_KB:.0f} KB",
            (replaying - replay_before) / GROUPS[-1] <= IDLE_GOAL_KB,
            f"VmRSS {fmt_kb(replay_before)} -> {fmt_kb(replaying)} with {GROUPS[-1]:,} watchers replaying "
            f"{log_length:,} events from the ledger without reading: "
            f"{(replaying - replay_before) / GROUPS[-1]:.1f} KB each",
        ),
    ]
    report.notes += [
        f"{rounds} rounds of {rewinds} rewinds per group, the groups taking turns; watchers in processes of "
        f"{PER_PROCESS} streams; a negative latency is a watcher that heard before the caller's answer arrived",
        "the server, its CLI and the watchers' own clients share this machine's cores",
    ]
    return report


def run(work: Path, rounds: int = 3, rewinds: int = 10) -> Report:
    started = time.monotonic()
    report = asyncio.run(asyncio.wait_for(_run(work, rounds, rewinds), TIMEOUT_S))
    report.seconds = time.monotonic() - started
    return report
