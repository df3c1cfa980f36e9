"""Benchmark 1: listing rewind points scales with the page, not the session.

Two transcripts made from one real recording (transcripts.py), of 50 and 5,000 turns, are read
side by side by:

- `TranscriptIndex`, the way the service lists points: a first refresh (cold), then the cost of
  one `refresh()` + `view().points[offset:offset + 100]` on an unchanged file, and after the CLI
  appended one more turn (the append itself is not timed);
- the SDK's `get_session_messages(session_id, limit=100, offset=...)`, which reads and parses
  the whole file on every call, however small the page.

Every page is the newest one (offset = points - 100), what a client looking at recent history asks
for. At 50 turns a page holds 50 points, at 5,000 turns 100.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from claude_agent_sdk import get_session_messages

from agent_rewind.transcript.entries import RewindPoint
from agent_rewind.transcript.index import TranscriptIndex
from benchmarks.common import (
    Report,
    Target,
    fmt_bytes,
    fmt_ratio,
    fmt_time,
    interleaved,
    median,
    settle,
    timed,
)
from benchmarks.transcripts import TurnWriter, record, write_session

PAGE = 100
MAX_PAGE_RATIO = 3.0  # warm page cost at the large size over the small one
MIN_SDK_RATIO = 100.0  # get_session_messages over a warm page, at the large size


@dataclass
class Case:
    turns: int
    session_id: str
    path: Path
    writer: TurnWriter
    index: TranscriptIndex
    sdk_messages: int = 0

    @property
    def label(self) -> str:
        return f"{self.turns:,} turns"


def newest_page(index: TranscriptIndex) -> Sequence[RewindPoint]:
    """What ListRewindPoints does for the newest page (minus the protobuf conversion)."""
    index.refresh()
    view = index.view()
    offset = max(0, len(view.points) - PAGE)
    return view.points[offset : offset + PAGE]


def sdk_page(case: Case) -> int:
    offset = max(0, case.sdk_messages - PAGE)
    return len(get_session_messages(case.session_id, limit=PAGE, offset=offset))


def _cold(case: Case) -> Callable[[], float]:
    def measure() -> float:
        index = TranscriptIndex(case.path)
        return timed(lambda: newest_page(index))

    return measure


def _warm(case: Case, inner: int) -> Callable[[], float]:
    return lambda: timed(lambda: newest_page(case.index), inner)


def _appended(case: Case) -> Callable[[], float]:
    def measure() -> float:
        with case.path.open("ab") as f:
            f.write(case.writer.next_turn())
        return timed(lambda: newest_page(case.index))

    return measure


def _sdk(case: Case) -> Callable[[], float]:
    return lambda: timed(lambda: sdk_page(case))


def run(work: Path, small: int, large: int, quick: bool = False) -> Report:
    # get_session_messages finds transcripts under $CLAUDE_CONFIG_DIR/projects/*/.
    config_dir = work / "claude"
    previous = os.environ.get("CLAUDE_CONFIG_DIR")
    os.environ["CLAUDE_CONFIG_DIR"] = str(config_dir)
    try:
        return _run(work, config_dir / "projects" / "bench", small, large, quick)
    finally:
        if previous is None:
            os.environ.pop("CLAUDE_CONFIG_DIR", None)
        else:
            os.environ["CLAUDE_CONFIG_DIR"] = previous


def _run(work: Path, projects: Path, small: int, large: int, quick: bool) -> Report:
    started = time.monotonic()
    report = Report(
        "1. Rewind points: a page costs O(page), not O(session)",
        ["measure (median)", f"{small:,} turns", f"{large:,} turns", f"{large:,} / {small:,}"],
    )
    recording = asyncio.run(record(work / "recording"))
    projects.mkdir(parents=True)

    cases: list[Case] = []
    for turns in (small, large):
        path, writer = write_session(recording, projects, turns)
        case = Case(turns, writer.session_id, path, writer, TranscriptIndex(path))
        cases.append(case)
    a, b = cases
    sizes = [c.path.stat().st_size for c in cases]
    generated = time.monotonic() - started

    # Ground truth before timing anything: both readers see every turn of both files.
    for case in cases:
        points = len(newest_page(case.index))
        total = len(case.index.view().points)
        case.sdk_messages = len(get_session_messages(case.session_id))
        if total != case.turns or points != min(PAGE, case.turns):
            raise RuntimeError(f"{case.label}: the index sees {total} turns")
        if case.sdk_messages < 2 * case.turns:
            raise RuntimeError(f"{case.label}: the SDK sees {case.sdk_messages} messages")
    per_turn = (b.sdk_messages - a.sdk_messages) / (b.turns - a.turns)

    scale = 0.4 if quick else 1.0
    results: dict[str, dict[str, float]] = {}

    def phase(name: str, make: Callable[[Case], Callable[[], float]], rounds: int, budget: float) -> None:
        settle()
        samples = interleaved(
            {c.label: make(c) for c in cases}, max(3, int(rounds * scale)), budget_s=budget * scale
        )
        results[name] = {label: median(s) for label, s in samples.items()}
        results[name + " n"] = {label: len(s) for label, s in samples.items()}

    phase("cold", _cold, rounds=5, budget=20)
    phase("warm", lambda c: _warm(c, inner=50), rounds=21, budget=10)
    phase("sdk", _sdk, rounds=5, budget=40)
    phase("appended", _appended, rounds=21, budget=10)

    def row(title: str, name: str) -> list[str]:
        x, y = results[name][a.label], results[name][b.label]
        n = results[name + " n"][b.label]
        return [f"{title} [n={n:.0f}]", fmt_time(x), fmt_time(y), fmt_ratio(y / x)]

    report.rows = [
        ["transcript size", fmt_bytes(sizes[0]), fmt_bytes(sizes[1]), fmt_ratio(sizes[1] / sizes[0])],
        [
            "visible messages (SDK)",
            f"{a.sdk_messages:,}",
            f"{b.sdk_messages:,}",
            fmt_ratio(b.sdk_messages / a.sdk_messages),
        ],
        ["points in the newest page", str(min(PAGE, a.turns)), str(min(PAGE, b.turns)), ""],
        row("index: cold (first refresh + page)", "cold"),
        row("index: warm, file unchanged (refresh + page)", "warm"),
        row("index: warm, one turn appended (refresh + page)", "appended"),
        [
            "index: warm, file unchanged, per point in the page",
            fmt_time(results["warm"][a.label] / min(PAGE, a.turns)),
            fmt_time(results["warm"][b.label] / min(PAGE, b.turns)),
            fmt_ratio(
                (results["warm"][b.label] / min(PAGE, b.turns))
                / (results["warm"][a.label] / min(PAGE, a.turns))
            ),
        ],
        row("SDK: get_session_messages (page of 100)", "sdk"),
        [
            "SDK / index warm, unchanged",
            fmt_ratio(results["sdk"][a.label] / results["warm"][a.label]),
            fmt_ratio(results["sdk"][b.label] / results["warm"][b.label]),
            "",
        ],
        [
            "SDK / index warm, appended",
            fmt_ratio(results["sdk"][a.label] / results["appended"][a.label]),
            fmt_ratio(results["sdk"][b.label] / results["appended"][b.label]),
            "",
        ],
    ]
    for name, what in (("warm", "file unchanged"), ("appended", "one turn appended")):
        ratio = results[name][b.label] / results[name][a.label]
        report.targets.append(
            Target(
                f"warm page, {what}: {b.label} within {MAX_PAGE_RATIO:g}x of {a.label}",
                ratio <= MAX_PAGE_RATIO,
                f"{fmt_time(results[name][b.label])} / {fmt_time(results[name][a.label])} = {ratio:.2f}x",
            )
        )
    for name, what in (("warm", "file unchanged"), ("appended", "one turn appended")):
        ratio = results["sdk"][b.label] / results[name][b.label]
        report.targets.append(
            Target(
                f"warm page, {what}, at least {MIN_SDK_RATIO:g}x faster than get_session_messages at {b.label}",
                ratio >= MIN_SDK_RATIO,
                f"{fmt_time(results['sdk'][b.label])} / {fmt_time(results[name][b.label])} = {ratio:,.0f}x",
            )
        )
    report.notes = [
        f"transcripts: the first turn of a session recorded through the real server (CLI against the "
        f"scripted model), then copies of its {len(recording.turns)} other turns with fresh ids, "
        f"chained by parentUuid; {per_turn:.1f} visible messages per turn; generated in {generated:.1f} s",
        "each row interleaves the two sizes round by round; a page is the newest 100 points "
        "(offset = points - 100), the SDK's the newest 100 messages",
        "warm, unchanged: median of rounds of 50 calls each; appended: one turn written (untimed) "
        f"before each timed call, so the files end at {a.writer.turns:,} and {b.writer.turns:,} turns",
    ]
    report.seconds = time.monotonic() - started
    return report
