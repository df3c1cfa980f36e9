"""Benchmark 2: rewind latency, and the prompt right after a rewind, through the real gRPC server.

The server runs in this process (`agent_rewind.server.start`, offline scripted model, real CLI
processes) and is called over gRPC on loopback. Every round runs each measure below once, in an
order reversed every other round, so the pairs compared sit next to each other either way:

- a client start from nothing: `CreateSession` (starts a CLI process); `CloseSession` untimed;
- a client start by resume: a files `DryRun` on a hibernated session, which has to resume the
  session in a new CLI process before it can ask it; hibernating it again is untimed;
- on one live session: the one-turn prompt `say ping`; and, on the same session, `DryRun` and
  `Rewind` in conversation mode to the newest `say ping`, then at once the same prompt again
  (the live CLI process is cut in place, so that prompt should find it ready);
- a files rewind on a live session: a turn that writes a file (untimed), `DryRun` in both modes
  (the CLI previews the files), then `Rewind` in files mode (the CLI restores them);
- on one hibernated session (hibernating it is untimed): `say ping`, which resumes the session
  in a new CLI process; and a conversation `Rewind` to the newest `say ping`, then the same
  prompt, which resumes a new process at the cut.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from benchmarks.common import (
    Measure,
    Report,
    Sample,
    Samples,
    fmt_ratio,
    fmt_time,
    interleave,
    ratio_target,
    timed,
)
from benchmarks.service import BOTH, CONVERSATION, FILES, Client, serve

# A conversation-only Rewind of a live session over the cheaper client start: it must not cost
# anything like starting a process (the cut is a control request to the live one).
MAX_REWIND_SHARE = 0.10
# The prompt right after a conversation Rewind over the same prompt on the live session: the
# next prompt finds the process ready, within noise.
MAX_PROMPT_AFTER_REWIND = 1.3
TIMEOUT_S = 300.0
PING = "say ping"
PINGS = 3  # samples of each side of the live pair per round (a turn is quick and noisy)

ROWS = (
    ("client start: CreateSession (new CLI process)", "create"),
    ("client start: resume a hibernated session (files DryRun)", "resume"),
    ("Prompt, live session", "prompt live"),
    ("Prompt right after a conversation Rewind (live session)", "prompt after rewind"),
    ("Rewind, conversation only (live session)", "rewind conversation"),
    ("DryRun, conversation only (live session)", "dry run conversation"),
    ("Rewind, files only (live session)", "rewind files"),
    ("DryRun, files and conversation (live session)", "dry run both"),
    ("Prompt, hibernated session (resumes a new process)", "prompt hibernated"),
    ("Rewind, conversation only (hibernated session)", "rewind conversation hibernated"),
    ("Prompt right after that Rewind (resumes a new process at the cut)", "prompt hibernated after rewind"),
)


class _Session:
    """A session the rounds reuse, and the id of its newest `say ping` prompt."""

    def __init__(self, c: Client, session_id: str, cwd: str) -> None:
        self.c = c
        self.id = session_id
        self.cwd = cwd
        self.newest = ""

    async def ping(self) -> float:
        self.newest, seconds = await timed(self.c.prompt(self.id, PING))
        return seconds

    async def rewind_newest(self) -> float:
        """A conversation Rewind dropping the newest `say ping` turn; the seconds it took."""
        result, seconds = await timed(self.c.rewind(self.id, self.newest, CONVERSATION))
        if not result.conversation.rewound or result.conversation.messages_dropped < 2:
            raise RuntimeError(f"conversation rewind did not apply: {result}")
        return seconds


async def _session(c: Client, *prompts: str, hibernated: bool = False) -> _Session:
    created = await c.create()
    session = _Session(c, created.session_id, created.cwd)
    for text in prompts:
        session.newest = await c.prompt(session.id, text)
    if hibernated:
        await c.hibernate(session.id)
    return session


def _measures(
    c: Client, live: _Session, files: _Session, resumed: _Session, hib: _Session
) -> dict[str, Measure]:
    async def create() -> Sample:
        session, seconds = await timed(c.create())
        await c.close(session.session_id)
        return {"create": seconds}

    async def resume() -> Sample:
        answer, seconds = await timed(c.dry_run(resumed.id, resumed.newest, FILES))
        if not answer.files.can_rewind:
            raise RuntimeError(f"files dry run on a resumed session refused: {answer}")
        await c.hibernate(resumed.id)
        return {"resume": seconds}

    async def prompt_live() -> Sample:
        return {"prompt live": [await live.ping() for _ in range(PINGS)]}

    async def prompt_after_rewind() -> Sample:
        out: dict[str, list[float]] = {}
        for _ in range(PINGS):
            _, dry = await timed(c.dry_run(live.id, live.newest, CONVERSATION))
            rewind = await live.rewind_newest()
            prompt = await live.ping()  # at once: no sleep, nothing in between
            for name, seconds in (
                ("dry run conversation", dry),
                ("rewind conversation", rewind),
                ("prompt after rewind", prompt),
            ):
                out.setdefault(name, []).append(seconds)
        return out

    async def rewind_files() -> Sample:
        written = Path(files.cwd) / "f.txt"
        target = await c.prompt(files.id, "write f.txt v\nsay wrote")
        preview, dry = await timed(c.dry_run(files.id, target, BOTH))
        result, rewind = await timed(c.rewind(files.id, target, FILES))
        if not (preview.files.can_rewind and result.files.can_rewind) or _exists(written):
            raise RuntimeError(f"files rewind did not restore {written.name}: {result}")
        return {"dry run both": dry, "rewind files": rewind}

    async def prompt_hibernated() -> Sample:
        await c.hibernate(hib.id)
        return {"prompt hibernated": await hib.ping()}

    async def prompt_hibernated_after_rewind() -> Sample:
        await c.hibernate(hib.id)
        rewind = await hib.rewind_newest()
        prompt = await hib.ping()
        return {"rewind conversation hibernated": rewind, "prompt hibernated after rewind": prompt}

    # Each pair compared is adjacent, so it stays adjacent when the order is reversed.
    return {
        "create": create,
        "resume": resume,
        "prompt live": prompt_live,
        "prompt after rewind": prompt_after_rewind,
        "files": rewind_files,
        "prompt hibernated": prompt_hibernated,
        "prompt hibernated after rewind": prompt_hibernated_after_rewind,
    }


def _exists(path: Path) -> bool:
    return path.exists()


async def _run(work: Path, rounds: int) -> Samples:
    async with asyncio.timeout(TIMEOUT_S), serve(work) as c:
        live = await _session(c, "write a.txt v0\nsay made a", PING)
        files = await _session(c, "say ready")
        resumed = await _session(c, "write r.txt r\nsay made r", hibernated=True)
        hib = await _session(c, "say hello", PING, hibernated=True)
        return await interleave(_measures(c, live, files, resumed, hib), rounds)


def run(work: Path, rounds: int) -> Report:
    started = time.monotonic()
    s = asyncio.run(_run(work, rounds))
    report = Report(
        "2. Rewind latency, and the prompt right after a rewind",
        ["operation", "n", "median", "min - max", "median / client start"],
    )
    start = min(s.med("create"), s.med("resume"))
    for title, name in ROWS:
        value = s.med(name)
        report.rows.append([title, str(s.n(name)), fmt_time(value), s.spread(name), fmt_ratio(value / start)])
    report.targets = [
        ratio_target(
            "conversation-only Rewind of a live session, over the cheaper client start",
            s.med("rewind conversation"),
            start,
            at_most=MAX_REWIND_SHARE,
        ),
        ratio_target(
            "the prompt right after a conversation Rewind finds the process ready: after / live",
            s.med("prompt after rewind"),
            s.med("prompt live"),
            at_most=MAX_PROMPT_AFTER_REWIND,
        ),
    ]
    after, plain = s.med("prompt hibernated after rewind"), s.med("prompt hibernated")
    report.infos = [
        "hibernated session: the prompt right after a conversation Rewind / a plain resuming prompt: "
        f"{fmt_time(after)} / {fmt_time(plain)} = {fmt_ratio(after / plain)} (both start a CLI process)",
    ]
    report.notes = [
        f"{s.n('create')} rounds; each runs every measure once, in an order reversed every other round "
        "(the order is in benchmarks/rewind.py)",
        "last column: the median over the cheaper of the two client-start medians",
    ]
    report.seconds = time.monotonic() - started
    return report
