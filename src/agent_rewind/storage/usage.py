"""What each session holds on the server's volumes, measured, and the limits a turn must be under.

A session holds its workspace (`workspace_bytes`: every file under it, as `du` counts them, the
blocks they take, links not followed, no other file system crossed) and its history
(`history_bytes`: its transcripts, the CLI's file backups for it, its snapshot repository): what
its rewinds need. Both are measured by walking them, never estimated from counts, in a thread:

- after each turn ends, after each rewind or undo of it (its event), after retention pruned it,
  when a session is first served here (a fork, a load) and, for a session over a limit, again
  before its next prompt is refused (a rewind or a deletion may have freed it since);
- one measurement of a session at a time: asked again meanwhile, it measures once more after;
- a limit is judged by the figure after the last change: a measurement under way is waited for.

So a figure is as of the session's last turn, rewind, undo or pruning, plus the walk's time
(milliseconds for a few thousand files, about a second for a few hundred thousand). It is
recorded in the ledger, where any replica reads it, and the principal's figure is the sum there
over its sessions, whatever replica serves them (read again at most every PRINCIPAL_SECONDS).

The limits (`--max-session-storage`, `--max-principal-storage`) refuse a turn (and a fork) of a
session at or over one before it starts (QUOTA_EXCEEDED); a turn that crosses one while it runs
finishes. Nothing else is refused: rewinds, undos, reads and deletes are how a caller gets back
under a limit.
"""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import structlog

from agent_rewind import metrics
from agent_rewind.errors import StorageQuotaExceeded
from agent_rewind.store.ledger import Ledger

log = structlog.get_logger(__name__)

# How long a principal's sum over its sessions, read from the ledger, is used before it is read
# again (another replica's sessions change it too).
PRINCIPAL_SECONDS = 2.0
# Threads that walk sessions' files, at most at once.
WALKERS = 2


@dataclass(frozen=True)
class Limits:
    """Bytes a session, and a principal's sessions together, may hold (0: no limit)."""

    session: int = 0
    principal: int = 0


@dataclass(frozen=True)
class Places:
    """Where a session's bytes are: its workspace, and what its history is made of (files or
    directories; one that does not exist holds nothing)."""

    workspace: Path
    history: tuple[Path, ...]


def tree_bytes(path: Path) -> int:
    """The blocks `path` and everything under it take, in bytes, as `du` counts them: links are
    not followed, a mount point below it is not entered, a hard link is counted once, and an
    entry that vanishes while it is walked counts nothing. Blocking."""
    try:
        top = os.lstat(path)
    except OSError:
        return 0
    total = top.st_blocks * 512
    if not stat.S_ISDIR(top.st_mode):
        return total
    seen: set[tuple[int, int]] = set()
    stack = [str(path)]
    while stack:
        directory = stack.pop()
        try:
            entries = os.scandir(directory)
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if info.st_nlink > 1 and not stat.S_ISDIR(info.st_mode):
                    if (info.st_dev, info.st_ino) in seen:
                        continue
                    seen.add((info.st_dev, info.st_ino))
                total += info.st_blocks * 512
                if stat.S_ISDIR(info.st_mode) and info.st_dev == top.st_dev:
                    stack.append(entry.path)
    return total


def measure(places: Places) -> tuple[int, int]:
    """(workspace_bytes, history_bytes). Blocking: run it in a thread."""
    return tree_bytes(places.workspace), sum(tree_bytes(p) for p in places.history)


