"""Benchmark 11: what the storage limits (issue 40, item 2) cost a prompt, through the real gRPC
server.

Two servers in this process side by side, one with `--max-session-storage` and
`--max-principal-storage` both at 1 TiB (on, never reached) and one with both 0 (off). Each has one
live session without workspace snapshots (as overheads row 2) whose workspace holds
WORKSPACE_FILES files in WORKSPACE_DIRS directories, written before its first turn. Both servers
measure the session in a thread after each turn (`storage.usage.UsageBook.changed`); only the one
with limits on has its prompts wait for a measurement under way, then compare the session's figure
and its principal's sum (`UsageBook.admit`). Every round, on each, in an order reversed every
other round, a garbage collection before each: PINGS one-turn prompts (`say ping`), each sent as
soon as the last one's stream ended, so most find the last turn's measurement under way; timed
to the result event, and to the stream's end. Every prompt is checked to have been admitted and
run: its stream holds its prompt and a result that is no error, and it is a rewind point of the
session after the rounds. Target: on / off at most 1.05x (the issue's "costs a prompt nothing
measurable").

For information, untimed, after the rounds: one `storage.usage.measure` of the session's places
(the walk alone, as the server's thread runs it), and PROBES more prompts per side with the
servers' `UsageBook.admit` and `UsageBook.measure` observed: how many found a measurement under
way, how long `admit` took with and without one, and how long a measurement took (the walk
and its ledger write).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_rewind.api.v1 import session_service_pb2
from agent_rewind.rpc.requests import MAX_PAGE_SIZE
from agent_rewind.storage.usage import UsageBook, measure
from benchmarks.common import (
    Measure,
    Report,
    Sample,
    Samples,
    fmt_bytes,
    fmt_ratio,
    fmt_time,
    interleave,
    median,
    ratio_target,
    settle,
)
from benchmarks.service import Client, serve

MAX_RATIO = 1.05  # limits on / off, a prompt's round trip (issue 40, item 2)
LIMIT = 1 << 40  # both limits on the "on" server: 1 TiB, never reached
PING = "say ping"
PINGS = 5  # prompts per side per round, back to back (a turn is short and noisy)
WORKSPACE_FILES = 400  # in each session's workspace ...
WORKSPACE_DIRS = 20  # ... spread over this many directories (4 packages of 5 modules' folders)
FILE_BYTES = (200, 16_000)  # each file's size, uniform in this range (a seeded draw)
PROBES = 20  # prompts per side of the untimed look at what a prompt waits for
WALKS = 20  # untimed walks of the workspace, for the measurement's own time
SIDES = ("on", "off")


def run(work: Path, *, quick: bool = False) -> Report:
    return asyncio.run(_run(work, quick))


@dataclass
class Side:
    """A server, its live session, and what the rounds saw of it."""

    c: Client
    session_id: str
    cwd: Path
    written: int  # bytes of the files written into its workspace
    prompts: list[str] = field(default_factory=list)  # every timed prompt's id, in order


@dataclass
class Observed:
    """What the untimed probes saw of one server's UsageBook."""

    # Seconds each admit took, as it found the session: a measurement under way, or none.
    busy: list[float] = field(default_factory=list)
    idle: list[float] = field(default_factory=list)
    measures: list[float] = field(default_factory=list)  # seconds each measurement took, ledger write too


async def _run(work: Path, quick: bool) -> Report:
    started = time.monotonic()
    async with (
        serve(work / "on", max_session_storage=LIMIT, max_principal_storage=LIMIT) as on,
        serve(work / "off") as off,
    ):
        for name, c, limit in (("on", on, LIMIT), ("off", off, 0)):
            config = c.running.config
            if (config.max_session_storage, config.max_principal_storage) != (limit, limit):
                raise RuntimeError(f"the {name} server's limits are not {limit}")
        sides = {"on": await _side(on), "off": await _side(off)}
        samples = await interleave(
            {f"prompt {name}": _pings(sides[name], name) for name in SIDES},
            3 if quick else 15,
            budget_s=30 if quick else 120,
            between=settle,
        )
        for name in SIDES:
            await _check_ran(sides[name])
        walks = _walks(sides["on"], 3 if quick else WALKS)
        observed = {name: await _probe(sides[name], 5 if quick else PROBES) for name in SIDES}
        storage = {name: await _storage(sides[name]) for name in SIDES}
    report = _report(samples, sides, walks, observed, storage)
    report.seconds = time.monotonic() - started
    return report


