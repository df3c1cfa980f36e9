"""Benchmark 10: what confining the CLI process itself (Landlock, sandbox/cli.py) costs, through
the real gRPC server.

Two servers in this process side by side, one with `--cli-confinement landlock` (the default)
and one with `--cli-confinement off`, both with the command sandbox off (benchmark 8 measures
that). Every round, on each, in an order reversed every other round: a CreateSession (it starts
the session's CLI process, through the launcher on the confined side) and a turn of file tools
on a live session (`write`, then `edit`: a Write, a Read and an Edit, each opened under the
kernel's rules on the confined side). Target: at most 1.1x on each row.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from benchmarks.common import Measure, Report, Sample, Target, fmt_ratio, fmt_time, interleave, timed
from benchmarks.service import Client, serve

MAX_RATIO = 1.1
TURN = "write notes.txt one\nedit notes.txt one => two"
ROWS = (("a CLI start (CreateSession)", "start"), ("a turn of Write, Read and Edit", "turn"))


def run(work: Path, *, quick: bool = False) -> Report:
    return asyncio.run(_run(work, quick))


async def _run(work: Path, quick: bool) -> Report:
    async with (
        serve(work / "on", sandbox="off") as on,
        serve(work / "off", sandbox="off", cli_confinement="off") as off,
    ):
        sides: dict[str, tuple[Client, str]] = {}
        for name, client in (("on", on), ("off", off)):
            session = await client.create()
            await client.prompt(session.session_id, TURN)
            sides[name] = (client, session.session_id)

        def start(side: str) -> Measure:
            client, _ = sides[side]

            async def measure() -> Sample:
                session, seconds = await timed(client.create())
                await client.close(session.session_id)
                return {f"start {side}": seconds}

            return measure

        def turn(side: str) -> Measure:
            client, sid = sides[side]

            async def measure() -> Sample:
                _, seconds = await timed(client.prompt(sid, TURN))
                return {f"turn {side}": seconds}

            return measure

        measures = {f"start {side}": start(side) for side in ("on", "off")}
        measures |= {f"turn {side}": turn(side) for side in ("on", "off")}
        samples = await interleave(measures, 3 if quick else 15, budget_s=60 if quick else 240)
    report = Report(
        "CLI confinement: the CLI process under Landlock against unconfined",
        ["what", "--cli-confinement landlock", "off", "ratio"],
    )
    for title, row in ROWS:
        a, b = samples.med(f"{row} on"), samples.med(f"{row} off")
        ratio = a / b if b else float("inf")
        report.rows.append([title, fmt_time(a), fmt_time(b), fmt_ratio(ratio)])
        report.targets.append(
            Target(
                f"{title}, confined / not",
                ratio <= MAX_RATIO,
                f"{fmt_time(a)} / {fmt_time(b)} = {fmt_ratio(ratio)} (at most {MAX_RATIO:g}x)",
            )
        )
    report.notes.append(
        f"medians of {samples.n('turn on')} rounds per row; a turn also holds the model's round trips "
        "(the scripted model on loopback), alike on both sides"
    )
    return report
