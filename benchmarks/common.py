"""Timing, reporting and machine facts shared by the benchmarks."""

from __future__ import annotations

import contextlib
import gc
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Target:
    """One speed target: what it says, whether it held, and the numbers behind the verdict."""

    name: str
    passed: bool
    detail: str


@dataclass
class Report:
    """What one benchmark prints: a table, its targets, and notes on how it was measured."""

    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""  # the benchmark could not finish: it counts as failed

    @property
    def passed(self) -> bool:
        return not self.error and all(t.passed for t in self.targets)

    def render(self) -> str:
        out = [f"## {self.title}", ""]
        if self.rows:
            out += _markdown_table(self.columns, self.rows)
            out.append("")
        for note in self.notes:
            out.append(f"- {note}")
        if self.notes:
            out.append("")
        for t in self.targets:
            out.append(f"{'PASS' if t.passed else 'FAIL'}  {t.name}: {t.detail}")
        if self.error:
            out.append(f"FAIL  did not finish: {self.error}")
        out.append(f"({self.seconds:.1f} s)")
        return "\n".join(out)


def _markdown_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [columns, *rows]) for i in range(len(columns))]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return [line(columns), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *(line(r) for r in rows)]


def median(samples: Sequence[float]) -> float:
    return statistics.median(samples) if samples else float("nan")


def fmt_time(seconds: float) -> str:
    """A duration with a unit that keeps three significant digits readable."""
    if seconds != seconds:  # NaN: nothing measured
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def fmt_ratio(ratio: float) -> str:
    if ratio != ratio:
        return "-"
    return f"{ratio:,.0f}x" if ratio >= 100 else f"{ratio:.2f}x"


def fmt_bytes(n: float) -> str:
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MB"
    if n >= 1 << 10:
        return f"{n / (1 << 10):.1f} KB"
    return f"{n:.0f} B"


def interleaved(
    measures: dict[str, Callable[[], float]], rounds: int, *, budget_s: float, min_rounds: int = 3
) -> dict[str, list[float]]:
    """Runs every measure once per round, alternating their order, and collects the samples.

    Each measure returns the seconds of one sample (so it can leave its set-up untimed). Rounds
    stop early once `budget_s` is spent and `min_rounds` are done, which bounds a benchmark on a
    slow or busy machine without giving up its medians.
    """
    samples: dict[str, list[float]] = {name: [] for name in measures}
    names = list(measures)
    deadline = time.monotonic() + budget_s
    for i in range(rounds):
        if i >= min_rounds and time.monotonic() > deadline:
            break
        for name in names if i % 2 == 0 else reversed(names):
            samples[name].append(measures[name]())
    return samples


def timed(fn: Callable[[], object], inner: int = 1) -> float:
    """Seconds per call of `fn`, over `inner` calls in a row (for calls too short to time alone)."""
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - start) / inner


def settle() -> None:
    """Collects garbage between phases, so one phase's leftovers are not collected in the next."""
    gc.collect()


def machine() -> dict[str, str]:
    """Facts about the machine a run measured, for the table's heading."""
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
