"""Prometheus metrics (--metrics-listen): what the service does, by counts and latencies.

One registry of the service's own (not prometheus_client's global one). Labels are small fixed
sets (an RPC's name, a status code, a mode): never a session id, a path or a principal, so the
series stay few and say nothing a scrape should not see. Gauges of the moment (sessions by state,
watchers) are read at scrape time from whatever a running server registers with `observe`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import start_http_server
from prometheus_client.registry import Collector

REGISTRY = CollectorRegistry(auto_describe=True)

_FAST = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_SLOW = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

RPCS = Counter(
    "agent_rewind_rpcs_total",
    "RPCs handled, by method and status code",
    ["method", "code"],
    registry=REGISTRY,
)
RPC_SECONDS = Histogram(
    "agent_rewind_rpc_duration_seconds",
    "How long RPCs took, by method (a stream: until it ended)",
    ["method"],
    buckets=_SLOW,
    registry=REGISTRY,
)
FORWARDED_RPCS = Counter(
    "agent_rewind_forwarded_rpcs_total",
    "RPCs forwarded to the replica that owns their session (or that a new session was placed on)",
    ["method"],
    registry=REGISTRY,
)
FORWARDED_RPC_SECONDS = Histogram(
    "agent_rewind_forwarded_rpc_duration_seconds",
    "How long forwarded RPCs took, from here to the owner and back, by method",
    ["method"],
    buckets=_SLOW,
    registry=REGISTRY,
)
CLI_STARTS = Counter(
    "agent_rewind_cli_starts_total", "Claude Code processes started (fresh or resumed)", registry=REGISTRY
)
CLI_START_FAILURES = Counter(
    "agent_rewind_cli_start_failures_total", "Claude Code processes that did not start", registry=REGISTRY
)
CLI_KILLS = Counter(
    "agent_rewind_cli_kills_total",
    "Claude Code processes killed (a turn that ignored Interrupt, a forced close)",
    registry=REGISTRY,
)
CLI_START_SECONDS = Histogram(
    "agent_rewind_cli_start_seconds",
    "How long a Claude Code process took to start",
    buckets=_SLOW,
    registry=REGISTRY,
)
REWINDS = Counter(
    "agent_rewind_rewinds_total",
    "Rewinds asked for, by mode, outcome (applied, refused, failed) and files source",
    ["mode", "outcome", "source"],
    registry=REGISTRY,
)
REWIND_SECONDS = Histogram(
    "agent_rewind_rewind_duration_seconds",
    "How long applying a rewind took, by mode",
    ["mode"],
    buckets=_FAST,
    registry=REGISTRY,
)
SNAPSHOTS = Counter(
    "agent_rewind_workspace_snapshots_total",
    "Workspace snapshots taken, by how (unchanged, watched, paths, scan, seeded: see docs/rewind.md) and "
    "whether complete",
    ["how", "complete"],
    registry=REGISTRY,
)
SNAPSHOT_SECONDS = Histogram(
    "agent_rewind_workspace_snapshot_seconds",
    "How long a workspace snapshot took, by how it was taken",
    ["how"],
    buckets=_FAST,
    registry=REGISTRY,
)
EVENTS_SENT = Counter(
    "agent_rewind_events_sent_total", "Rewind events sent to watchers, over every watcher", registry=REGISTRY
)
LEDGER_WRITE_SECONDS = Histogram(
    "agent_rewind_ledger_write_seconds",
    "How long a ledger write (one transaction, synced) took",
    buckets=_FAST,
    registry=REGISTRY,
)
LEDGER_WRITE_FAILURES = Counter(
    "agent_rewind_ledger_write_failures_total", "Ledger writes that failed", registry=REGISTRY
)

# Webhook delivery (webhooks/), by URL as `webhooks.subscriptions.shown` shows it: no user,
# password or query. The URLs are the operator's few, fixed at start.
WEBHOOK_ATTEMPTS = Counter(
    "agent_rewind_webhook_attempts_total",
    "Webhook POSTs, by URL and result: ok (2xx), http_error (another status), timeout, connection_error",
    ["webhook", "result"],
    registry=REGISTRY,
)
WEBHOOK_EVENTS = Counter(
    "agent_rewind_webhook_events_total",
    "Events done with, by URL and outcome: delivered; failed (every attempt failed: recorded, skipped)",
    ["webhook", "outcome"],
    registry=REGISTRY,
)
WEBHOOK_MISSED = Counter(
    "agent_rewind_webhook_events_missed_total",
    "Events dropped by the log's retention before a URL was sent them",
    ["webhook"],
    registry=REGISTRY,
)
WEBHOOK_DELIVERY_SECONDS = Histogram(
    "agent_rewind_webhook_delivery_seconds",
    "From an event's commit to its receiver's 2xx, by URL (retries included)",
    ["webhook"],
    buckets=_SLOW,
    registry=REGISTRY,
)
WEBHOOK_LAG = Gauge(
    "agent_rewind_webhook_lag_events",
    "Events committed that this replica's delivery to a URL has not yet done with (while it holds the URL)",
    ["webhook"],
    registry=REGISTRY,
)
WEBHOOK_HELD = Gauge(
    "agent_rewind_webhook_held",
    "1 while this replica holds a URL's lease (delivers its events), else 0",
    ["webhook"],
    registry=REGISTRY,
)


@contextlib.contextmanager
def timed(histogram: Any) -> Iterator[None]:
    """Observes how long the block took (also when it raises)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        histogram.observe(time.perf_counter() - started)


