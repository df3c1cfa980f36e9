"""Benchmark 1: a page of rewind points costs O(page), not O(session).

`ListRewindPoints` as a client sees it (the real gRPC server in this process, called over
loopback) against the SDK's `get_session_messages`, on sessions of 50 and 5,000 turns made from
one real recording (transcripts.py) and registered in the server's ledger as if the server had
run them. Both sides ask for the same page size at both sizes: the newest 50 points (reached with
the server's own page tokens), the newest 50 messages.

Two phases, each interleaved round by round (order reversed every other round):

- cold: the first `ListRewindPoints` of a session after a server start (a fresh server per
  sample; its start and stop are not timed), and `get_session_messages`, at both sizes;
- warm: `ListRewindPoints` on an unchanged file, and right after one more turn was appended to
  the file (the append is not timed; separate copies of the sessions, so the unchanged files stay
  as they are), and `get_session_messages`, at both sizes.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from claude_agent_sdk import get_session_messages

from agent_rewind.rpc.requests import MAX_PAGE_SIZE
from benchmarks.common import (
    Measure,
    Report,
    Sample,
    Samples,
    Target,
    fmt_bytes,
    fmt_ratio,
    fmt_time,
    interleave,
    ratio_target,
    settle,
    timed,
)
from benchmarks.service import Client, bench_config, register_session, serve
from benchmarks.transcripts import Recording, TurnWriter, record, write_session

PAGE = 50  # points (and SDK messages) per page, at both sizes
# (a) a warm page costs O(page): the same page at 5,000 turns as at 50, within noise.
MAX_PAGE_RATIO = 1.5
# (b) get_session_messages grows with the session: a sanity check that the sizes differ enough
# for the comparison to mean something.
MIN_SDK_GROWTH = 10.0
# (c) a warm page at 5,000 turns is faster than get_session_messages at 50 turns.
MAX_WARM_OVER_SMALL_SDK = 1.0
# (d) the cold first page at 5,000 turns is no slower than one get_session_messages there.
MAX_COLD_RATIO = 1.5
# (e) the cold first page comes from the ledger's points index (sessions/points.py), not a read of
# the transcript: at 5,000 turns at most 50 ms, and at most 3x the 50-turn figure.
MAX_COLD_LARGE_S = 0.050
MAX_COLD_GROWTH = 3.0
TIMEOUT_S = 300.0  # the whole benchmark, recording included

WARM_CALLS = 10  # ListRewindPoints calls per warm sample, file unchanged (one call is ~1 ms)
APPENDS = 3  # appended turns (one before each timed call) per appended sample


@dataclass
class Case:
    """One registered session and what the benchmark knows about it."""

    turns: int
    session_id: str
    cwd: str
    path: Path
    writer: TurnWriter
    page: int
    token: str = ""  # the page token of the newest `page` points ("" when they start at 0)
    sdk_messages: int = 0

    @property
    def label(self) -> str:
        return f"{self.turns:,} turns"

    def append_turn(self) -> None:
        with self.path.open("ab") as f:
            f.write(self.writer.next_turn())

    def sdk_page(self) -> int:
        offset = max(0, self.sdk_messages - self.page)
        return len(get_session_messages(self.session_id, self.cwd, limit=self.page, offset=offset))


async def newest_token(c: Client, case: Case) -> str:
    """Walks the pages the way a client does, to the token of the newest `page` points."""
    token, start = "", 0
    while start < case.turns - case.page:
        size = min(MAX_PAGE_SIZE, case.turns - case.page - start)
        response = await c.points(case.session_id, size, token)
        token, start = response.next_page_token, start + size
    return token


async def newest_page(c: Client, case: Case) -> float:
    """One timed ListRewindPoints of the newest page; checks it is that page, whole."""
    response, seconds = await timed(c.points(case.session_id, case.page, case.token))
    if len(response.points) != case.page or response.next_page_token:
        raise RuntimeError(
            f"{case.label}: expected the newest {case.page} points, got {len(response.points)}"
            f" (next page token {'set' if response.next_page_token else 'empty'})"
        )
    return seconds


async def advance(c: Client, case: Case) -> None:
    """Moves the token one point on (untimed), for a file about to get one more turn."""
    response = await c.points(case.session_id, 1, case.token)
    case.token = response.next_page_token
    case.turns += 1


def _cold(state: Path, case: Case) -> Measure:
    async def measure() -> Sample:
        async with serve(state) as c:
            return {f"cold {case.label}": await newest_page(c, case)}

    return measure


def _sdk(case: Case, phase: str) -> Measure:
    async def measure() -> Sample:
        start = time.perf_counter()
        got = case.sdk_page()
        seconds = time.perf_counter() - start
        if got != min(case.page, case.sdk_messages):
            raise RuntimeError(f"{case.label}: get_session_messages returned {got} messages")
        return {f"sdk {phase} {case.label}": seconds}

    return measure


def _warm(c: Client, case: Case) -> Measure:
    async def measure() -> Sample:
        total = 0.0
        for _ in range(WARM_CALLS):
            total += await newest_page(c, case)
        return {f"warm {case.label}": total / WARM_CALLS}

    return measure


def _appended(c: Client, case: Case, label: str) -> Measure:
    async def measure() -> Sample:
        total = 0.0
        for _ in range(APPENDS):
            await advance(c, case)
            case.append_turn()
            total += await newest_page(c, case)
        return {f"appended {label}": total / APPENDS}

    return measure


@contextmanager
def claude_config_dir(path: Path) -> Iterator[None]:
    """get_session_messages finds transcripts under $CLAUDE_CONFIG_DIR/projects/."""
    previous = os.environ.get("CLAUDE_CONFIG_DIR")
    os.environ["CLAUDE_CONFIG_DIR"] = str(path)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("CLAUDE_CONFIG_DIR", None)
        else:
            os.environ["CLAUDE_CONFIG_DIR"] = previous


async def _record(work: Path) -> Recording:
    async with asyncio.timeout(TIMEOUT_S):
        return await record(work)


def _make_cases(state: Path, recording_dir: Path, sizes: tuple[int, ...], page: int) -> list[Case]:
    recording = asyncio.run(_record(recording_dir))
    cases = []
    for turns in sizes:
        session_id = str(uuid.uuid4())
        cwd, path = register_session(state, session_id)
        writer = write_session(recording, path, session_id, turns)
        cases.append(Case(turns, session_id, cwd, path, writer, page))
    return cases


def run(work: Path, small: int, large: int, quick: bool = False) -> Report:
    started = time.monotonic()
    state = work / "state"
    page = min(PAGE, small)
    # The sessions compared, and copies of them that get turns appended during the warm phase.
    cases = _make_cases(state, work / "recording", (small, large, small, large), page)
    generated = time.monotonic() - started
    with claude_config_dir(bench_config(state).claude_config_dir):
        report = asyncio.run(_run(state, cases, quick, TIMEOUT_S - generated))
    report.notes.append(
        f"transcripts: the first turn of a session recorded through the real server (CLI against the "
        f"scripted model), then copies of its {len(cases[0].writer.recording.turns)} other turns with "
        f"fresh ids, chained by parentUuid; recorded and generated in {generated:.1f} s"
    )
    report.seconds = time.monotonic() - started
    return report


async def _run(state: Path, cases: list[Case], quick: bool, limit_s: float) -> Report:
    async with asyncio.timeout(limit_s):
        return await _phases(state, cases, quick)


async def _phases(state: Path, cases: list[Case], quick: bool) -> Report:
    a, b, a_appended, b_appended = cases
    # Ground truth before timing anything: both readers see every turn, the pages are whole.
    async with serve(state) as c:
        for case in cases:
            case.token = await newest_token(c, case)
            await newest_page(c, case)
            case.sdk_messages = len(get_session_messages(case.session_id, case.cwd))
            if case.sdk_messages < 2 * case.turns:
                raise RuntimeError(f"{case.label}: the SDK sees {case.sdk_messages} messages")

    settle()
    cold = await interleave(
        {
            "cold small": _cold(state, a),
            "cold large": _cold(state, b),
            "sdk small": _sdk(a, "cold"),
            "sdk large": _sdk(b, "cold"),
        },
        rounds=3 if quick else 5,
        budget_s=60,
        between=settle,
    )
    settle()
    async with serve(state) as c:
        for case in cases:  # the first call of each session is the cold one: not part of this phase
            await newest_page(c, case)
        warm = await interleave(
            {
                "warm small": _warm(c, a),
                "warm large": _warm(c, b),
                "appended small": _appended(c, a_appended, a.label),
                "appended large": _appended(c, b_appended, b.label),
                "sdk small": _sdk(a, "warm"),
                "sdk large": _sdk(b, "warm"),
            },
            rounds=4 if quick else 11,
            budget_s=90,
            between=settle,
        )
    return _report(cases, cold, warm)


def _report(cases: list[Case], cold: Samples, warm: Samples) -> Report:
    a, b, a_appended, b_appended = cases
    report = Report(
        "1. Rewind points: a page costs O(page), not O(session)",
        ["measure (median)", a.label, b.label, f"{b.turns:,} / {a.turns:,}"],
    )
    sizes = [a.path.stat().st_size, b.path.stat().st_size]

    def pair(title: str, samples: Samples, name: str) -> list[str]:
        x, y = samples.med(f"{name} {a.label}"), samples.med(f"{name} {b.label}")
        n = samples.n(f"{name} {b.label}")
        return [f"{title} [n={n}]", fmt_time(x), fmt_time(y), fmt_ratio(y / x)]

    def over(title: str, num: tuple[Samples, str], den: tuple[Samples, str]) -> list[str]:
        x = num[0].med(f"{num[1]} {a.label}") / den[0].med(f"{den[1]} {a.label}")
        y = num[0].med(f"{num[1]} {b.label}") / den[0].med(f"{den[1]} {b.label}")
        return [title, fmt_ratio(x), fmt_ratio(y), ""]

    report.rows = [
        ["transcript size", fmt_bytes(sizes[0]), fmt_bytes(sizes[1]), fmt_ratio(sizes[1] / sizes[0])],
        [
            "visible messages (SDK)",
            f"{a.sdk_messages:,}",
            f"{b.sdk_messages:,}",
            fmt_ratio(b.sdk_messages / a.sdk_messages),
        ],
        ["rewind points (ListRewindPoints)", f"{a.turns:,}", f"{b.turns:,}", fmt_ratio(b.turns / a.turns)],
        ["page asked (the newest points / messages)", str(a.page), str(b.page), ""],
        pair("cold: ListRewindPoints, first call after a server start", cold, "cold"),
        pair("cold rounds: get_session_messages", cold, "sdk cold"),
        over("cold ListRewindPoints / get_session_messages", (cold, "cold"), (cold, "sdk cold")),
        pair(f"warm: ListRewindPoints, file unchanged (mean of {WARM_CALLS} calls)", warm, "warm"),
        pair(
            f"warm: ListRewindPoints, one turn appended before each call ({APPENDS} calls)", warm, "appended"
        ),
        pair("warm rounds: get_session_messages", warm, "sdk warm"),
        over("get_session_messages / warm ListRewindPoints, unchanged", (warm, "sdk warm"), (warm, "warm")),
    ]
    warm_a, warm_b = warm.med(f"warm {a.label}"), warm.med(f"warm {b.label}")
    app_a, app_b = warm.med(f"appended {a.label}"), warm.med(f"appended {b.label}")
    sdk_a, sdk_b = warm.med(f"sdk warm {a.label}"), warm.med(f"sdk warm {b.label}")
    report.targets = [
        ratio_target(
            f"(a) warm page, file unchanged, costs O(page): {b.label} / {a.label}",
            warm_b,
            warm_a,
            at_most=MAX_PAGE_RATIO,
        ),
        ratio_target(
            f"(a) warm page, one turn appended, costs O(page): {b.label} / {a.label}",
            app_b,
            app_a,
            at_most=MAX_PAGE_RATIO,
        ),
        ratio_target(
            f"(b) get_session_messages grows with the session: {b.label} / {a.label}",
            sdk_b,
            sdk_a,
            at_least=MIN_SDK_GROWTH,
        ),
        ratio_target(
            f"(c) warm page at {b.label}, file unchanged, faster than get_session_messages at {a.label}",
            warm_b,
            sdk_a,
            at_most=MAX_WARM_OVER_SMALL_SDK,
        ),
        ratio_target(
            f"(c) warm page at {b.label}, one turn appended, faster than get_session_messages at {a.label}",
            app_b,
            sdk_a,
            at_most=MAX_WARM_OVER_SMALL_SDK,
        ),
        ratio_target(
            f"(d) cold first page at {b.label} within {MAX_COLD_RATIO:g}x of one get_session_messages there",
            cold.med(f"cold {b.label}"),
            cold.med(f"sdk cold {b.label}"),
            at_most=MAX_COLD_RATIO,
        ),
        Target(
            f"(e) cold first page at {b.label} at most {MAX_COLD_LARGE_S * 1000:g} ms (the points index)",
            cold.med(f"cold {b.label}") <= MAX_COLD_LARGE_S,
            fmt_time(cold.med(f"cold {b.label}")),
        ),
        ratio_target(
            f"(e) cold first page at {b.label} / at {a.label}",
            cold.med(f"cold {b.label}"),
            cold.med(f"cold {a.label}"),
            at_most=MAX_COLD_GROWTH,
        ),
    ]
    report.notes = [
        "the sessions' points indexes are made by the untimed first server start (as the server that "
        "ran the turns would have made them); every cold sample then reads the index, checks the "
        "transcript's size and the bytes before what the index covers, and reads no transcript",
        "each phase interleaves its measures round by round, in an order reversed every other round; "
        "a garbage collection (untimed) precedes every measure",
        f"cold: a fresh server per sample, its start and stop untimed; warm: one server, "
        f"each session read once before the phase; the appended copies end at {a_appended.turns:,} "
        f"and {b_appended.turns:,} turns",
        "get_session_messages(session_id, cwd, limit=page, offset=messages - page): the newest page",
    ]
    return report
