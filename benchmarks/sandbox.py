"""Benchmark 8: what the command sandbox costs a Bash call, through the real gRPC server.

Two servers in this process side by side, one with the sandbox on (the default) and one with
`--sandbox off`, each with one live session allowing Bash. Every round runs, on each, a turn of
one Bash call (`bash true`) and a turn of ten; in an order reversed every other round. Both
sessions' transcripts grow alike. The difference between the two sides is what confining the
command costs: bubblewrap setting up its namespaces and mounts, per call.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from benchmarks.common import Measure, Report, Sample, Target, fmt_ratio, fmt_time, interleave, timed
from benchmarks.service import Client, serve

MAX_RATIO = 1.3
MAX_EXTRA_PER_CALL_S = 0.030
ONE = "bash true"
TEN = "\n".join(["bash true"] * 10)
ROWS = (("a turn of one Bash call", "one"), ("a turn of ten Bash calls", "ten"))


def _target(name: str, on: float, off: float, calls: int) -> Target:
    """At most 1.3x, or at most 30 ms more per call: either holds."""
    ratio = on / off if off else float("inf")
    extra = (on - off) / calls
    passed = ratio <= MAX_RATIO or extra <= MAX_EXTRA_PER_CALL_S
    detail = (
        f"{fmt_time(on)} / {fmt_time(off)} = {fmt_ratio(ratio)}, {fmt_time(extra)} more per call "
        f"(at most {MAX_RATIO:g}x, or at most {fmt_time(MAX_EXTRA_PER_CALL_S)} more per call)"
    )
    return Target(name, passed, detail)


def run(work: Path, *, quick: bool = False) -> Report:
    return asyncio.run(_run(work, quick))


async def _run(work: Path, quick: bool) -> Report:
    async with serve(work / "on") as on, serve(work / "off", sandbox="off") as off:
        sides: dict[str, tuple[Client, str]] = {}
        for name, client in (("on", on), ("off", off)):
            session = await client.create(allowed_tools=["Bash"])
            await client.prompt(session.session_id, ONE)  # the CLI is live, its first call made
            sides[name] = (client, session.session_id)

        def turn(side: str, row: str, text: str) -> Measure:
            client, sid = sides[side]

            async def measure() -> Sample:
                _, seconds = await timed(client.prompt(sid, text))
                return {f"{row} {side}": seconds}

            return measure

        measures = {
            f"{row} {side}": turn(side, row, text)
            for row, text in (("one", ONE), ("ten", TEN))
            for side in ("on", "off")
        }
        samples = await interleave(measures, 3 if quick else 15, budget_s=60 if quick else 240)
    report = Report(
        "Sandbox: a Bash call confined against unconfined", ["turn", "sandbox on", "--sandbox off", "ratio"]
    )
    for title, row in ROWS:
        a, b = samples.med(f"{row} on"), samples.med(f"{row} off")
        report.rows.append([title, fmt_time(a), fmt_time(b), fmt_ratio(a / b if b else float("nan"))])
    report.targets.append(
        _target("one Bash call, sandbox on / off", samples.med("one on"), samples.med("one off"), 1)
    )
    report.targets.append(
        _target("ten Bash calls, sandbox on / off", samples.med("ten on"), samples.med("ten off"), 10)
    )
    report.notes.append(
        f"medians of {samples.n('one on')} rounds per row; each turn also holds the model's round trips "
        "(the scripted model on loopback), alike on both sides"
    )
    return report