@dataclass(frozen=True, eq=False)
class _Server:
    sessions: Callable[[], dict[str, int]]
    watchers: Callable[[], int]
    live: Callable[[], tuple[int, int, int]]  # held, the bound, calls waiting for a slot


class _Gauges(Collector):
    """Gauges read at scrape time from the running servers: one in a process, but tests run
    several replicas in one (their gauges add up)."""

    def __init__(self) -> None:
        self.servers: list[_Server] = []

    def collect(self) -> Iterable[GaugeMetricFamily]:
        servers = list(self.servers)
        by_state = GaugeMetricFamily("agent_rewind_sessions", "Sessions, by state", labels=["state"])
        states: dict[str, int] = {}
        for server in servers:
            for state, count in server.sessions().items():
                states[state] = states.get(state, 0) + count
        for state, count in sorted(states.items()):
            by_state.add_metric([state.lower()], count)
        yield by_state
        yield GaugeMetricFamily(
            "agent_rewind_watchers",
            "Open WatchRewindEvents streams",
            value=sum(s.watchers() for s in servers),
        )
        live = [s.live() for s in servers]
        yield GaugeMetricFamily(
            "agent_rewind_live_processes", "Live-process slots held", value=sum(h for h, _, _ in live)
        )
        yield GaugeMetricFamily(
            "agent_rewind_live_processes_max",
            "The live-process bound (--max-live-sessions)",
            value=sum(c for _, c, _ in live),
        )
        yield GaugeMetricFamily(
            "agent_rewind_live_processes_waiting",
            "Calls waiting for a live-process slot (--live-session-wait)",
            value=sum(w for _, _, w in live),
        )


_GAUGES = _Gauges()
REGISTRY.register(_GAUGES)


def observe(
    sessions: Callable[[], dict[str, int]],
    watchers: Callable[[], int],
    live: Callable[[], tuple[int, int, int]],
) -> Callable[[], None]:
    """Registers a running server's gauges; returns what unregisters them."""
    server = _Server(sessions, watchers, live)
    _GAUGES.servers.append(server)
    return lambda: _GAUGES.servers.remove(server)


class MetricsServer:
    """The plain-HTTP /metrics endpoint, in a thread of its own (a scrape never waits on the event loop)."""

    def __init__(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        self._server: WSGIServer
        self._thread: threading.Thread
        self._server, self._thread = start_http_server(
            int(port), addr=host.strip("[]") or "0.0.0.0", registry=REGISTRY
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


STORAGE_BYTES = Gauge(
    "agent_rewind_storage_bytes",
    "Bytes the sessions this replica serves hold, as last measured: their workspaces (part "
    "workspace) and what their rewinds need (part history: transcripts, the CLI's file backups, "
    "snapshots)",
    ["part"],
    registry=REGISTRY,
)
