"""The servers the load drives, and what the operating system and their metrics say of them.

One `agent-rewind serve` process (`ServerProcess`: the offline scripted model, real CLI
processes), or two replicas on one PostgreSQL database (the `pgserver` wheel, as the tests and
benchmarks/replicas.py run it), each with a state dir of its own. Every server reads one access
file naming the load's principals, each with a bearer token; each serves Prometheus metrics.

`Sampler` reads, once a second, what each server process and its CLI processes use (from /proc:
CPU time, resident memory, open files, threads; the CLI processes as `testing.processes` finds
them, never as the server reports them) and what its metrics say (CLI starts, live-process slots
held, sessions by state, watchers, RPCs by status).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_rewind.access import hash_token
from agent_rewind.testing.processes import cli_processes, rss_kb, tree_rss_kb
from agent_rewind.testing.server_process import ServerProcess
from benchmarks.common import cpu_seconds

PERMISSIONS = ["sessions.read", "sessions.write", "rewind", "rewind.preview", "events.read"]


def principals(count: int) -> list[tuple[str, str]]:
    """(name, bearer token) of each principal of the load."""
    return [(f"tenant-{i:02d}", f"arw_load-tenant-{i:02d}") for i in range(count)]


def access_file(path: Path, named: list[tuple[str, str]]) -> Path:
    entries = [{"name": n, "permissions": PERMISSIONS, "token_sha256": [hash_token(t)]} for n, t in named]
    path.write_text(json.dumps({"principals": entries}))
    return path


def children_cpu_seconds(pid: int) -> float:
    """CPU time of the process's children it has waited for (its CLI processes, once exited),
    and theirs in turn."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def _status(pid: int) -> dict[str, str]:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return {k: v.strip() for k, v in (line.split(":", 1) for line in text.splitlines() if ":" in line)}


def machine_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    total = sum(values[:8])  # guest time is already counted in user
    return total - idle, total


def main_thread_sched(pid: int) -> tuple[float, float]:
    """Seconds the process's main thread (its event loop) ran on a CPU, and waited on a run
    queue for one (/proc/PID/task/PID/schedstat)."""
    try:
        ran, waited, _ = Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()
    except (OSError, ValueError):
        return 0.0, 0.0
    return int(ran) / 1e9, int(waited) / 1e9