class UsageBook:
    """This replica's sessions' usage: measured, recorded in the ledger, checked against the limits."""

    def __init__(self, ledger: Ledger, limits: Limits) -> None:
        self._ledger = ledger
        self.limits = limits
        # Walks run in threads of their own: a huge workspace being measured never holds up the
        # threads a rewind's or a turn's file work runs in.
        self._threads = ThreadPoolExecutor(WALKERS, thread_name_prefix="usage")
        self._places: dict[str, tuple[str, Places]] = {}  # session -> (principal, places)
        self._figures: dict[str, tuple[int, int]] = {}  # session -> its last measurement here
        self._principals: dict[str, tuple[float, int]] = {}  # principal -> (read at, its sum)
        self._running: dict[str, asyncio.Task[None]] = {}
        self._walking: dict[str, asyncio.Future[None]] = {}  # a session's walk under way
        self._again: set[str] = set()

    def close(self) -> None:
        """Stops measuring (the server stops): a walk under way is not waited for."""
        for task in self._running.values():
            task.cancel()
        self._threads.shutdown(wait=False, cancel_futures=True)

    # What this replica serves

    def track(self, session_id: str, principal: str, places: Places) -> None:
        """A session served here from now on: measured soon, unless the ledger has its figure."""
        self._places[session_id] = (principal, places)
        self._start(session_id, first=True)

    def forget(self, session_id: str) -> None:
        """A session no longer served here (deleted, or another replica's now)."""
        self._places.pop(session_id, None)
        self._figures.pop(session_id, None)
        self._again.discard(session_id)
        task = self._running.pop(session_id, None)
        if task is not None:
            task.cancel()
        self._gauge()

    def changed(self, session_id: str) -> None:
        """What the session holds may have changed: measure it again, in the background."""
        if session_id not in self._places:
            return
        if session_id in self._running:
            self._again.add(session_id)
            return
        self._start(session_id, first=False)

    def _start(self, session_id: str, *, first: bool) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # made outside a running loop (a tool): measured when it changes
            return
        if session_id not in self._running:
            task = loop.create_task(self._measure_soon(session_id, first), name=f"usage-{session_id}")
            self._running[session_id] = task

    async def _measure_soon(self, session_id: str, first: bool) -> None:
        """Measures the session, and again while it changed meanwhile; `first`: only when the
        ledger has no figure of it yet (a session this replica starts to serve)."""
        try:
            if first and await self._known(session_id) and session_id not in self._again:
                return
            while True:
                self._again.discard(session_id)
                try:
                    await self.measure(session_id)
                except Exception as err:  # the figure stays as it was; the next change measures again
                    log.warning(
                        "could not measure a session's storage", session_id=session_id, error=str(err)
                    )
                if session_id not in self._again:
                    return
        finally:
            if self._running.get(session_id) is asyncio.current_task():
                del self._running[session_id]

    async def _known(self, session_id: str) -> bool:
        """Whether the ledger has the session's figure (then kept here as its last)."""
        known = await self._ledger.usage(session_id)
        if known is None or known.measure_time is None or session_id not in self._places:
            return False
        self._figures[session_id] = (known.workspace_bytes, known.history_bytes)
        self._gauge()
        return True

    async def measure(self, session_id: str) -> tuple[int, int] | None:
        """Measures the session now, records it, and returns it; None when not served here."""
        found = self._places.get(session_id)
        if found is None:
            return None
        principal, places = found
        loop = asyncio.get_running_loop()
        walked: asyncio.Future[None] = loop.create_future()
        self._walking[session_id] = walked
        try:
            figure = await loop.run_in_executor(self._threads, measure, places)
            if session_id not in self._places:
                return None  # forgotten meanwhile (deleted): record nothing of it
            # Judged by from now on (`admit` waits for the walk, not for the ledger's write);
            # the principal's sum is moved by the difference rather than read again.
            before = self._figures.get(session_id)
            self._figures[session_id] = figure
            cached = self._principals.get(principal)
            if cached is not None and before is not None:
                self._principals[principal] = (cached[0], cached[1] - sum(before) + sum(figure))
            else:
                self._principals.pop(principal, None)
            self._gauge()
        finally:
            if self._walking.get(session_id) is walked:
                del self._walking[session_id]
            walked.set_result(None)
        await self._ledger.record_usage(session_id, principal, *figure)
        return figure

    def _gauge(self) -> None:
        metrics.STORAGE_BYTES.labels("workspace").set(sum(w for w, _ in self._figures.values()))
        metrics.STORAGE_BYTES.labels("history").set(sum(h for _, h in self._figures.values()))

    # Reading

    async def of(self, session_id: str) -> tuple[int, int] | None:
        """The session's last measurement (workspace_bytes, history_bytes): this replica's, kept
        here (a page of sessions reads no ledger row each), else the ledger's; None: never
        measured."""
        figure = self._figures.get(session_id)
        if figure is not None:
            return figure
        record = await self._ledger.usage(session_id)
        if record is None or record.measure_time is None:
            return None
        return record.workspace_bytes, record.history_bytes

    # The limits

    async def admit(self, session_id: str, principal: str) -> None:
        """Raises QUOTA_EXCEEDED when the session, or its principal's sessions together, hold as
        much as their limit or more. A session over a limit is measured again first: a refusal
        is never of a figure a rewind or deletion has made stale."""
        limits = self.limits
        if not limits.session and not limits.principal:
            return
        # A measurement under way (the last turn's, a rewind's) is the figure to judge by.
        await self._settled(
            [session_id] if not limits.principal else [session_id, *self._sessions_of(principal)]
        )
        if limits.session:
            used = await self._session_bytes(session_id)
            if used >= limits.session:
                fresh = await self.measure(session_id)
                used = sum(fresh) if fresh is not None else used
                if used >= limits.session:
                    raise StorageQuotaExceeded("session_storage", used, limits.session)
        if limits.principal:
            used = await self._principal_bytes(principal)
            if used >= limits.principal:
                for other in self._sessions_of(principal):
                    await self.measure(other)
                used = await self._principal_bytes(principal, fresh=True)
                if used >= limits.principal:
                    raise StorageQuotaExceeded("principal_storage", used, limits.principal)

    async def _settled(self, sessions: Iterable[str]) -> None:
        """Waits for the walks of `sessions` under way (a measurement begun but not yet walking,
        or walking again after a change, is waited for too: its walk is what is judged)."""
        for session_id in sessions:
            while True:
                walked = self._walking.get(session_id)
                if walked is None and session_id in self._running:
                    await asyncio.sleep(0)  # its walk is about to start
                    if session_id not in self._walking and session_id in self._running:
                        await asyncio.shield(self._running[session_id])
                    continue
                if walked is None:
                    break
                await asyncio.shield(walked)

    def _sessions_of(self, principal: str) -> Iterable[str]:
        return [sid for sid, (owner, _) in self._places.items() if owner == principal]

    async def _session_bytes(self, session_id: str) -> int:
        figure = self._figures.get(session_id)
        if figure is not None:
            return sum(figure)
        record = await self._ledger.usage(session_id)
        return record.workspace_bytes + record.history_bytes if record is not None else 0

    async def _principal_bytes(self, principal: str, *, fresh: bool = False) -> int:
        cached = self._principals.get(principal)
        if cached is not None and not fresh and time.monotonic() - cached[0] < PRINCIPAL_SECONDS:
            return cached[1]
        used = await self._ledger.principal_usage(principal)
        self._principals[principal] = (time.monotonic(), used)
        return used
