"""Timing, interleaving, targets, reports and machine facts shared by the benchmarks.

Every comparison goes through `interleave`: the measures compared run once per round, in an
order that reverses every other round, so a burst of load on the shared machine falls on both
sides alike. A target is a ratio of two medians from the same rounds (`ratio_target`), or a
bound on what the operating system reports (`Target` directly); never a figure typed in.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import platform
import statistics
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

# What one run of a measure took: seconds (or any quantity) by row name, one value or several. A
# measure may time several things (a rewind and the prompt right after it) and leave its set-up
# untimed.
Sample = Mapping[str, float | Sequence[float]]
Measure = Callable[[], Awaitable[Sample]]


class Samples(dict[str, list[float]]):
    """Samples by row name, in the order they were taken."""

    def add(self, sample: Sample) -> None:
        for name, value in sample.items():
            self.setdefault(name, []).extend([value] if isinstance(value, float | int) else value)

    def med(self, name: str) -> float:
        return median(self.get(name, []))

    def n(self, name: str) -> int:
        return len(self.get(name, []))

    def spread(self, name: str) -> str:
        got = self.get(name, [])
        return f"{fmt_time(min(got))} - {fmt_time(max(got))}" if got else "-"


async def interleave(
    measures: Mapping[str, Measure],
    rounds: int,
    *,
    budget_s: float = math.inf,
    min_rounds: int = 3,
    between: Callable[[], None] | None = None,
) -> Samples:
    """Runs every measure once per round, reversing their order every other round.

    Rounds stop early once `budget_s` is spent and `min_rounds` are done, which bounds a
    benchmark on a slow or busy machine without giving up its medians. `between` runs (untimed)
    before each measure, e.g. a garbage collection so one measure's garbage is not collected
    during the next one's timing.
    """
    samples = Samples()
    names = list(measures)
    deadline = time.monotonic() + budget_s
    for i in range(rounds):
        if i >= min_rounds and time.monotonic() > deadline:
            break
        for name in names if i % 2 == 0 else reversed(names):
            if between is not None:
                between()
            samples.add(await measures[name]())
    return samples


async def timed(call: Awaitable[T]) -> tuple[T, float]:
    """The result of an awaitable and the seconds it took."""
    start = time.perf_counter()
    result = await call
    return result, time.perf_counter() - start


def settle() -> None:
    """Collects garbage, so one measure's leftovers are not collected during the next one."""
    gc.collect()


@dataclass(frozen=True)
class Target:
    """One target: what it says, whether it held, and the numbers behind the verdict."""

    name: str
    passed: bool
    detail: str


def ratio_target(
    name: str,
    numerator: float,
    denominator: float,
    *,
    at_most: float | None = None,
    at_least: float | None = None,
    fmt: Callable[[float], str] | None = None,
) -> Target:
    """A target on the ratio of two medians: `numerator / denominator` within its bound(s)."""
    show = fmt or fmt_time
    ratio = numerator / denominator if denominator else math.nan
    passed = not math.isnan(ratio)
    bounds = []
    if at_most is not None:
        passed = passed and ratio <= at_most
        bounds.append(f"at most {at_most:g}x")
    if at_least is not None:
        passed = passed and ratio >= at_least
        bounds.append(f"at least {at_least:g}x")
    detail = f"{show(numerator)} / {show(denominator)} = {fmt_ratio(ratio)} ({', '.join(bounds)})"
    return Target(name, passed, detail)


@dataclass
class Report:
    """What one benchmark prints: a table, its targets, and notes on how it was measured."""

    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Figures reported side by side with the targets, for information: no verdict.
    infos: list[str] = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""  # the benchmark could not finish: it counts as failed

    @property
    def passed(self) -> bool:
        return not self.error and all(t.passed for t in self.targets)

    def render(self, level: int = 2) -> str:
        out = [f"{'#' * level} {self.title}", ""]
        if self.rows:
            out += markdown_table(self.columns, self.rows)
            out.append("")
        for note in self.notes:
            out.append(f"- {note}")
        if self.notes:
            out.append("")
        verdicts = [f"{'PASS' if t.passed else 'FAIL'}  {t.name}: {t.detail}" for t in self.targets]
        verdicts += [f"INFO  {info}" for info in self.infos]
        if self.error:
            verdicts.append(f"FAIL  did not finish: {self.error}")
        if verdicts:
            out += ["```text", *verdicts, "```", ""]
        out.append(f"({self.seconds:.1f} s)")
        return "\n".join(out)


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [columns, *rows]) for i in range(len(columns))]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return [line(columns), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *(line(r) for r in rows)]


def median(samples: Sequence[float]) -> float:
    return statistics.median(samples) if samples else math.nan


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank `q` quantile (0.99: p99); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system) a process has used, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fmt_time(seconds: float) -> str:
    """A duration with a unit that keeps three significant digits readable."""
    if math.isnan(seconds):
        return "-"
    if seconds < 0:
        return "-" + fmt_time(-seconds)
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def fmt_ratio(ratio: float) -> str:
    if math.isnan(ratio):
        return "-"
    if ratio >= 100:
        return f"{ratio:,.0f}x"
    return f"{ratio:.2f}x" if ratio >= 1 else f"{ratio:.2g}x"


def fmt_bytes(n: float) -> str:
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MB"
    if n >= 1 << 10:
        return f"{n / (1 << 10):.1f} KB"
    return f"{n:.0f} B"


def fmt_kb(kb: float) -> str:
    """Resident memory as /proc reports it (KB), in MB once it is that large."""
    return f"{kb / 1024:.0f} MB" if kb >= 1024 else f"{kb:.0f} KB"


def machine() -> dict[str, str]:
    """Facts about the machine a run measured, for the report's heading."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = ""
    with contextlib.suppress(OSError):
        load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    mem = ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = f"{int(line.split()[1]) / (1 << 20):.1f} GB"
                break
    except OSError:
        pass
    from agent_rewind.sessions.adapter import cli_version, sdk_version

    try:
        cpus = len(os.sched_getaffinity(0))  # what nproc says
    except AttributeError:
        cpus = os.cpu_count() or 0
    return {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "cpus (nproc)": str(cpus or "?"),
        "cpu model": model or platform.processor() or "?",
        "memory": mem or "?",
        "load average at start": load or "?",
        "python": platform.python_version(),
        "claude-agent-sdk / CLI": f"{sdk_version()} / {cli_version()}",
    }
