"""Benchmark 7: replicas: a call forwarded to the session's owner, and events across replicas.

Two real server processes (`agent-rewind serve`, replica-0 and replica-1, each with a state dir
of its own) share one fresh PostgreSQL database (the `pgserver` wheel, as the tests run it: a
Unix socket, fsync off). One session is created on replica-0, which owns it, and given a few
turns that write a file, so it has rewind points whose files differ. A call sent to replica-0 is
answered there (direct); the same call sent to replica-1 is forwarded by it to replica-0 over
gRPC and the answer relayed back (forwarded), except `ListRewindPoints`, which replica-1 answers
itself from the session's points index in the shared ledger (no hop). Both sides are timed by the
client, in this process, and interleaved round by round (order reversed every other round):

- `ListRewindPoints` of the session's points, through the owner against through the non-owner;
  one `GetCapabilities` to replica-0 in the same rounds, the cost of one unary call on loopback
  (what a hop would add);
- a files `Rewind` (REWIND_MODE_FILES), direct against forwarded, each to the other of two points
  than the last, so every rewind applies and changes the file (checked after each, untimed).

Then events across replicas: one `WatchRewindEvents` watcher (no session filter, new events
only) on replica-0 and one on replica-1, each in a process of its own (`benchmarks/watcher.py`),
while this process makes files rewinds directly on replica-0, one at a time: the next starts once
both watchers have the last. Every process stamps times with CLOCK_MONOTONIC, so a receipt time
less the time `Rewind` returned here is the latency, as in the events benchmark: replica-0's
watcher hears from its own hub, replica-1's from the shared event log, woken by LISTEN/NOTIFY.

What a hop costs, for information: replica-1 serves Prometheus metrics, whose count of forwarded
calls checks that every call sent to it was forwarded and whose time per forwarded call is its
wait on the owner; and, after the rounds, each call is made back to back each way while the
replicas' CPU time is read from /proc, so the CPU replica-1 spends forwarding a call stands
beside what replica-0 spends answering it.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from agent_rewind.api.v1 import rewind_pb2, rewind_service_pb2, session_service_pb2
from agent_rewind.testing.server_process import ServerProcess
from benchmarks.common import (
    Measure,
    Report,
    Sample,
    Samples,
    Target,
    cpu_seconds,
    fmt_ratio,
    fmt_time,
    interleave,
    median,
    percentile,
    ratio_target,
    settle,
    timed,
)

FILES = rewind_pb2.REWIND_MODE_FILES
PROMPTS = 5  # turns of the session: `write a.txt v0` ... `write a.txt v4`, one point each
# The two points the rewinds alternate between: rewinding to prompt k leaves a.txt as prompt
# k - 1 wrote it.
POINTS = (1, 3)
# (1) a non-owner answers ListRewindPoints from the ledger's points index as the owner does (the
# owner also checks its transcript first), with no hop: at most 10% more.
MAX_POINTS_RATIO = 1.1
# (2) a files Rewind does far more (ledger commits, two CLI requests, the files): the same hop
# must be a small share of it.
MAX_REWIND_RATIO = 1.2
# (3) a watcher on another replica than the rewind's hears within what the events benchmark
# promises one replica's watchers (p99 at most 100 ms, at 1,000 of them): which replica a client
# is connected to must not change what it is promised.
P99_GOAL_S = 0.100
CALLS = 5  # ListRewindPoints (and GetCapabilities) calls per sample, each one recorded
HEAR_WITHIN_S = 10.0  # a watcher that has not heard of a rewind by then: the benchmark fails
TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Size:
    rounds: int  # rounds of each interleaved phase (rows 1, 2)
    events: int  # rewinds the two watchers hear of (row 3)
    points_burst: int  # ListRewindPoints calls back to back each way, for the CPU per call
    rewinds_burst: int  # files Rewinds back to back each way, for the CPU per call


FULL = Size(rounds=60, events=100, points_burst=300, rewinds_burst=60)
QUICK = Size(rounds=5, events=10, points_burst=30, rewinds_burst=6)


class _Watch:
    """One WatchRewindEvents stream, in a process of its own (`python -m benchmarks.watcher`)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.proc: asyncio.subprocess.Process | None = None

    async def open(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "benchmarks.watcher",
            self.address,
            "1",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        if (got := await self._line()) != "ready":
            raise RuntimeError(f"the watcher on {self.address} said {got!r}, not 'ready'")

    async def _line(self) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        return (await asyncio.wait_for(self.proc.stdout.readline(), HEAR_WITHIN_S)).decode().strip()

    async def heard(self) -> int:
        """The cursor of the next event the stream received."""
        got = await self._line()
        if not got.startswith("got "):
            raise RuntimeError(f"the watcher on {self.address} said {got!r}, not 'got CURSOR'")
        return int(got.removeprefix("got "))

    async def close(self) -> dict[int, list[float]]:
        """Receipt times by cursor."""
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(b"report\n")
        await self.proc.stdin.drain()
        received = json.loads(await self._line())
        await self.proc.wait()
        return {int(cursor): times for cursor, times in received.items()}

    def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()


class _Session:
    """The session on replica-0, its rewind points, and which point its files are at."""

    def __init__(self, session_id: str, cwd: Path, points: list[str]) -> None:
        self.id = session_id
        self.cwd = cwd
        self.points = points
        self.at = -1  # the index in POINTS of the last rewind's point (none yet)

    def next_rewind(self) -> tuple[rewind_service_pb2.RewindRequest, str]:
        """A files rewind to the other point than the last, and what a.txt then holds."""
        self.at = (self.at + 1) % len(POINTS)
        k = POINTS[self.at]
        request = rewind_service_pb2.RewindRequest(session_id=self.id, message_id=self.points[k], mode=FILES)
        return request, f"v{k - 1}\n"


def _read(path: Path) -> str:
    return path.read_text()


async def _rewind(server: ServerProcess, session: _Session) -> tuple[float, float]:
    """One files rewind through `server`, checked to have applied: the seconds it took, and when
    it returned (CLOCK_MONOTONIC, the watchers' clock)."""
    assert server.rewinds is not None
    request, expected = session.next_rewind()
    start = time.perf_counter()
    result = await server.rewinds.Rewind(request)
    seconds, returned = time.perf_counter() - start, time.monotonic()
    if not result.rewind_id or not result.files.can_rewind or _read(session.cwd / "a.txt") != expected:
        raise RuntimeError(f"the files rewind through {server.address} did not apply: {result}")
    return seconds, returned


async def _points(server: ServerProcess, session: _Session) -> float:
    """One ListRewindPoints of every point of the session through `server`; the seconds it took."""
    assert server.rewinds is not None
    request = rewind_service_pb2.ListRewindPointsRequest(session_id=session.id, page_size=50)
    response, seconds = await timed(server.rewinds.ListRewindPoints(request))
    if [p.message_id for p in response.points] != session.points:
        raise RuntimeError(f"ListRewindPoints through {server.address} answered {response}")
    return seconds


async def _session(owner: ServerProcess, other: ServerProcess) -> _Session:
    assert owner.sessions is not None and other.sessions is not None
    created = await owner.sessions.CreateSession(
        session_service_pb2.CreateSessionRequest(workspace_snapshots=False)
    )
    points = []
    for i in range(PROMPTS):
        call = owner.sessions.Prompt(
            session_service_pb2.PromptRequest(session_id=created.session_id, text=f"write a.txt v{i}")
        )
        events = [e async for e in call]
        ids = [e.message_id for e in events if e.HasField("user_prompt") and not e.parent_tool_use_id]
        if len(ids) != 1 or not events[-1].HasField("result") or events[-1].result.is_error:
            raise RuntimeError(f"turn {i} did not run as scripted: {events}")
        points.append(ids[0])
    seen = await other.sessions.GetSession(
        session_service_pb2.GetSessionRequest(session_id=created.session_id)
    )
    if created.replica != "replica-0" or seen.replica != "replica-0":
        raise RuntimeError(
            f"the session is not replica-0's: {created.replica!r}, {seen.replica!r} via replica-1"
        )
    return _Session(created.session_id, Path(created.cwd), points)


def _metrics_port(server: ServerProcess) -> int:
    for entry in reversed(server.log_lines()):
        if entry.get("event") == "serving metrics":
            return int(str(entry["port"]))
    raise RuntimeError(f"no 'serving metrics' line in {server.log_path}")


def _forwarded(port: int) -> dict[str, tuple[float, float]]:
    """replica-1's forwarded calls by method: (how many, seconds in all), from its /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        for name, slot in (
            ("agent_rewind_forwarded_rpcs_total{", 0),
            ("agent_rewind_forwarded_rpc_duration_seconds_sum{", 1),
        ):
            if line.startswith(name):
                labels, value = line[len(name) :].rsplit("} ", 1)
                method = labels.split('method="', 1)[1].split('"', 1)[0]
                out.setdefault(method, [0.0, 0.0])[slot] = float(value)
    return {method: (n, s) for method, (n, s) in out.items()}


async def _hop(port: int) -> dict[str, tuple[float, float]]:
    return await asyncio.to_thread(_forwarded, port)


def _since(
    after: dict[str, tuple[float, float]], before: dict[str, tuple[float, float]], method: str
) -> tuple[int, float]:
    """Forwarded calls of `method` between two readings of the metrics: how many, mean seconds."""
    n = after.get(method, (0.0, 0.0))[0] - before.get(method, (0.0, 0.0))[0]
    s = after.get(method, (0.0, 0.0))[1] - before.get(method, (0.0, 0.0))[1]
    return round(n), s / n if n else math.nan


def _measures(
    a: ServerProcess, b: ServerProcess, session: _Session
) -> tuple[dict[str, Measure], dict[str, Measure]]:
    """The two interleaved phases: ListRewindPoints (and the floor of a hop), then files Rewind."""

    async def points(server: ServerProcess, name: str) -> Sample:
        return {name: [await _points(server, session) for _ in range(CALLS)]}

    async def capabilities() -> Sample:
        assert a.rewinds is not None
        out = []
        for _ in range(CALLS):
            _, seconds = await timed(a.rewinds.GetCapabilities(rewind_service_pb2.GetCapabilitiesRequest()))
            out.append(seconds)
        return {"capabilities": out}

    async def rewind(server: ServerProcess, name: str) -> Sample:
        seconds, _ = await _rewind(server, session)
        return {name: seconds}

    listing: dict[str, Measure] = {
        "points direct": lambda: points(a, "points direct"),
        "points forwarded": lambda: points(b, "points forwarded"),
        "capabilities": capabilities,
    }
    rewinding: dict[str, Measure] = {
        "rewind direct": lambda: rewind(a, "rewind direct"),
        "rewind forwarded": lambda: rewind(b, "rewind forwarded"),
    }
    return listing, rewinding


async def _events(
    a: ServerProcess, b: ServerProcess, session: _Session, rewinds: int
) -> tuple[dict[str, list[float]], list[float]]:
    """Files rewinds made directly on replica-0, one at a time, with a watcher on each replica:
    each watcher's receipts less the time its Rewind returned, by replica; each Rewind's seconds."""
    watches = {"replica-0": _Watch(a.address), "replica-1": _Watch(b.address)}
    returned: dict[int, float] = {}
    durations: list[float] = []
    try:
        for watch in watches.values():
            await watch.open()
        for _ in range(rewinds):
            seconds, done = await _rewind(a, session)
            durations.append(seconds)
            cursors = {name: await watch.heard() for name, watch in watches.items()}
            if len(set(cursors.values())) != 1:
                raise RuntimeError(f"the watchers heard of different events: {cursors}")
            returned[cursors["replica-0"]] = done
        received = {name: await watch.close() for name, watch in watches.items()}
    finally:
        for watch in watches.values():
            watch.kill()
    heard = {
        name: [t - returned[c] for c, times in got.items() if c in returned for t in times]
        for name, got in received.items()
    }
    for name, latencies in heard.items():
        if len(latencies) != rewinds:
            raise RuntimeError(f"the watcher on {name} heard {len(latencies)} of {rewinds} rewinds")
    return heard, durations


def _replica(work: Path, i: int, url: str) -> ServerProcess:
    return ServerProcess(
        work / f"replica-{i}",
        args=["--database-url", url, "--replica-id", f"replica-{i}", "--metrics-listen", "127.0.0.1:0"],
    )


async def _cpu_per_call(
    call: Callable[[], Awaitable[object]], pids: tuple[int, int], n: int
) -> tuple[float, float]:
    """`n` calls back to back: the CPU seconds per call of each of two processes."""
    before = [cpu_seconds(pid) for pid in pids]
    for _ in range(n):
        await call()
    after = [cpu_seconds(pid) for pid in pids]
    return (after[0] - before[0]) / n, (after[1] - before[1]) / n


async def _run(work: Path, url: str, size: Size) -> Report:
    a, b = _replica(work, 0, url), _replica(work, 1, url)
    try:
        await a.start()
        await b.start()
        assert a.proc is not None and b.proc is not None
        pids = (a.proc.pid, b.proc.pid)
        session = await _session(a, b)
        port = _metrics_port(b)
        # Untimed: each call once each way (channels open, replica-1 has looked the owner up).
        for server in (a, b):
            await _points(server, session)
            await _rewind(server, session)
        listing, rewinding = _measures(a, b, session)
        before = await _hop(port)
        settle()
        s = await interleave(listing, size.rounds, between=settle)
        s.update(await interleave(rewinding, size.rounds, between=settle))
        after = await _hop(port)
        cpu = {
            "points direct": await _cpu_per_call(lambda: _points(a, session), pids, size.points_burst),
            "points forwarded": await _cpu_per_call(lambda: _points(b, session), pids, size.points_burst),
            "rewind direct": await _cpu_per_call(lambda: _rewind(a, session), pids, size.rewinds_burst),
            "rewind forwarded": await _cpu_per_call(lambda: _rewind(b, session), pids, size.rewinds_burst),
        }
        heard, durations = await _events(a, b, session, size.events)
    finally:
        await b.close()
        await a.close()
    hops = {method: _since(after, before, method) for method in ("ListRewindPoints", "Rewind")}
    sent = {"ListRewindPoints": 0, "Rewind": s.n("rewind forwarded")}  # points: never forwarded
    for method, (n, _) in hops.items():
        if n != sent[method]:
            raise RuntimeError(f"replica-1 forwarded {n} {method} calls of the {sent[method]} sent to it")
    return _report(s, heard, durations, hops, cpu, size)


def _report(
    s: Samples,
    heard: dict[str, list[float]],
    durations: list[float],
    hops: dict[str, tuple[int, float]],
    cpu: dict[str, tuple[float, float]],
    size: Size,
) -> Report:
    report = Report(
        "7. Replicas: calls forwarded to the session's owner, and events across replicas",
        ["row", "measure", "n", "median", "p99", "min - max"],
    )

    def row(number: str, title: str, values: list[float]) -> list[str]:
        spread = f"{fmt_time(min(values))} - {fmt_time(max(values))}" if values else "-"
        return [
            number,
            title,
            f"{len(values):,}",
            fmt_time(median(values)),
            fmt_time(percentile(values, 0.99)),
            spread,
        ]

    same, across = heard["replica-0"], heard["replica-1"]
    report.rows = [
        row("1", f"ListRewindPoints ({PROMPTS} points), to replica-0, the owner", s["points direct"]),
        row(
            "1",
            "ListRewindPoints to replica-1, not the owner: from the ledger's points index, not forwarded",
            s["points forwarded"],
        ),
        row("1", "GetCapabilities to replica-0: one unary call on loopback", s["capabilities"]),
        row("2", "files Rewind, direct: to replica-0", s["rewind direct"]),
        row(
            "2",
            "files Rewind, forwarded: to replica-1, which forwards it to replica-0",
            s["rewind forwarded"],
        ),
        row("3", "Rewind returned (replica-0) to receipt: watcher on replica-0 (same replica)", same),
        row("3", "Rewind returned (replica-0) to receipt: watcher on replica-1 (across replicas)", across),
        row("3", "files Rewind, direct, the two watchers open", durations),
    ]
    points_d, points_f = s.med("points direct"), s.med("points forwarded")
    rewind_d, rewind_f = s.med("rewind direct"), s.med("rewind forwarded")
    p99 = percentile(across, 0.99)
    report.targets = [
        ratio_target("1. ListRewindPoints: non-owner / owner", points_f, points_d, at_most=MAX_POINTS_RATIO),
        ratio_target("2. files Rewind: forwarded / direct", rewind_f, rewind_d, at_most=MAX_REWIND_RATIO),
        Target(
            f"3. a watcher on the other replica hears of a rewind: p99 at most {P99_GOAL_S * 1e3:.0f} ms",
            p99 <= P99_GOAL_S,
            f"p99 {fmt_time(p99)} over {len(across):,} receipts (same replica: {fmt_time(percentile(same, 0.99))})",
        ),
    ]
    hop = s.med("capabilities")
    n_rewind, owner_rewind = hops["Rewind"]
    report.infos = [
        f"1. what the non-owner adds to ListRewindPoints: {fmt_time(points_f)} - {fmt_time(points_d)} = "
        f"{fmt_time(points_f - points_d)}, with no call forwarded (replica-1's metrics); what a hop would "
        f"add, one unary call on loopback (GetCapabilities): {fmt_time(hop)}, "
        f"(owner + GetCapabilities) / owner = {fmt_ratio((points_d + hop) / points_d)}",
        _cpu_info("1. CPU per ListRewindPoints", cpu, "points", size.points_burst, answered=True),
        f"2. what forwarding adds to a files Rewind: {fmt_time(rewind_f)} - {fmt_time(rewind_d)} = "
        f"{fmt_time(rewind_f - rewind_d)}; replica-1's wait on replica-0 per forwarded call (the mean of "
        f"{n_rewind:,}): {fmt_time(owner_rewind)}",
        _cpu_info("2. CPU per files Rewind", cpu, "rewind", size.rewinds_burst),
        f"3. medians across replicas / same replica: {fmt_time(median(across))} / {fmt_time(median(same))} = "
        f"{fmt_ratio(median(across) / median(same))}",
    ]
    report.notes = [
        f"rows 1, 2: {size.rounds} rounds per phase, each running every measure of the phase once, in an order "
        f"reversed every other round, a garbage collection (here) before each; {CALLS} calls per "
        "ListRewindPoints and GetCapabilities sample; the rewinds alternate between two points, so each applies",
        f"row 3: {size.events} files rewinds, one at a time, the next once both watchers have the last; a "
        "negative latency is a watcher that heard before the caller's answer arrived",
        "CPU per call: each replica's user + system time (from /proc) over calls made back to back after the "
        "rounds (a replica waking from idle between calls spends more per call)",
        "two replicas as processes, one PostgreSQL database (pgserver: a Unix socket, fsync off); the replicas, "
        "their CLIs, PostgreSQL and the watchers share this machine's cores",
    ]
    return report


def _cpu_info(
    title: str, cpu: dict[str, tuple[float, float]], name: str, n: int, *, answered: bool = False
) -> str:
    direct, forwarded = cpu[f"{name} direct"], cpu[f"{name} forwarded"]
    how = "answered by replica-1" if answered else "forwarded by replica-1"
    return (
        f"{title}, {n:,} calls back to back each way: sent to replica-0, replica-0 {fmt_time(direct[0])} "
        f"(replica-1 {fmt_time(direct[1])}); {how}, replica-1 {fmt_time(forwarded[1])} and "
        f"replica-0 {fmt_time(forwarded[0])}"
    )


def run(work: Path, quick: bool = False) -> Report:
    from tests.pgserver_fixture import PostgresServer  # the tests' PostgreSQL, from the pgserver wheel

    started = time.monotonic()
    size = QUICK if quick else FULL
    postgres = PostgresServer()
    try:
        url = postgres.url(postgres.create_database())
        report = asyncio.run(asyncio.wait_for(_run(work, url, size), TIMEOUT_S))
    finally:
        postgres.stop()
    report.seconds = time.monotonic() - started
    return report