async def _side(c: Client) -> Side:
    """A session whose workspace holds the files, then one turn: measured after it, as every
    turn's session is."""
    created = await c.create()
    cwd = Path(created.cwd)
    written = _fill(cwd)
    side = Side(c, str(created.session_id), cwd, written)
    await c.prompt(side.session_id, PING)
    return side


def _fill(cwd: Path) -> int:
    """WORKSPACE_FILES files of seeded sizes in WORKSPACE_DIRS directories (pkgA/modB/);
    returns their bytes."""
    draw = random.Random(40)
    total = 0
    for i in range(WORKSPACE_FILES):
        d = i % WORKSPACE_DIRS
        folder = cwd / f"pkg{d // 5}" / f"mod{d % 5}"
        folder.mkdir(parents=True, exist_ok=True)
        size = draw.randint(*FILE_BYTES)
        (folder / f"file{i:03d}.py").write_bytes(b"x" * (size - 1) + b"\n")
        total += size
    return total


async def _ping(side: Side) -> tuple[str, float, float]:
    """One `say ping` Prompt: its prompt's id, the seconds to its result event and to the
    stream's end. A refusal (QUOTA_EXCEEDED) raises, as does a turn that did not run."""
    start = time.perf_counter()
    call = side.c.sessions.Prompt(session_service_pb2.PromptRequest(session_id=side.session_id, text=PING))
    prompt_id, to_result = "", math.nan
    async for event in call:
        if event.HasField("user_prompt") and not event.parent_tool_use_id:
            prompt_id = event.message_id
        if event.HasField("result"):
            to_result = time.perf_counter() - start
            if event.result.is_error:
                raise RuntimeError(f"the ping turn failed: {event}")
    to_end = time.perf_counter() - start
    if not prompt_id or math.isnan(to_result):
        raise RuntimeError("the Prompt stream ended without its prompt or its result")
    return prompt_id, to_result, to_end


def _pings(side: Side, name: str) -> Measure:
    async def measure_() -> Sample:
        to_result, to_end = [], []
        for _ in range(PINGS):
            prompt_id, r, e = await _ping(side)
            side.prompts.append(prompt_id)
            to_result.append(r)
            to_end.append(e)
        return {f"prompt {name}": to_result, f"prompt {name}, stream end": to_end}

    return measure_


async def _check_ran(side: Side) -> None:
    """Every timed prompt is a rewind point of the session: it was admitted and its turn ran."""
    points: set[str] = set()
    token = ""
    while True:
        page = await side.c.points(side.session_id, MAX_PAGE_SIZE, token)
        points.update(p.message_id for p in page.points)
        token = page.next_page_token
        if not token:
            break
    missing = [p for p in side.prompts if p not in points]
    if missing or len(set(side.prompts)) != len(side.prompts):
        raise RuntimeError(f"{len(missing)} of {len(side.prompts)} prompts are not points of the session")


def _book(c: Client) -> UsageBook:
    """The server's UsageBook (a private field: the benchmark observes it, never times through it)."""
    book = c.running.registry._ctx.usage
    if book is None:
        raise RuntimeError("the server keeps no storage usage")
    return book


def _walks(side: Side, count: int) -> list[float]:
    """`storage.usage.measure` of the session's places (workspace and history) as the server's
    thread runs it, `count` times, each timed."""
    _, places = _book(side.c)._places[side.session_id]
    out = []
    for _ in range(count):
        start = time.perf_counter()
        measure(places)
        out.append(time.perf_counter() - start)
    return out


