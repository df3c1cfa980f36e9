"""`make load` (`python -m benchmarks.load`): the service under a many-tenant load, measured.

Prints a table per RPC and what the servers spent, writes the JSON report, and exits 1 when a
target failed (the consistency check, an INTERNAL or UNKNOWN, the live-process bound; with
--scaling, the growth from the smallest size to the largest). With --update-docs, the load's block
of docs/benchmarks.md is rewritten from this run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Report, machine
from benchmarks.load import anchor, runner
from benchmarks.load.analysis import analyze
from benchmarks.load.report import run_report, scaling_report, update_docs

SCALING = (50, 200, 1000)
# What --scaling offers at every size, in calls/s: well under what 8 live slots answer on 2 cores
# (about 7 calls/s of the mix, 40% of them prompts, most of which start a CLI), so that what grows
# with the sessions is what each call costs, not a queue. Closed loops at every size would offer
# as many calls at once as there are sessions: at 1,000, a queue of them whatever a call costs.
SCALING_RATE = 2.5


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="make load", description=(__doc__ or "").split("\n\n")[0])
    d = runner.Options()
    p.add_argument(
        "--sessions",
        type=int,
        default=d.sessions,
        help=f"sessions, one closed loop each (default {d.sessions})",
    )
    p.add_argument("--principals", type=int, default=d.principals, help=f"tenants (default {d.principals})")
    p.add_argument(
        "--watchers", type=int, default=d.watchers, help=f"WatchRewindEvents streams (default {d.watchers})"
    )
    p.add_argument(
        "--max-live-sessions", type=int, default=d.max_live, help=f"per server (default {d.max_live})"
    )
    p.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="the measured window of each run (default 120; with --scaling, 240)",
    )
    p.add_argument(
        "--replicas", type=int, default=1, choices=(1, 2), help="2: two replicas on PostgreSQL (pgserver)"
    )
    p.add_argument(
        "--processes", type=int, default=d.processes, help=f"client processes (default {d.processes})"
    )
    p.add_argument(
        "--think", type=float, default=d.think, help="mean seconds between a loop's calls (default 0)"
    )
    p.add_argument(
        "--rate",
        type=float,
        default=None,
        metavar="CALLS_PER_S",
        help="the calls offered per second in all, the same at every size: each loop thinks a mean of "
        f"sessions/rate seconds between calls (default: closed loops; with --scaling, {SCALING_RATE:g})",
    )
    p.add_argument(
        "--warmup-turns",
        type=int,
        default=d.warmup_turns,
        help=f"untimed turns per session first (default {d.warmup_turns})",
    )
    p.add_argument(
        "--recall", type=int, default=d.recall, help="sessions per client process asked `recall` at the end"
    )
    p.add_argument("--seed", type=int, default=None)
    p.add_argument(
        "--scaling",
        nargs="?",
        const=",".join(map(str, SCALING)),
        default=None,
        metavar="N,N,...",
        help=f"the same mix at each number of sessions (default {','.join(map(str, SCALING))}), and the SDK anchor",
    )
    p.add_argument("--anchor", action="store_true", help="the SDK anchor beside a single run too")
    p.add_argument("--anchor-seconds", type=float, default=30.0, help="the anchor's window (default 30)")
    p.add_argument(
        "--json", type=Path, default=None, help="where the JSON report goes (default: the temp dir)"
    )
    p.add_argument(
        "--update-docs", action="store_true", help="rewrite the load's block of docs/benchmarks.md"
    )
    p.add_argument("--keep", action="store_true", help="keep the servers' state dirs")
    p.add_argument(
        "--cli-nice",
        type=int,
        default=None,
        metavar="N",
        help="the servers' --cli-nice (default: theirs, 10); 0 to see the load without it",
    )
    return p.parse_args(argv)


def _clean(value: Any) -> Any:
    """NaN as null: the JSON report is strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


async def _main(args: argparse.Namespace) -> int:
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    sizes = [int(s) for s in args.scaling.split(",")] if args.scaling else [args.sessions]
    facts = machine()
    started = time.monotonic()
    runs = []
    rate = args.rate if args.rate is not None else SCALING_RATE if args.scaling and not args.think else 0.0
    seconds = args.seconds if args.seconds is not None else 240.0 if args.scaling else 120.0
    for sessions in sizes:
        options = runner.Options(
            sessions=sessions,
            principals=args.principals,
            watchers=args.watchers,
            max_live=args.max_live_sessions,
            seconds=seconds,
            replicas=args.replicas,
            processes=args.processes,
            think=sessions / rate if rate > 0 else args.think,
            rate=rate,
            warmup_turns=args.warmup_turns,
            recall=args.recall,
            seed=seed,
            keep=args.keep,
            cli_nice=args.cli_nice,
        )
        raw = await runner.run(options, label=f"{sessions:,} sessions" if len(sizes) > 1 else "")
        if args.keep:
            print(f"state kept in {raw.work}", file=sys.stderr)
        runs.append(analyze(raw))
        print(run_report(runs[-1]).render(), flush=True)
    anchored = None
    if args.scaling or args.anchor:
        anchored = await anchor.run(
            clients=args.max_live_sessions * args.replicas,
            sessions=sizes[0],
            seconds=args.anchor_seconds,
            seed=seed,
        )
    reports: list[Report] = [run_report(a) for a in runs]
    if args.scaling:
        reports.append(scaling_report(runs, anchored))
        print(reports[-1].render(), flush=True)
    if anchored is not None:
        reports.append(anchor.report(anchored))
        print(reports[-1].render(), flush=True)
    passed = all(r.passed for r in reports)
    failed = sum(1 for r in reports for t in r.targets if not t.passed)
    total = sum(len(r.targets) for r in reports)
    summary = f"{total - failed} of {total} targets passed" + ("" if passed else f", {failed} failed")
    report_path = args.json or Path(tempfile.gettempdir()) / "agent-rewind-load.json"
    report_path.write_text(
        json.dumps(
            _clean({"facts": facts, "seed": seed, "runs": runs, "anchor": anchored, "summary": summary}),
            indent=1,
        )
    )
    print(f"load: {summary}, seed {seed}, {time.monotonic() - started:.0f} s; JSON report: {report_path}")
    if args.update_docs:
        name = "scaling" if args.scaling else "replicas" if args.replicas > 1 else "one-server"
        update_docs(name, reports, {**facts, "seed": str(seed)}, summary)
    return 0 if passed else 1


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(_main(_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
