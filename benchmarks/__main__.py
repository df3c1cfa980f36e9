"""`python -m benchmarks [--only NAME ...] [--quick] [--keep] [--update-docs]`: run, print, exit 1 on a
failed target. With --update-docs, the results block of docs/benchmarks.md is rewritten from this run."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from benchmarks import (
    confinement,
    events,
    grown,
    memory,
    overhead,
    points,
    replicas,
    rewind,
    sandbox,
    snapshots,
    storage,
    webhooks,
)
from benchmarks.common import Report, machine
from benchmarks.docs import DOC, update_results

BENCHMARKS = (
    "points",
    "rewind",
    "memory",
    "events",
    "overhead",
    "snapshots",
    "replicas",
    "sandbox",
    "webhooks",
    "confinement",
    "storage",
    "grown",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument(
        "--only", action="append", choices=BENCHMARKS, help="run only this benchmark (repeatable)"
    )
    parser.add_argument("--small", type=int, default=50, help="turns of the small transcript (default 50)")
    parser.add_argument(
        "--large", type=int, default=5000, help="turns of the large transcript (default 5000)"
    )
    parser.add_argument("--rounds", type=int, default=7, help="rounds of the rewind benchmark (default 7)")
    parser.add_argument(
        "--rewinds", type=int, default=3, help="conversation rewinds the memory benchmark watches (default 3)"
    )
    parser.add_argument("--quick", action="store_true", help="fewer samples: a smoke run, not a measurement")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory and print its path")
    parser.add_argument(
        "--update-docs",
        action="store_true",
        help=f"rewrite the results block of {DOC.name} from this run (a full run: no --only, no --quick)",
    )
    args = parser.parse_args(argv)
    if not 1 <= args.small < args.large:
        parser.error("need 1 <= --small < --large")
    if args.rounds < 3:
        parser.error("--rounds must be at least 3 (medians)")
    if args.rewinds < 1:
        parser.error("--rewinds must be at least 1")
    if args.update_docs and (args.only or args.quick):
        parser.error("--update-docs records a full run: drop --only and --quick")

    facts = machine()
    print("# agent-rewind benchmarks\n")
    for key, value in facts.items():
        print(f"- {key}: {value}")
    print()

    work = Path(tempfile.mkdtemp(prefix="agent-rewind-bench-"))
    runs: dict[str, Callable[[], Report]] = {
        "points": lambda: points.run(work / "points", args.small, args.large, quick=args.quick),
        "rewind": lambda: rewind.run(work / "rewind", rounds=3 if args.quick else args.rounds),
        "memory": lambda: memory.run(work / "memory", rewinds=1 if args.quick else args.rewinds),
        "events": lambda: events.run(
            work / "events", rounds=1 if args.quick else 3, rewinds=3 if args.quick else 10
        ),
        "overhead": lambda: overhead.run(work / "overhead", quick=args.quick),
        "snapshots": lambda: snapshots.run(work / "snapshots", quick=args.quick),
        "replicas": lambda: replicas.run(work / "replicas", quick=args.quick),
        "sandbox": lambda: sandbox.run(work / "sandbox", quick=args.quick),
        "confinement": lambda: confinement.run(work / "confinement", quick=args.quick),
        "storage": lambda: storage.run(work / "storage", quick=args.quick),
        "grown": lambda: grown.run(work / "grown", quick=args.quick),
        "webhooks": lambda: webhooks.run(
            work / "webhooks", rounds=1 if args.quick else 3, rewinds=3 if args.quick else 20
        ),
    }
    reports: list[Report] = []
    started = time.monotonic()
    try:
        for name in args.only or BENCHMARKS:
            t0 = time.monotonic()
            try:
                report = runs[name]()
            except Exception as err:  # one broken benchmark must not hide the others' results
                traceback.print_exc()
                report = Report(name, [], error=f"{type(err).__name__}: {err}", seconds=time.monotonic() - t0)
            print(report.render(), "\n", flush=True)
            reports.append(report)
    finally:
        if args.keep:
            print(f"scratch directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    summary = _summary(reports, time.monotonic() - started)
    print(f"# {summary}")
    if args.update_docs:
        update_results(facts, reports, summary)
        print(f"results written to {DOC}")
    return 0 if all(r.passed for r in reports) else 1


def _summary(reports: list[Report], seconds: float) -> str:
    targets = [t for r in reports for t in r.targets]
    passed = sum(t.passed for t in targets)
    broken = [r.title for r in reports if r.error]
    text = f"{passed}/{len(targets)} targets passed"
    if broken:
        text += f"; did not finish: {', '.join(broken)}"
    return f"{text}, in {seconds:.0f} s"


if __name__ == "__main__":
    sys.exit(main())
