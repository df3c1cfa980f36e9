"""One load run: the servers started, the client processes set up and let go together, the servers
sampled while they run, and everything the run saw gathered for `analysis`.

The window measured is from `go` to the moment every loop has ended (a call in flight at the
deadline finishes and counts). Set-up (sessions created, warm-up turns) and the final checks are
outside it.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from agent_rewind.api.v1 import rewind_service_pb2
from benchmarks.load.deployment import (
    Deployment,
    Reading,
    Sampler,
    fd_kinds,
    principals,
    summed,
)


@dataclass(frozen=True)
class Options:
    sessions: int = 200
    principals: int = 20
    watchers: int = 50
    max_live: int = 8
    seconds: float = 180.0
    replicas: int = 1
    processes: int = 2  # client processes
    think: float = 0.0
    rate: float = 0.0  # the calls/s offered in all that set `think` (0: `think` as given)
    warmup_turns: int = 2
    recall: int = 4  # sessions per client process asked `recall` at the end
    seed: int = 0
    timeout: float = 300.0  # seconds any one call may take
    cli_nice: int | None = None  # the servers' --cli-nice (None: their default)
    keep: bool = False


@dataclass
class Raw:
    """What one run saw, before analysis."""

    options: Options
    results: list[dict[str, Any]]
    readings: list[Reading]
    before: Reading
    after: Reading
    settled: Reading  # a few seconds after the final checks: what is left running
    go_wall: float  # time.time() at `go`
    window_s: float
    setup_s: float
    log: list[dict[str, Any]]
    hwm_kb: int
    work: str
    progress: list[tuple[float, int, int]] = field(default_factory=list)  # (s, calls, errors)
    probe: list[float] = field(default_factory=list)  # GetCapabilities round trips over the window
    fds_before: dict[str, int] = field(default_factory=dict)  # the servers' open files by kind
    fds_settled: dict[str, int] = field(default_factory=dict)


class _Client:
    """One client process (`python -m benchmarks.load.worker`) and what it said."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.set_up = 0
        self.calls = 0
        self.errors = 0
        self.ready = asyncio.Event()
        self.checking = asyncio.Event()
        self.result: dict[str, Any] | None = None
        self.done = asyncio.Event()
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            while line := (await self.proc.stdout.readline()).decode():
                word, _, rest = line.strip().partition(" ")
                if word == "setup":
                    self.set_up = int(rest)
                elif word == "ready":
                    self.ready.set()
                elif word == "progress":
                    got = json.loads(rest)
                    self.calls, self.errors = int(got["calls"]), int(got["errors"])
                elif word == "checking":
                    self.checking.set()
                elif word == "result":
                    self.result = json.loads(rest)
        finally:
            self.done.set()

    async def say(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()

    async def wait_for(self, event: asyncio.Event) -> None:
        """`event`, or an error if the process ended first."""
        ended = asyncio.create_task(self.done.wait())
        waited = asyncio.create_task(event.wait())
        await asyncio.wait({ended, waited}, return_when=asyncio.FIRST_COMPLETED)
        ended.cancel()
        waited.cancel()
        if not event.is_set():
            code = await self.proc.wait()
            raise RuntimeError(f"a client process ended (exit code {code}); its stderr is above")


def _plans(o: Options, addresses: list[str], named: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """The loops and watchers split over the client processes, round robin: loop i is principal
    i mod M's; watcher j principal j mod M's."""
    n = max(1, min(o.processes, o.sessions))
    plans = []
    for k in range(n):
        loops = [(i, *named[i % len(named)]) for i in range(k, o.sessions, n)]
        watchers = [(j, *named[j % len(named)]) for j in range(k, o.watchers, n)]
        plans.append(
            {
                "addresses": addresses,
                "loops": loops,
                "watchers": watchers,
                "seconds": o.seconds,
                "seed": o.seed,
                "think": o.think,
                "warmup_turns": o.warmup_turns,
                "setup_concurrency": max(1, o.max_live * o.replicas // n),
                "recall": o.recall,
                "timeout": o.timeout,
            }
        )
    return plans


def _fds(deployment: Deployment) -> dict[str, int]:
    out: dict[str, int] = {}
    for pid in deployment.pids:
        for kind, n in fd_kinds(pid).items():
            out[kind] = out.get(kind, 0) + n
    return out


_said: dict[int, float] = {}


def _plain(bar: tqdm, line: str, every: float = 15.0) -> None:
    """Where no progress bar shows (not a terminal: a CI log), a line every `every` seconds."""
    if bar.disable and time.monotonic() - _said.get(id(bar), 0.0) >= every:
        _said[id(bar)] = time.monotonic()
        print(line, file=sys.stderr, flush=True)


async def _probe(deployment: Deployment, token: str, out: list[float]) -> None:
    """GetCapabilities to each server four times a second: what a call that does nothing costs
    at that moment (the servers' event loops and the machine's run queue), the floor under every
    other call's latency."""
    request = rewind_service_pb2.GetCapabilitiesRequest()
    metadata = (("authorization", f"Bearer {token}"),)
    while True:
        for server in deployment.servers:
            assert server.rewinds is not None
            start = time.perf_counter()
            await server.rewinds.GetCapabilities(request, metadata=metadata, timeout=60)
            out.append(time.perf_counter() - start)
        await asyncio.sleep(0.25)


async def run(o: Options, label: str = "") -> Raw:
    work = Path(tempfile.mkdtemp(prefix="agent-rewind-load-"))
    named = principals(o.principals)
    deployment = Deployment(work, replicas=o.replicas, max_live=o.max_live, named=named, cli_nice=o.cli_nice)
    clients: list[_Client] = []
    sampler = Sampler(deployment)
    tag = f"{label}: " if label else ""
    try:
        await deployment.start()
        for plan in _plans(o, deployment.addresses, named):
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "benchmarks.load.worker",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                limit=1 << 30,
            )
            client = _Client(proc)
            clients.append(client)
            await client.say(json.dumps(plan))
        started = time.monotonic()
        with tqdm(total=o.sessions, desc=f"{tag}sessions set up", unit="session", disable=None) as bar:
            while not all(c.ready.is_set() for c in clients):
                for c in clients:
                    if c.done.is_set() and not c.ready.is_set():
                        await c.wait_for(c.ready)
                bar.n = sum(c.set_up for c in clients)
                bar.refresh()
                _plain(bar, f"{tag}{bar.n:,} of {o.sessions:,} sessions set up")
                await asyncio.sleep(0.5)
            bar.n = o.sessions
        setup_s = time.monotonic() - started
        before = await sampler.sample()
        fds_before = _fds(deployment)
        sampler.start()
        go_wall, go = time.time(), time.monotonic()
        for c in clients:
            await c.say("go")
        progress: list[tuple[float, int, int]] = []
        probe: list[float] = []
        prober = asyncio.create_task(_probe(deployment, named[0][1], probe))
        with tqdm(total=round(o.seconds), desc=f"{tag}load", unit="s", disable=None) as bar:
            while not all(c.checking.is_set() for c in clients):
                for c in clients:
                    if c.done.is_set() and not c.checking.is_set():
                        await c.wait_for(c.checking)
                await asyncio.sleep(0.5)
                elapsed = time.monotonic() - go
                calls, errors = sum(c.calls for c in clients), sum(c.errors for c in clients)
                progress.append((elapsed, calls, errors))
                last = sampler.readings[-1] if sampler.readings else before
                bar.n = min(round(elapsed), round(o.seconds))
                bar.set_postfix(
                    calls=calls,
                    per_s=f"{calls / max(elapsed, 1e-9):.0f}",
                    errors=errors,
                    live_cli=last.cli_count,
                    slots=round(summed(last.metrics, "agent_rewind_live_processes")),
                    refresh=False,
                )
                bar.refresh()
                _plain(
                    bar,
                    f"{tag}{elapsed:.0f} s: {calls:,} calls, {errors:,} refused, {last.cli_count} CLIs alive",
                )
        window_s = time.monotonic() - go
        after = await sampler.stop()
        prober.cancel()
        await asyncio.gather(prober, return_exceptions=True)
        print(f"{tag}checking every session against its model ...", file=sys.stderr, flush=True)
        for c in clients:
            await c.wait_for(c.done)
            await c.proc.wait()
            if c.result is None:
                raise RuntimeError(f"a client process gave no result (exit code {c.proc.returncode})")
        await asyncio.sleep(3.0)  # processes let go of after the checks have exited
        settled = await sampler.sample()
        fds_settled = _fds(deployment)
        return Raw(
            options=o,
            results=[c.result for c in clients if c.result is not None],
            readings=sampler.readings,
            before=before,
            after=after,
            settled=settled,
            go_wall=go_wall,
            window_s=window_s,
            setup_s=setup_s,
            log=deployment.log_lines(),
            hwm_kb=sampler.peak_hwm_kb(),
            work=str(work),
            progress=progress,
            probe=probe,
            fds_before=fds_before,
            fds_settled=fds_settled,
        )
    finally:
        await sampler.cancel()
        for c in clients:
            if c.proc.returncode is None:
                c.proc.kill()
                await c.proc.wait()
        await deployment.close()
        if not o.keep:
            shutil.rmtree(work, ignore_errors=True)
