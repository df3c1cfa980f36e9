"""Benchmark 12: the cold first page of sessions grown as a user grows them.

Benchmark 1 builds its long session from copies of one recorded turn, registered in the ledger as
if the server had run them: no snapshot records, no points index the server wrote turn by turn,
no compaction. The sessions here are grown through the real server, turn by turn: each prompt a
couple of KB of prose and one tool call (a `write` of one of 20 files), workspace snapshots on
(two snapshot records a turn), and every COMPACT_EVERY turns a compaction (the scripted model's
`context`, which makes the CLI compact before the next prompt). They are grown once, to SMALL and
LARGE turns, and kept under CACHE (growing LARGE turns takes minutes); each run serves them
where they were grown (a session's workspace must lie under its server's workspace roots).

Measured, interleaved round by round: a server started on the copy (untimed), one unrelated call
(`ListSessions` of one session, untimed), then the first `ListRewindPoints` page of PAGE points
(the oldest, no token), timed as a client sees it; the server stopped (untimed).

Targets: the first page at LARGE turns at most MAX_COLD_LARGE_S, and at most MAX_COLD_GROWTH
times the SMALL figure: the page costs what it holds, not what the session does.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path

from agent_rewind.api.v1 import rewind_service_pb2, session_service_pb2
from benchmarks.common import Measure, Report, Samples, Target, fmt_ratio, fmt_time, interleave, ratio_target
from benchmarks.service import serve

SMALL, LARGE = 50, 5000
PAGE = 50
COMPACT_EVERY = 250
MAX_COLD_LARGE_S = 0.020
MAX_COLD_GROWTH = 1.5
ROUNDS = 9
CACHE = Path(tempfile.gettempdir()) / "agent-rewind-bench-cache"
_CACHE_VERSION = 1
# About 2 KB of prose a prompt (the scripted model ignores lines with no verb).
_PROSE = " ".join(["the agent should keep the configuration readable and the tests green"] * 30)


def _prompt(i: int) -> str:
    lines = [_PROSE, f"write notes/f{i % 20}.md turn {i}: {_PROSE[:200]}"]
    if i and i % COMPACT_EVERY == 0:
        lines.append("context 1000000")  # the next prompt starts with a compaction
    return "\n".join(lines)


async def _grow(turns: int) -> tuple[Path, str]:
    """A state dir with one session grown to `turns` turns through the server (cached)."""
    home = CACHE / f"grown-v{_CACHE_VERSION}-{turns}"
    ready = home / "ready"
    if ready.exists():
        return home / "state", ready.read_text()
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    async with serve(home / "state") as c:
        session = await c.create(workspace_snapshots=True)
        started = time.monotonic()
        for i in range(turns):
            await c.prompt(session.session_id, _prompt(i))
            if i % 500 == 499:
                print(f"  grown {i + 1}/{turns} turns in {time.monotonic() - started:.0f} s", flush=True)
    ready.write_text(session.session_id)
    return home / "state", session.session_id


async def _first_page(state: Path, session_id: str) -> float:
    async with serve(state) as c:
        await c.sessions.ListSessions(session_service_pb2.ListSessionsRequest(page_size=1))
        request = rewind_service_pb2.ListRewindPointsRequest(session_id=session_id, page_size=PAGE)
        started = time.perf_counter()
        page = await c.rewinds.ListRewindPoints(request)
        seconds = time.perf_counter() - started
    if len(page.points) != PAGE:
        raise RuntimeError(f"the first page held {len(page.points)} points, not {PAGE}")
    return seconds


async def _run(work: Path, quick: bool) -> Report:
    # Served where they were grown (a session's workspace must lie under its server's roots):
    # a start and a page read change none of what is measured.
    copies = {size: await _grow(size) for size in (SMALL, LARGE)}

    def measure(size: int) -> Measure:
        async def sample() -> dict[str, float]:
            state, sid = copies[size]
            return {f"cold {size}": await _first_page(state, sid)}

        return sample

    samples: Samples = await interleave(
        {f"cold {SMALL}": measure(SMALL), f"cold {LARGE}": measure(LARGE)}, 3 if quick else ROUNDS
    )
    small, large = samples.med(f"cold {SMALL}"), samples.med(f"cold {LARGE}")
    report = Report(
        "12. Cold first page of sessions grown turn by turn",
        ["turns", "first ListRewindPoints page after a start", "vs 50 turns"],
    )
    report.rows.append([str(SMALL), fmt_time(small), "1.00x"])
    report.rows.append([str(LARGE), fmt_time(large), fmt_ratio(large / small)])
    report.targets.append(
        Target(
            f"cold first page at {LARGE} grown turns at most {MAX_COLD_LARGE_S * 1000:g} ms",
            large <= MAX_COLD_LARGE_S,
            fmt_time(large),
        )
    )
    report.targets.append(
        ratio_target(
            f"cold first page at {LARGE} grown turns within {MAX_COLD_GROWTH:g}x of {SMALL}",
            large,
            small,
            at_most=MAX_COLD_GROWTH,
        )
    )
    report.notes.append(
        f"Sessions grown through the server: ~2 KB prompts, one write a turn, snapshots on, a "
        f"compaction every {COMPACT_EVERY} turns; kept under {CACHE}."
    )
    return report


def run(work: Path, quick: bool = False) -> Report:
    return asyncio.run(_run(work, quick))
