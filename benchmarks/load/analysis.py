"""What a load run measured, from what it saw (`runner.Raw`): a plain dict, the JSON report.

Per RPC (and per mode for Rewind and DryRun): calls and calls per second over the window (every
attempt, a refused one too), p50 and p99 of the calls answered OK, errors by status and reason,
and the p50 of the window's first third against its last (a queue that grows shows there). Then
what the servers spent: CPU per call answered (the server processes' own user + system time over
the window), CLI processes started (the metrics' `agent_rewind_cli_starts_total`; by the RPC that
started each and how long each took, from the servers' logs), peak resident memory of the servers
and of every CLI process (and what they started) at once, and what is left a few seconds after the
end (open files, threads, CLI processes, watchers): a leak shows there. Then the calls that start
no CLI (ListRewindPoints, GetSession, and each DryRun during which no CLI process of its session
started, as the servers' logs say). Then the watchers: every rewind, undo and deletion a loop made
must reach every watcher of its principal. And the consistency check of every session.
"""

from __future__ import annotations

import math
from collections import Counter
from datetime import datetime
from typing import Any

from benchmarks.common import percentile
from benchmarks.load.deployment import Reading, summed
from benchmarks.load.runner import Raw

RPCS = (
    "Prompt",
    "ListRewindPoints",
    "DryRun",
    "Rewind",
    "UndoRewind",
    "GetSession",
    "ForkSession",
    "DeleteSession",
    "CreateSession",
)
NO_CLI = ("ListRewindPoints", "GetSession", "DryRun")  # DryRun: those during which no CLI started
FAULTS = ("INTERNAL", "UNKNOWN")  # never an answer the contract allows
BACKPRESSURE = "LIVE_SESSIONS_EXHAUSTED"

# A call record from a worker: [rpc, detail, began (epoch s), seconds, code, reason, session, replica].
RPC, DETAIL, BEGAN, SECONDS, CODE, REASON, SESSION, REPLICA = range(8)


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _latency(values: list[float]) -> dict[str, float]:
    return {
        "p50": percentile(values, 0.5),
        "p99": percentile(values, 0.99),
        "max": max(values) if values else math.nan,
    }


def _row(calls: list[list[Any]], window_s: float, start: float) -> dict[str, Any]:
    ok = [c for c in calls if c[CODE] == "OK"]
    errors = Counter(f"{c[CODE]}/{c[REASON]}" for c in calls if c[CODE] != "OK")
    third = window_s / 3
    early = [c[SECONDS] for c in ok if c[BEGAN] - start < third]
    late = [c[SECONDS] for c in ok if c[BEGAN] - start >= 2 * third]
    return {
        "calls": len(calls),
        "ok": len(ok),
        "calls_per_s": len(calls) / window_s,
        "ok_per_s": len(ok) / window_s,
        **_latency([c[SECONDS] for c in ok]),
        "errors": dict(errors.most_common()),
        "p50_first_third": percentile(early, 0.5),
        "p50_last_third": percentile(late, 0.5),
    }


def _cli_starts(log: list[dict[str, Any]], start: float, end: float) -> list[dict[str, Any]]:
    out = []
    for entry in log:
        if entry.get("event") == "cli started" and "timestamp" in entry:
            at = _epoch(str(entry["timestamp"]))
            if start <= at <= end:
                out.append(
                    {
                        "at": at,
                        "session": entry.get("session_id", ""),
                        "rpc": entry.get("rpc", "-"),
                        "ms": entry.get("ms", 0),
                    }
                )
    return out


def _started_cli(call: list[Any], starts_by_session: dict[str, list[float]]) -> bool:
    began, ended = call[BEGAN], call[BEGAN] + call[SECONDS]
    return any(began <= at <= ended + 0.01 for at in starts_by_session.get(call[SESSION], ()))


