"""`python -m benchmarks [--only NAME ...] [--quick] [--keep]`: run, print, exit 1 on a failed target."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from benchmarks import points, rewind
from benchmarks.common import Report, machine

BENCHMARKS = ("points", "rewind")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument(
        "--only",
        action="append",
        choices=BENCHMARKS,
        help="run only this benchmark (repeatable); `rewind` includes the memory report",
    )
    parser.add_argument("--small", type=int, default=50, help="turns of the small transcript (default 50)")
    parser.add_argument(
        "--large", type=int, default=5000, help="turns of the large transcript (default 5000)"
    )
    parser.add_argument(
        "--rounds", type=int, default=7, help="rewinds (and client starts) per kind (default 7)"
    )
    parser.add_argument("--quick", action="store_true", help="fewer samples: a smoke run, not a measurement")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory and print its path")
    args = parser.parse_args(argv)
    if not 1 <= args.small < args.large:
        parser.error("need 1 <= --small < --large")
    if args.rounds < 3:
        parser.error("--rounds must be at least 3 (medians)")

    print("# agent-rewind benchmarks\n")
    for key, value in machine().items():
        print(f"- {key}: {value}")
    print()

    work = Path(tempfile.mkdtemp(prefix="agent-rewind-bench-"))
    runs: dict[str, Callable[[], list[Report]]] = {
        "points": lambda: [points.run(work / "points", args.small, args.large, quick=args.quick)],
        "rewind": lambda: rewind.run(work / "rewind", rounds=3 if args.quick else args.rounds),
    }
    reports: list[Report] = []
    started = time.monotonic()
    try:
        for name in args.only or BENCHMARKS:
            t0 = time.monotonic()
            try:
                got = runs[name]()
            except Exception as err:  # one broken benchmark must not hide the others' results
                traceback.print_exc()
                got = [Report(name, [], error=f"{type(err).__name__}: {err}", seconds=time.monotonic() - t0)]
            for report in got:
                print(report.render(), "\n", flush=True)
            reports.extend(got)
    finally:
        if args.keep:
            print(f"scratch directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    targets = [t for r in reports for t in r.targets]
    failed = [t for t in targets if not t.passed] + [r for r in reports if r.error]
    print(
        f"# {len(targets) - len([t for t in targets if not t.passed])}/{len(targets)} targets passed"
        f"{'' if not failed else ', ' + str(len(failed)) + ' failure(s)'} in {time.monotonic() - started:.0f} s"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