def fd_kinds(pid: int) -> dict[str, int]:
    """The process's open files by kind: sockets, pipes, inotify, eventpoll, ..., and files by
    where they are (under /tmp, down to a directory of the server's state dir)."""
    out: dict[str, int] = {}
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("/"):
            parts = Path(target).parts[1:]
            # Under a temporary directory: the run's dir, the server's state dir, and one more.
            kind = "/" + "/".join(parts[:5] if parts[:1] == ("tmp",) else parts[:2])
        elif target.startswith("anon_inode:"):
            kind = target.strip("[]").replace("[", "")
        else:
            kind = target.split(":")[0]  # socket, pipe
        out[kind] = out.get(kind, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def open_files(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


class Deployment:
    """One server, or `replicas` of them on PostgreSQL."""

    def __init__(
        self,
        work: Path,
        *,
        replicas: int,
        max_live: int,
        named: list[tuple[str, str]],
        cli_nice: int | None = None,
    ) -> None:
        self.work = work
        self.cli_nice = cli_nice
        self.replicas = replicas
        self.max_live = max_live
        self.named = named
        self.servers: list[ServerProcess] = []
        self.postgres: Any = None
        self.metrics_ports: list[int] = []

    async def start(self) -> None:
        access = access_file(self.work / "access.json", self.named)
        common = ["--access-file", str(access), "--max-live-sessions", str(self.max_live)]
        common += ["--metrics-listen", "127.0.0.1:0"]
        if self.cli_nice is not None:
            common += ["--cli-nice", str(self.cli_nice)]
        if self.replicas == 1:
            self.servers = [ServerProcess(self.work / "state", args=common)]
        else:
            from tests.pgserver_fixture import PostgresServer  # the tests' PostgreSQL (pgserver wheel)

            self.postgres = await asyncio.to_thread(PostgresServer)
            url = self.postgres.url(await asyncio.to_thread(self.postgres.create_database))
            self.servers = [
                ServerProcess(
                    self.work / f"replica-{i}",
                    args=[*common, "--database-url", url, "--replica-id", f"replica-{i}"],
                )
                for i in range(self.replicas)
            ]
        for server in self.servers:
            await server.start()
        self.metrics_ports = [_metrics_port(server) for server in self.servers]

    @property
    def addresses(self) -> list[str]:
        return [server.address for server in self.servers]

    @property
    def pids(self) -> list[int]:
        return [server.proc.pid for server in self.servers if server.proc is not None]

    async def close(self) -> None:
        for server in self.servers:
            await server.close()
        if self.postgres is not None:
            await asyncio.to_thread(self.postgres.stop)

    def log_lines(self) -> list[dict[str, Any]]:
        return [line for server in self.servers for line in server.log_lines()]


def _metrics_port(server: ServerProcess) -> int:
    for entry in reversed(server.log_lines()):
        if entry.get("event") == "serving metrics":
            return int(str(entry["port"]))
    raise RuntimeError(f"no 'serving metrics' line in {server.log_path}")


def scrape(port: int) -> dict[str, float]:
    """The server's metrics, by series (name and labels as Prometheus prints them)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            try:
                out[series] = float(value)
            except ValueError:
                continue
    return out


def summed(samples: list[dict[str, float]], prefix: str, contains: str = "") -> float:
    """The sum over servers of every series named `prefix` (whose labels hold `contains`)."""
    return sum(v for s in samples for k, v in s.items() if k.split("{")[0] == prefix and contains in k)


@dataclass
class Reading:
    """Every server at one instant."""

    at: float  # monotonic
    cpu_s: float  # the servers' own CPU time (user + system), summed
    children_cpu_s: float  # their waited-for children's (the CLI processes that exited)
    rss_kb: int  # the servers' VmRSS, summed
    cli_count: int  # CLI processes alive, as /proc shows them
    cli_rss_kb: int  # their VmRSS and that of everything they started
    open_files: int
    threads: int
    metrics: list[dict[str, float]]
    machine_ticks: tuple[int, int]  # (busy, total) CPU ticks of the whole machine since boot
    loop_ran_s: float  # the servers' main threads (event loops): on a CPU, summed
    loop_waited_s: float  # and runnable but waiting for a CPU


@dataclass
class Sampler:
    deployment: Deployment
    every: float = 1.0
    readings: list[Reading] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    def read(self) -> Reading:
        d = self.deployment
        clis = [p.pid for s in d.servers for p in cli_processes(config_dir=s.config_dir)]
        return Reading(
            at=time.monotonic(),
            cpu_s=sum(cpu_seconds(pid) for pid in d.pids),
            children_cpu_s=sum(children_cpu_seconds(pid) for pid in d.pids),
            rss_kb=sum(rss_kb(pid)[0] for pid in d.pids),
            cli_count=len(clis),
            cli_rss_kb=tree_rss_kb(clis),
            open_files=sum(open_files(pid) for pid in d.pids),
            threads=sum(int(_status(pid).get("Threads", "0")) for pid in d.pids),
            metrics=[scrape(port) for port in d.metrics_ports],
            machine_ticks=machine_ticks(),
            loop_ran_s=sum(main_thread_sched(pid)[0] for pid in d.pids),
            loop_waited_s=sum(main_thread_sched(pid)[1] for pid in d.pids),
        )

    async def sample(self) -> Reading:
        reading = await asyncio.to_thread(self.read)
        self.readings.append(reading)
        return reading

    def start(self) -> None:
        async def run() -> None:
            while True:
                await self.sample()
                await asyncio.sleep(self.every)

        self._task = asyncio.create_task(run())

    async def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def stop(self) -> Reading:
        await self.cancel()
        return await self.sample()

    def peak_hwm_kb(self) -> int:
        """The servers' own peak resident memory over their life (VmHWM), summed."""
        return sum(rss_kb(pid)[1] for pid in self.deployment.pids)
