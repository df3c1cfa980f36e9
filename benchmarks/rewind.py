"""Benchmark 2 (rewind latency) and 3 (memory per session), through the real gRPC server.

The server runs in this process (`agent_rewind.server.start`, offline scripted model, real CLI
processes) and is called over gRPC on loopback. Each round does, in turn:

- a client start from nothing: `CreateSession` (starts a CLI process), then `CloseSession`
  (untimed; it returns once the process has exited);
- a client start by resume: a files `DryRun` on a hibernated session, which has to resume the
  session in a new CLI process before it can ask it (the dry run itself takes about 1 ms), then
  hibernating it again (untimed);
- a conversation rewind: a new turn (untimed), then `DryRun` and `Rewind` in conversation mode to
  that turn's prompt; the service records the cut and lets the CLI process go without waiting
  for it, and the next prompt resumes at the cut. The old process is waited for (untimed)
  before going on, so it does not compete with the next measurement;
- a files rewind on a live session: a turn that writes a file (untimed), `DryRun` in both modes
  (the CLI previews the files), then `Rewind` in files mode (the CLI restores them).

So all the medians come from the same rounds, on the same machine load.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from benchmarks.common import Report, Target, fmt_time, median
from benchmarks.service import BOTH, CONVERSATION, FILES, Client, descendants, rss_kb, serve, wait_gone

MAX_REWIND_SHARE = 0.10  # a conversation rewind over the cheapest client start
TIMEOUT_S = 300.0
SDK_FACTS_RSS_MB = 230  # SDK-FACTS.md, "Costs"


class _Samples(dict[str, list[float]]):
    def add(self, name: str, seconds: float) -> None:
        self.setdefault(name, []).append(seconds)

    def med(self, name: str) -> float:
        return median(self.get(name, []))


async def _rounds(c: Client, rounds: int, samples: _Samples) -> tuple[Report, Report]:
    conv = await c.create()
    await c.prompt(conv.session_id, "write a.txt v0\nsay made a")
    await c.prompt(conv.session_id, "edit a.txt v0 => v1\nsay edited a")
    files = await c.create()
    await c.prompt(files.session_id, "say ready")
    resumed = await c.create()
    first = await c.prompt(resumed.session_id, "write r.txt r\nsay made r")
    await c.hibernate(resumed.session_id)

    for i in range(rounds):
        # A client start from nothing.
        t0 = time.perf_counter()
        fresh = await c.create()
        samples.add("create", time.perf_counter() - t0)
        await c.close(fresh.session_id)

        # A client start by resume: the files dry run needs a live process.
        t0 = time.perf_counter()
        answer = await c.dry_run(resumed.session_id, first, FILES)
        samples.add("resume", time.perf_counter() - t0)
        if not answer.files.can_rewind:
            raise RuntimeError(f"files dry run on a resumed session refused: {answer}")
        await c.hibernate(resumed.session_id)

        # A conversation rewind of the turn just made.
        t0 = time.perf_counter()
        target = await c.prompt(conv.session_id, f"say round {i}")
        if i > 0:  # the previous round's rewind replaced the process: this prompt uses the new one
            samples.add("prompt after rewind", time.perf_counter() - t0)
        pid = c.pid(conv.session_id)
        t0 = time.perf_counter()
        await c.dry_run(conv.session_id, target, CONVERSATION)
        samples.add("dry run conversation", time.perf_counter() - t0)
        t0 = time.perf_counter()
        result = await c.rewind(conv.session_id, target, CONVERSATION)
        samples.add("rewind conversation", time.perf_counter() - t0)
        if not result.conversation.rewound or result.conversation.messages_dropped < 2:
            raise RuntimeError(f"conversation rewind did not apply: {result}")
        if c.pid(conv.session_id) == pid:
            raise RuntimeError("the session kept its CLI process after a conversation rewind")
        await wait_gone(pid)

        # A files rewind on a live session.
        written = Path(files.cwd) / f"f{i}.txt"
        t0 = time.perf_counter()
        target = await c.prompt(files.session_id, f"write f{i}.txt v{i}\nsay wrote")
        samples.add("prompt live", time.perf_counter() - t0)
        t0 = time.perf_counter()
        preview = await c.dry_run(files.session_id, target, BOTH)
        samples.add("dry run both", time.perf_counter() - t0)
        t0 = time.perf_counter()
        result = await c.rewind(files.session_id, target, FILES)
        samples.add("rewind files", time.perf_counter() - t0)
        if not (preview.files.can_rewind and result.files.can_rewind) or written.exists():
            raise RuntimeError(f"files rewind did not restore {written.name}: {result}")

    latency = _latency_report(samples, rounds)
    memory = await _memory_report(c, files.session_id, resumed.session_id, conv.session_id)
    return latency, memory


def _latency_report(s: _Samples, rounds: int) -> Report:
    report = Report(
        "2. Rewind latency through the gRPC server",
        ["operation", "n", "median", "min - max", "median / client start"],
    )
    start = min(s.med("create"), s.med("resume"))
    rows = [
        ("client start: CreateSession (new CLI process)", "create"),
        ("client start: resume a hibernated session (files DryRun)", "resume"),
        ("Prompt, live session (one scripted turn)", "prompt live"),
        ("Prompt after a conversation rewind (new process resumed at the cut)", "prompt after rewind"),
        ("Rewind, conversation only", "rewind conversation"),
        ("DryRun, conversation only", "dry run conversation"),
        ("Rewind, files only (live session)", "rewind files"),
        ("DryRun, files and conversation (live session)", "dry run both"),
    ]
    for title, name in rows:
        got = s.get(name, [])
        value = s.med(name)
        spread = f"{fmt_time(min(got))} - {fmt_time(max(got))}" if got else "-"
        report.rows.append([title, str(len(got)), fmt_time(value), spread, f"{value / start:.1%}"])
    share = s.med("rewind conversation") / start
    report.targets.append(
        Target(
            f"conversation-only Rewind under {MAX_REWIND_SHARE:.0%} of a client start",
            share < MAX_REWIND_SHARE,
            f"{fmt_time(s.med('rewind conversation'))} / {fmt_time(start)} = {share:.1%} "
            f"({1 / share:.0f}x faster than the cheaper start)",
        )
    )
    report.notes = [
        f"{rounds} rounds; each round measures every row once (the order is in benchmarks/rewind.py)",
        "last column: the median over the cheaper of the two client-start medians",
        "the conversation rewind returns at once; a new CLI process resumes at the cut in the "
        "background, so the next Prompt rarely waits for it",
    ]
    return report


async def _memory_report(c: Client, live: str, hibernated: str, rewound: str) -> Report:
    report = Report(
        "3. Memory per session (CLI process resident set)",
        ["session", "state", "CLI processes", "VmRSS", "VmHWM (peak)"],
    )
    started = time.monotonic()
    await asyncio.sleep(0.5)  # let the live process settle after its last turn

    def row(title: str, session_id: str) -> int:
        pid = c.pid(session_id)
        state = c.running.registry.get(session_id).state
        pids = [pid, *descendants(pid)] if pid is not None else []
        rss = sum(rss_kb(p)[0] for p in pids)
        hwm = sum(rss_kb(p)[1] for p in pids)
        report.rows.append([title, state, str(len(pids)), f"{rss / 1024:.0f} MB", f"{hwm / 1024:.0f} MB"])
        return rss

    live_rss = row("live, idle after its turns", live)
    hibernated_rss = row("hibernated (idle timeout reached)", hibernated)
    rewound_rss = row("rewound (conversation): a new process resumed at the cut", rewound)
    report.targets.append(
        Target(
            "a hibernated session holds no CLI process",
            hibernated_rss == 0 and c.pid(hibernated) is None,
            f"{hibernated_rss / 1024:.0f} MB (a live one: {live_rss / 1024:.0f} MB)",
        )
    )
    report.targets.append(
        Target(
            "a conversation rewind leaves one CLI process's memory, not two (at most 1.5x a live session)",
            0 < rewound_rss <= 1.5 * live_rss,
            f"{rewound_rss / 1024:.0f} MB (a live one: {live_rss / 1024:.0f} MB)",
        )
    )
    report.notes = [
        f"SDK-FACTS.md measured about {SDK_FACTS_RSS_MB} MB per live CLI process; "
        "VmRSS and VmHWM from /proc/<pid>/status, summed over the process and its children",
    ]
    report.seconds = time.monotonic() - started
    return report


async def _run(work: Path, rounds: int) -> list[Report]:
    samples = _Samples()
    async with asyncio.timeout(TIMEOUT_S), serve(work) as client:
        latency, memory = await _rounds(client, rounds, samples)
    return [latency, memory]


def run(work: Path, rounds: int) -> list[Report]:
    started = time.monotonic()
    reports = asyncio.run(_run(work, rounds))
    latency, memory = reports
    latency.seconds = time.monotonic() - started - memory.seconds
    return reports