def _events(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Every rewind, undo and deletion a loop made, against what each watcher of its principal
    received: missing ones, duplicates, cursors out of order, and the lag from the call's return
    to each receipt (CLOCK_MONOTONIC is one clock for every process)."""
    made: dict[str, dict[tuple[str, str], float]] = {}
    for r in results:
        for principal, kind, key, at in r["made"]:
            made.setdefault(principal, {})[(kind, key)] = at
    missing = duplicates = disorder = extra = 0
    lags: list[float] = []
    errors: Counter[str] = Counter()
    watchers = 0
    for r in results:
        for w in r["watchers"]:
            watchers += 1
            errors.update(w["errors"])
            expected = made.get(w["principal"], {})
            seen: set[tuple[str, str]] = set()
            last = -1
            for kind, key, cursor, at in w["received"]:
                if cursor <= last:
                    disorder += 1
                last = cursor
                if (kind, key) in seen:
                    duplicates += 1
                seen.add((kind, key))
                if (kind, key) in expected:
                    lags.append(at - expected[(kind, key)])
                else:
                    extra += 1
            missing += len(set(expected) - seen)
    return {
        "watchers": watchers,
        "events_made": sum(len(m) for m in made.values()),
        "receipts": len(lags),
        "missing": missing,
        "duplicates": duplicates,
        "out_of_order": disorder,
        "unexpected": extra,
        "stream_errors": dict(errors),
        "lag_p50": percentile(lags, 0.5),
        "lag_p99": percentile(lags, 0.99),
    }


def _delta(after: Reading, before: Reading, name: str, contains: str = "") -> float:
    return summed(after.metrics, name, contains) - summed(before.metrics, name, contains)


def _prompt_parts(calls: list[list[Any]], starts: list[dict[str, Any]]) -> dict[str, Any]:
    """Where a Prompt answered OK that started a CLI process spent its time, from the servers'
    logs: before its CLI began to start (a live slot: the slots' lock, the eviction of the least
    recently used session, waiting for its process to exit), the start itself, and the rest (the
    turn)."""
    by_session: dict[str, list[dict[str, Any]]] = {}
    for s in starts:
        by_session.setdefault(s["session"], []).append(s)
    before, start, rest = [], [], []
    for c in calls:
        if c[RPC] != "Prompt" or c[CODE] != "OK":
            continue
        began, ended = c[BEGAN], c[BEGAN] + c[SECONDS]
        mine = [s for s in by_session.get(c[SESSION], ()) if began <= s["at"] <= ended]
        if mine:
            s = mine[0]
            before.append(s["at"] - s["ms"] / 1000 - began)
            start.append(s["ms"] / 1000)
            rest.append(ended - s["at"])
    return {
        "with_cli_start": len(before),
        "before_start": _latency(before),
        "start": _latency(start),
        "after_start": _latency(rest),
    }


def _timeline(raw: Raw, every: float = 10.0) -> list[dict[str, float]]:
    """The servers every `every` seconds of the window: resident memory (MB), open files, CLI
    processes alive, live slots held, sessions (every state), and the CPU the servers and their
    event loops used since the last point."""
    out: list[dict[str, float]] = []
    last: Reading | None = None
    start = raw.before.at
    for r in [raw.before, *raw.readings]:
        if last is not None and r.at - last.at < every:
            continue
        out.append(
            {
                "s": round(r.at - start, 1),
                "rss_mb": round(r.rss_kb / 1024, 1),
                "open_files": r.open_files,
                "cli_alive": r.cli_count,
                "slots_held": summed(r.metrics, "agent_rewind_live_processes"),
                "sessions": summed(r.metrics, "agent_rewind_sessions"),
                "cpu_s": round(r.cpu_s - last.cpu_s, 2) if last is not None else 0.0,
                "loop_waited_s": round(r.loop_waited_s - last.loop_waited_s, 2) if last is not None else 0.0,
            }
        )
        last = r
    return out


def _busy(before: Reading, after: Reading) -> float:
    """The share of the machine's CPU time that was busy between two readings."""
    busy, total = (
        after.machine_ticks[0] - before.machine_ticks[0],
        after.machine_ticks[1] - before.machine_ticks[1],
    )
    return busy / total if total else math.nan


def analyze(raw: Raw) -> dict[str, Any]:
    o = raw.options
    calls = [c for r in raw.results for c in r["calls"]]
    start, window = raw.go_wall, raw.window_s
    end = start + window
    by_rpc: dict[str, Any] = {}
    for rpc in RPCS:
        mine = [c for c in calls if c[RPC] == rpc]
        if not mine:
            continue
        by_rpc[rpc] = _row(mine, window, start)
        details = sorted({c[DETAIL] for c in mine if c[DETAIL]})
        if details:
            by_rpc[rpc]["by_mode"] = {
                d: _row([c for c in mine if c[DETAIL] == d], window, start) for d in details
            }
    starts = _cli_starts(raw.log, start, end)
    starts_by_session: dict[str, list[float]] = {}
    for s in starts:
        starts_by_session.setdefault(s["session"], []).append(s["at"])
    no_cli = [
        c
        for c in calls
        if c[CODE] == "OK"
        and c[RPC] in NO_CLI
        and not (c[RPC] == "DryRun" and _started_cli(c, starts_by_session))
    ]
    dry_runs = [c for c in calls if c[RPC] == "DryRun" and c[CODE] == "OK"]
    ok = sum(1 for c in calls if c[CODE] == "OK")
    server_cpu = raw.after.cpu_s - raw.before.cpu_s
    cli_starts = _delta(raw.after, raw.before, "agent_rewind_cli_starts_total")
    faults = [c for c in calls if c[CODE] in FAULTS]
    violations = [v for r in raw.results for v in r["violations"]]
    checked: Counter[str] = Counter()
    for r in raw.results:
        checked.update(r["checked"])
    events = _events(raw.results)
    readings = raw.readings or [raw.after]
    waits = [w for r in raw.results for w in r["waits"]]
    consistent = (
        not violations
        and events["missing"] == 0
        and events["duplicates"] == 0
        and events["out_of_order"] == 0
    )
    return {
        "options": {k: v for k, v in vars(o).items() if k != "keep"},
        "window_s": window,
        "setup_s": raw.setup_s,
        "sessions_made": sum(int(r["sessions"]) for r in raw.results),
        "calls": len(calls),
        "ok": ok,
        "calls_per_s": len(calls) / window,
        "ok_per_s": ok / window,
        "rpcs": by_rpc,
        "errors": dict(Counter(f"{c[CODE]}/{c[REASON]}" for c in calls if c[CODE] != "OK").most_common()),
        "faults": len(faults),
        "faults_metrics": _delta(raw.after, raw.before, "agent_rewind_rpcs_total", 'code="INTERNAL"')
        + _delta(raw.after, raw.before, "agent_rewind_rpcs_total", 'code="UNKNOWN"'),
        "backpressure": sum(1 for c in calls if c[REASON] == BACKPRESSURE),
        "prompt_wait": _latency(waits),  # first attempt to answer, back-pressure retries included
        "prompt_parts": _prompt_parts(calls, starts),
        "no_cli": {
            "calls": len(no_cli),
            **_latency([c[SECONDS] for c in no_cli]),
            "dry_runs": len(dry_runs),
            "dry_runs_without_cli": sum(1 for c in no_cli if c[RPC] == "DryRun"),
        },
        "floor": _latency(raw.probe),  # GetCapabilities, four times a second
        "machine_busy": _busy(raw.before, raw.after),
        "cpu": {
            "server_s": server_cpu,
            # Every call the servers answered, a back-pressure refusal too: each is work done.
            "server_per_call_s": server_cpu / len(calls) if calls else math.nan,
            "server_per_ok_s": server_cpu / ok if ok else math.nan,
            "exited_clis_s": raw.after.children_cpu_s - raw.before.children_cpu_s,
            "clients_s": sum(float(r["cpu_s"]) for r in raw.results),
        },
        "cli": {
            "starts": cli_starts,
            "starts_per_min": cli_starts / (window / 60),
            "starts_logged": len(starts),
            "starts_by_rpc": dict(Counter(s["rpc"] for s in starts).most_common()),
            "start_ms": _latency([float(s["ms"]) for s in starts]),
            "peak_alive": max(r.cli_count for r in readings),
            "bound": o.max_live * o.replicas,
            "peak_rss_kb": max(r.cli_rss_kb for r in readings),
            "peak_slots_held": max(round(summed(r.metrics, "agent_rewind_live_processes")) for r in readings),
        },
        "server": {
            "peak_rss_kb": max(r.rss_kb for r in readings),
            "hwm_kb": raw.hwm_kb,
            "rss_kb": {"before": raw.before.rss_kb, "after": raw.after.rss_kb, "settled": raw.settled.rss_kb},
            "open_files": {
                "before": raw.before.open_files,
                "after": raw.after.open_files,
                "settled": raw.settled.open_files,
            },
            "open_files_grown": {
                k: n - raw.fds_before.get(k, 0)
                for k, n in raw.fds_settled.items()
                if n != raw.fds_before.get(k, 0)
            },
            "event_loop": {
                "ran_s": raw.after.loop_ran_s - raw.before.loop_ran_s,
                "waited_for_cpu_s": raw.after.loop_waited_s - raw.before.loop_waited_s,
            },
            "threads": {
                "before": raw.before.threads,
                "after": raw.after.threads,
                "settled": raw.settled.threads,
            },
            "settled": {
                "cli_alive": raw.settled.cli_count,
                "slots_held": summed(raw.settled.metrics, "agent_rewind_live_processes"),
                "watchers": summed(raw.settled.metrics, "agent_rewind_watchers"),
                "running": summed(raw.settled.metrics, "agent_rewind_sessions", 'state="running"'),
            },
        },
        "events": events,
        "timeline": _timeline(raw),
        "consistency": {
            "passed": consistent,
            "violations": len(violations),
            "first_violations": violations[:20],
            "checked": dict(checked),
        },
    }
