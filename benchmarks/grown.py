"""Benchmark 12: the cold first page of sessions grown as a user grows them.

Benchmark 1 builds its long session from copies of one recorded turn, registered in the ledger as
if the server had run them: no snapshot records, no points index the server wrote turn by turn,
no compaction. The sessions here are grown through the real server, turn by turn: each prompt a
couple of KB of prose and one tool call (a `write` of one of 20 files), workspace snapshots on
(two snapshot records a turn), and every COMPACT_EVERY turns a compaction (the scripted model's
`context`, which makes the CLI compact before the next prompt). They are grown once, to SMALL and
LARGE turns, and kept under CACHE (growing LARGE turns takes minutes); each run serves them
where they were grown (a session's workspace must lie under its server's workspace roots).

Measured on them, interleaved round by round, what benchmark 1 measures on its copies:

- cold: a server started on the copy (untimed), one unrelated call (`ListSessions` of one
  session, untimed), then the first `ListRewindPoints` page of PAGE points (the oldest, no
  token), timed as a client sees it; then, on the same server, the same page again (warm, the
  mean of WARM_CALLS calls); the server stopped (untimed);
- the SDK: `get_session_messages` of the newest PAGE messages of the same transcript.

Targets: the cold first page at LARGE turns at most MAX_COLD_LARGE_S, and at most
MAX_COLD_GROWTH times the SMALL figure (the page costs what it holds, not what the session does);
the warm page at LARGE within MAX_WARM_GROWTH of SMALL; and the cold first page at LARGE no slower
than the SDK reading the newest page of the same session.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path

from claude_agent_sdk import get_session_messages

from agent_rewind.api.v1 import rewind_service_pb2, session_service_pb2
from benchmarks.common import Measure, Report, Samples, Target, fmt_ratio, fmt_time, interleave, ratio_target
from benchmarks.points import claude_config_dir
from benchmarks.service import bench_config, serve

SMALL, LARGE = 50, 5000
PAGE = 50
COMPACT_EVERY = 250
MAX_COLD_LARGE_S = 0.020
MAX_COLD_GROWTH = 1.5
MAX_WARM_GROWTH = 1.5
MAX_COLD_OVER_SDK = 1.0
WARM_CALLS = 10
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


async def _pages(state: Path, session_id: str) -> dict[str, float]:
    """The first page after a start, and then the same page warm: seconds each."""
    async with serve(state) as c:
        await c.sessions.ListSessions(session_service_pb2.ListSessionsRequest(page_size=1))
        request = rewind_service_pb2.ListRewindPointsRequest(session_id=session_id, page_size=PAGE)
        started = time.perf_counter()
        page = await c.rewinds.ListRewindPoints(request)
        cold = time.perf_counter() - started
        if len(page.points) != PAGE:
            raise RuntimeError(f"the first page held {len(page.points)} points, not {PAGE}")
        started = time.perf_counter()
        for _ in range(WARM_CALLS):
            await c.rewinds.ListRewindPoints(request)
        warm = (time.perf_counter() - started) / WARM_CALLS
    return {"cold": cold, "warm": warm}


async def _cwd(state: Path, session_id: str) -> str:
    async with serve(state) as c:
        session = await c.sessions.GetSession(session_service_pb2.GetSessionRequest(session_id=session_id))
    return str(session.cwd)


def _sdk_page(state: Path, session_id: str, cwd: str, total: int) -> float:
    """get_session_messages of the newest PAGE messages (`total` in all), timed."""
    with claude_config_dir(bench_config(state).claude_config_dir):
        started = time.perf_counter()
        got = get_session_messages(session_id, cwd, limit=PAGE, offset=max(0, total - PAGE))
        seconds = time.perf_counter() - started
    if len(got) != min(PAGE, total):
        raise RuntimeError(f"get_session_messages returned {len(got)} messages")
    return seconds


async def _run(work: Path, quick: bool) -> Report:
    # Served where they were grown (a session's workspace must lie under its server's roots):
    # a start and a page read change none of what is measured.
    copies = {size: await _grow(size) for size in (SMALL, LARGE)}
    cwds = {size: await _cwd(*copies[size]) for size in copies}
    totals = {}
    for size, (state, sid) in copies.items():
        with claude_config_dir(bench_config(state).claude_config_dir):
            totals[size] = len(get_session_messages(sid, cwds[size]))
        if totals[size] < PAGE:
            raise RuntimeError(f"{size} turns: the SDK sees {totals[size]} messages")

    def measure(size: int) -> Measure:
        async def sample() -> dict[str, float]:
            state, sid = copies[size]
            pages = await _pages(state, sid)
            return {f"{kind} {size}": seconds for kind, seconds in pages.items()}

        return sample

    def sdk(size: int) -> Measure:
        async def sample() -> dict[str, float]:
            state, sid = copies[size]
            return {f"sdk {size}": _sdk_page(state, sid, cwds[size], totals[size])}

        return sample

    samples: Samples = await interleave(
        {
            f"pages {SMALL}": measure(SMALL),
            f"pages {LARGE}": measure(LARGE),
            f"sdk {SMALL}": sdk(SMALL),
            f"sdk {LARGE}": sdk(LARGE),
        },
        3 if quick else ROUNDS,
    )
    med = {
        f"{kind} {size}": samples.med(f"{kind} {size}") for kind in ("cold", "warm", "sdk") for size in copies
    }
    report = Report(
        "12. Pages of sessions grown turn by turn",
        [
            "turns",
            "first ListRewindPoints page after a start",
            "vs 50 turns",
            "warm page",
            "vs 50 turns",
            "SDK get_session_messages (newest 50)",
        ],
    )
    for size in (SMALL, LARGE):
        report.rows.append(
            [
                f"{size:,}",
                fmt_time(med[f"cold {size}"]),
                fmt_ratio(med[f"cold {size}"] / med[f"cold {SMALL}"]),
                fmt_time(med[f"warm {size}"]),
                fmt_ratio(med[f"warm {size}"] / med[f"warm {SMALL}"]),
                fmt_time(med[f"sdk {size}"]),
            ]
        )
    large = med[f"cold {LARGE}"]
    report.targets.append(
        Target(
            f"cold first page at {LARGE:,} grown turns at most {MAX_COLD_LARGE_S * 1000:g} ms",
            large <= MAX_COLD_LARGE_S,
            fmt_time(large),
        )
    )
    report.targets.append(
        ratio_target(
            f"cold first page at {LARGE:,} grown turns within {MAX_COLD_GROWTH:g}x of {SMALL}",
            large,
            med[f"cold {SMALL}"],
            at_most=MAX_COLD_GROWTH,
        )
    )
    report.targets.append(
        ratio_target(
            f"warm page at {LARGE:,} grown turns within {MAX_WARM_GROWTH:g}x of {SMALL}",
            med[f"warm {LARGE}"],
            med[f"warm {SMALL}"],
            at_most=MAX_WARM_GROWTH,
        )
    )
    report.targets.append(
        ratio_target(
            f"cold first page at {LARGE:,} grown turns no slower than the SDK's newest page there",
            large,
            med[f"sdk {LARGE}"],
            at_most=MAX_COLD_OVER_SDK,
        )
    )
    report.notes.append(
        f"Sessions grown through the server: ~2 KB prompts, one write a turn, snapshots on, a "
        f"compaction every {COMPACT_EVERY} turns; kept under {CACHE}. The SDK reads the same "
        f"transcripts: {totals[SMALL]:,} and {totals[LARGE]:,} messages, the conversation since the "
        f"newest compaction (the service's points span every turn)."
    )
    return report


def run(work: Path, quick: bool = False) -> Report:
    return asyncio.run(_run(work, quick))