async def _probe(side: Side, count: int) -> Observed:
    """`count` prompts back to back as in the rounds (untimed), with the server's UsageBook.admit
    and .measure observed: whether admit found a measurement under way, and how long each took."""
    book = _book(side.c)
    seen = Observed()
    admit, measure_ = book.admit, book.measure

    async def observed_admit(session_id: str, principal: str) -> None:
        into = seen.busy if session_id in book._running else seen.idle
        start = time.perf_counter()
        try:
            await admit(session_id, principal)
        finally:
            into.append(time.perf_counter() - start)

    async def observed_measure(session_id: str) -> Any:
        start = time.perf_counter()
        try:
            return await measure_(session_id)
        finally:
            seen.measures.append(time.perf_counter() - start)

    patch: dict[str, Callable[..., Awaitable[Any]]] = {"admit": observed_admit, "measure": observed_measure}
    for name, fn in patch.items():
        setattr(book, name, fn)
    try:
        for _ in range(count):
            await _ping(side)
        await asyncio.sleep(0.2)  # the last turn's measurement
    finally:
        for name in patch:
            delattr(book, name)
    if len(seen.busy) + len(seen.idle) != count:
        raise RuntimeError(
            f"{len(seen.busy) + len(seen.idle)} of {count} prompts went through UsageBook.admit"
        )
    return seen


async def _storage(side: Side) -> tuple[int, int]:
    """The session's storage as GetSession shows it; the workspace must hold the files written."""
    session = await side.c.sessions.GetSession(
        session_service_pb2.GetSessionRequest(session_id=side.session_id)
    )
    got = (session.storage.workspace_bytes, session.storage.history_bytes)
    if got[0] < side.written:
        raise RuntimeError(f"the workspace measured {got[0]} bytes, less than the {side.written} written")
    return got


def _report(
    samples: Samples,
    sides: dict[str, Side],
    walks: list[float],
    observed: dict[str, Observed],
    storage: dict[str, tuple[int, int]],
) -> Report:
    report = Report(
        "Storage limits: a prompt with the limits on against off",
        ["what", "limits on (1 TiB)", "off", "ratio"],
    )
    for title, row in (
        ("`say ping` to its result event", "prompt {}"),
        ("`say ping` to the stream's end", "prompt {}, stream end"),
    ):
        a, b = samples.med(row.format("on")), samples.med(row.format("off"))
        report.rows.append([title, fmt_time(a), fmt_time(b), fmt_ratio(a / b if b else math.nan)])
    report.targets.append(
        ratio_target(
            "a prompt's round trip to its result, storage limits on / off",
            samples.med("prompt on"),
            samples.med("prompt off"),
            at_most=MAX_RATIO,
        )
    )
    on, off = observed["on"], observed["off"]
    report.infos += [
        f"one storage.usage.measure of the session (walk alone, {WORKSPACE_FILES} files in the workspace): "
        f"median {fmt_time(median(walks))} of {len(walks)} ({fmt_time(min(walks))} - {fmt_time(max(walks))})",
        "one measurement in the server (walk in a thread and its ledger write), probes: median on "
        f"{fmt_time(median(on.measures))} ({len(on.measures)}), off {fmt_time(median(off.measures))} "
        f"({len(off.measures)})",
        "a prompt right after the last turn found its measurement under way: on "
        f"{len(on.busy)}/{len(on.busy) + len(on.idle)}, off {len(off.busy)}/{len(off.busy) + len(off.idle)}; "
        f"UsageBook.admit took (median): on {fmt_time(median(on.busy))} when it found one (waits for it), "
        f"{fmt_time(median(on.idle))} when not; off {fmt_time(median(off.busy + off.idle))} (returns at once)",
    ]
    ws, hist = storage["on"]
    report.notes += [
        f"{samples.n('prompt on')} prompts per side over {samples.n('prompt on') // PINGS} rounds ({PINGS} per "
        "side per round, back to back), in an order reversed every other round; every one admitted and a "
        "rewind point of its session after the rounds",
        f"each session's workspace: {WORKSPACE_FILES} files in {WORKSPACE_DIRS} directories, "
        f"{fmt_bytes(sides['on'].written)} written; measured after the rounds (GetSession): workspace "
        f"{fmt_bytes(ws)}, history {fmt_bytes(hist)} (limits on); no workspace snapshots",
    ]
    return report
