"""Taking a session's workspace snapshots (snapshots/store.py) and recording them in the ledger.

A snapshot hashes the workspace with git, which can take a while on a large one: it runs in a
thread pool of its own, so it never holds up the event loop, nor another session, nor the
ledger's writes (which have the default pool). The ledger records each snapshot in the order it
was taken; `rewind/workspace.py` reads that history to decide what a files rewind restores.
A snapshot that fails or hits a bound is recorded as incomplete, with the reason: never a silent
success, never a failed turn.

A session's first snapshot reads every file (`SnapshotStore.first`), which in a big workspace
can take longer than a turn should wait. Its turn waits until the take has read the workspace
(`SnapshotStore.take`'s `on_read`: a git checkout's first take goes on copying blobs from the
workspace's own git after that, which the turn's edits no longer change), for at most
`--snapshot-timeout`; then the prompt goes on and the snapshot goes on in the background (up to
BACKGROUND_TIMES the bound), recorded when it ends: until then the point has no snapshot
(`snapshot_available` false), then it has one. One whose reading went past the bound is recorded
complete only if the workspace's watch vouches that nothing changed while it read
(`SnapshotStore.quiet`): else it could hold some of the agent's first edits, and it is recorded
incomplete. Every later take of the session waits for it first (the ledger keeps the order
snapshots were taken in).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import shutil
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import structlog

from agent_rewind import metrics, tasks, tracing
from agent_rewind.snapshots import Limits, Snapshot, SnapshotStore, directory_bytes
from agent_rewind.store.ledger import NewSnapshot, SnapshotOrder, SnapshotRecord

log = structlog.get_logger(__name__)

T = TypeVar("T")

TURN_START = "turn_start"
TURN_END = "turn_end"
REWIND_BEFORE = "rewind_before"
REWIND_AFTER = "rewind_after"

# Stores watching their workspace at once (an inotify instance each; a user has 128 by default,
# and each live CLI process holds one): past it, the least recently snapshotted stops watching.
MAX_WATCHED = 48

# A first snapshot past --snapshot-timeout goes on in the background up to this many times it.
BACKGROUND_TIMES = 10
CHANGED_MEANWHILE = "changed meanwhile: the workspace changed while its first snapshot was taken"
UNWATCHED_MEANWHILE = (
    "unwatched meanwhile: the first snapshot ended after its turn began, with no watch to vouch "
    "that the workspace was unchanged"
)


def _failed(session_id: str, err: Exception) -> Snapshot:
    log.error("workspace snapshot failed", session_id=session_id, error=str(err))
    return Snapshot(None, False, f"error: {err}")


def _count(snapshot: Snapshot) -> None:
    how = snapshot.how or "failed"
    metrics.SNAPSHOTS.labels(how, "true" if snapshot.complete else "false").inc()
    metrics.SNAPSHOT_SECONDS.labels(how).observe(snapshot.seconds)


def snapshots_dir(state_dir: Path) -> Path:
    """Where the sessions' snapshot repositories lie: `<state-dir>/snapshots/`."""
    return state_dir / "snapshots"


def repository(root: Path, session_id: str) -> Path:
    """A session's snapshot repository under `root`: a bare git repository of its own."""
    return root / f"{session_id}.git"


class Snapshots:
    """Every session's snapshot store, under one directory of the state dir."""

    def __init__(
        self, root: Path, ledger: SnapshotOrder, limits: Limits, threads: int = 4, *, watch: bool = False
    ) -> None:
        """`watch`: each store follows its workspace while its session is live (inotify), so a
        snapshot asks git only about what changed (`snapshots.watch`)."""
        self.root = root
        self.limits = limits
        self.watch = watch
        # Sessions whose store may be watching its workspace, least recently snapshotted first.
        self._watching: OrderedDict[str, None] = OrderedDict()
        self._ledger = ledger
        self._stores: dict[str, SnapshotStore] = {}
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="snapshot")
        # Per session: its records, read from the ledger once, then kept in step.
        self._records: dict[str, list[SnapshotRecord]] = {}
        # Per session: its records' availability, with the list and length it was computed from.
        self._available: dict[str, tuple[list[SnapshotRecord], int, dict[str, bool]]] = {}
        # Per session: its store's bytes on disk, with the records' (length, last seq) measured at.
        self._bytes: dict[str, tuple[tuple[int, int], int]] = {}
        # Per session: its first snapshot, going on in the background (then recorded).
        self._pending: dict[str, asyncio.Task[None]] = {}

    def store(self, session_id: str, cwd: str) -> SnapshotStore:
        found = self._stores.get(session_id)
        if found is None:
            found = SnapshotStore(repository(self.root, session_id), Path(cwd), self.limits, watch=self.watch)
            self._stores[session_id] = found
        return found

    async def run(self, work: Callable[[], T]) -> T:
        """Runs blocking store work in the snapshot threads, in the caller's context (as
        `asyncio.to_thread` does): a span there is the caller's child."""
        context = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(self._executor, context.run, work)

    async def records(self, session_id: str) -> list[SnapshotRecord]:
        found = self._records.get(session_id)
        if found is None:
            found = await self._ledger.snapshots(session_id)
            self._records[session_id] = found
        return found

    async def take(self, session_id: str, cwd: str) -> Snapshot:
        """The workspace as it is now, unrecorded (a dry run's view)."""
        await self.settled(session_id)
        store = self._live_store(session_id, cwd)
        try:
            snapshot = await self.run(lambda: _take(store, session_id))
        except Exception as err:  # git missing, disk full, ...: incomplete, never a silent success
            snapshot = _failed(session_id, err)
        _count(snapshot)
        return snapshot

    async def settled(self, session_id: str) -> None:
        """Waits for the session's first snapshot if it is going on in the background (until it
        is recorded): what is taken next comes after it."""
        pending = self._pending.get(session_id)
        if pending is not None:
            await asyncio.shield(pending)

    def _live_store(self, session_id: str, cwd: str) -> SnapshotStore:
        store = self.store(session_id, cwd)
        if self.watch:
            self._watching[session_id] = None
            self._watching.move_to_end(session_id)
            while len(self._watching) > MAX_WATCHED:  # each watch holds an inotify instance
                self._stop_watching(next(iter(self._watching)))
        return store

    async def _take_first(self, session_id: str, cwd: str, kind: str, ref: str) -> SnapshotRecord | None:
        """A first snapshot: waited for up to the bound, else recorded when it ends (in the
        background; the module docstring says how it is judged). None when not recorded (yet)."""
        store = self._live_store(session_id, cwd)
        bound = self.limits.timeout_s
        loop = asyncio.get_running_loop()
        read: asyncio.Future[None] = loop.create_future()

        def set_read() -> None:
            if not read.done():
                read.set_result(None)

        def on_read() -> None:  # in the snapshot thread
            loop.call_soon_threadsafe(set_read)

        work = asyncio.ensure_future(
            self.run(lambda: _take(store, session_id, bound * BACKGROUND_TIMES, on_read))
        )
        waited: set[asyncio.Future[Any]] = {work, read}
        await asyncio.wait(waited, timeout=bound, return_when=asyncio.FIRST_COMPLETED)
        if work.done():
            try:
                snapshot = work.result()
            except Exception as err:
                snapshot = _failed(session_id, err)
            _count(snapshot)
            return await self._record_logged(session_id, kind, ref, snapshot)
        log.info(
            "the first workspace snapshot goes on in the background",
            session_id=session_id,
            bound_s=bound,
            read=read.done(),
        )
        task = tasks.detach(
            self._finish_first(session_id, kind, ref, store, work, read_in_time=read.done()),
            name=f"first-snapshot-{session_id}",
        )
        self._pending[session_id] = task

        def forget(_: asyncio.Task[None]) -> None:
            if self._pending.get(session_id) is task:
                del self._pending[session_id]

        task.add_done_callback(forget)
        return None

    async def _finish_first(
        self,
        session_id: str,
        kind: str,
        ref: str,
        store: SnapshotStore,
        work: asyncio.Future[Snapshot],
        *,
        read_in_time: bool,
    ) -> None:
        """Records a first snapshot going on in the background when it ends. `read_in_time`: it
        had read the workspace before the turn went on (as a take within the bound, it holds
        the workspace before the turn's first edit); else the watch must vouch for it."""
        try:
            snapshot = await work
        except Exception as err:
            snapshot = _failed(session_id, err)
        if snapshot.complete and not read_in_time:
            try:
                quiet = await self.run(store.quiet)
            except Exception:  # cannot tell: not vouched for
                quiet = False
            if not quiet:
                why = CHANGED_MEANWHILE if self.watch else UNWATCHED_MEANWHILE
                snapshot = Snapshot(snapshot.tree, False, why, snapshot.seconds, snapshot.how)
        _count(snapshot)
        await self._record_logged(session_id, kind, ref, snapshot)

    async def record(self, session_id: str, kind: str, ref: str, snapshot: Snapshot) -> SnapshotRecord:
        """Records a snapshot taken for the session. Raises what the ledger raises."""
        if not snapshot.complete:
            log.warning(
                "workspace snapshot incomplete", session_id=session_id, kind=kind, reason=snapshot.reason
            )
        new = NewSnapshot(session_id, kind, ref, snapshot.tree, snapshot.complete, snapshot.reason)
        record = await self._ledger.add_snapshot(new)
        records = await self.records(session_id)
        if not records or records[-1].seq < record.seq:
            records.append(record)
        return record

    async def take_and_record(self, session_id: str, cwd: str, kind: str, ref: str) -> SnapshotRecord | None:
        """Takes and records a snapshot; None (logged) when the ledger could not record it, or
        when a turn's first snapshot goes on in the background (recorded when it ends)."""
        await self.settled(session_id)
        if kind == TURN_START and self.store(session_id, cwd).first:
            return await self._take_first(session_id, cwd, kind, ref)
        snapshot = await self.take(session_id, cwd)
        return await self._record_logged(session_id, kind, ref, snapshot)

    async def _record_logged(
        self, session_id: str, kind: str, ref: str, snapshot: Snapshot
    ) -> SnapshotRecord | None:
        try:
            return await self.record(session_id, kind, ref, snapshot)
        except Exception as err:
            log.error(
                "could not record a workspace snapshot", session_id=session_id, kind=kind, error=str(err)
            )
            return None

    async def availability(self, session_id: str) -> dict[str, bool]:
        """`available` of the session's records, computed once per change of them (the same
        dict until then: a page of points asked for again is served from a cache keyed on it)."""
        records = await self.records(session_id)
        cached = self._available.get(session_id)
        if cached is not None and cached[0] is records and cached[1] == len(records):
            return cached[2]
        found = self.available(records)
        self._available[session_id] = (records, len(records), found)
        return found

    async def availability_of(self, session_id: str, refs: Sequence[str]) -> dict[str, bool]:
        """`availability` of some prompts only (a page of points): from the records when they are
        in memory, else read for those prompts alone from the ledger (the first page after a
        start costs what the page holds, not what the session does)."""
        if session_id in self._records:
            every = await self.availability(session_id)
            return {ref: every[ref] for ref in refs if ref in every}
        return await self._ledger.snapshots_served(session_id, refs)

    def available(self, records: list[SnapshotRecord]) -> dict[str, bool]:
        """Per prompt id whose turn started with a snapshot: whether a files rewind to it can be
        served from snapshots, that is its start snapshot and every later one are complete (a
        rewind reads them all). Prompts without a snapshot are absent."""
        out: dict[str, bool] = {}
        later_complete = True
        for record in reversed(records):
            later_complete = later_complete and record.complete and record.tree is not None
            if record.kind == TURN_START and record.ref not in out:
                out[record.ref] = later_complete
        return out

    async def prune_records(self, session_id: str, before_seq: int) -> int:
        """Marks the session's snapshots older than `before_seq` pruned (no tree: no rewind reads
        them again); their objects stay until `collect`. How many (storage/retention.py)."""
        pruned = await self._ledger.prune_snapshots(session_id, before_seq)
        if pruned:
            self._records[session_id] = await self._ledger.snapshots(session_id)
        return pruned

    async def collect(self, session_id: str, cwd: str, also_keep: Iterable[str] = ()) -> None:
        """Deletes every object of the session's repository that neither an unpruned snapshot nor
        a tree of `also_keep` reaches (git's reachability: `SnapshotStore.keep_only`)."""
        records = await self.records(session_id)
        kept = {r.tree for r in records if r.tree is not None} | set(also_keep)
        store = self.store(session_id, cwd)
        await self.run(lambda: store.keep_only(kept))
        self._bytes.pop(session_id, None)

    async def disk_bytes(self, session_id: str) -> int:
        """What the session's store holds on disk, as of its last recorded (or collected)
        snapshot: measured once per new record (or collection), so a page of sessions costs no
        walk of their stores, nor a read of their records, while nothing changed."""
        key = (await self._ledger.newest_snapshot(session_id), 0)
        cached = self._bytes.get(session_id)
        if cached is not None and cached[0] == key:
            return cached[1]
        path = repository(self.root, session_id)
        size = await self.run(lambda: directory_bytes(path))
        self._bytes[session_id] = (key, size)
        return size

    def forget(self, session_id: str) -> None:
        """Drops what is cached of a session (its records are re-read on demand) and stops
        watching its workspace (its next snapshot scans it)."""
        self._records.pop(session_id, None)
        self._available.pop(session_id, None)
        self._bytes.pop(session_id, None)
        self._stop_watching(session_id)

    def _stop_watching(self, session_id: str) -> None:
        self._watching.pop(session_id, None)
        store = self._stores.get(session_id)
        if store is not None:  # in the snapshot threads: a take of it may be running
            with contextlib.suppress(RuntimeError):  # shut down: the process is ending
                self._executor.submit(store.close)

    async def delete(self, session_id: str) -> None:
        self._records.pop(session_id, None)
        self._available.pop(session_id, None)
        self._bytes.pop(session_id, None)
        self._stop_watching(session_id)
        self._stores.pop(session_id, None)
        path = repository(self.root, session_id)
        await self.run(lambda: shutil.rmtree(path, ignore_errors=True))

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _take(
    store: SnapshotStore,
    session_id: str,
    timeout_s: float | None = None,
    on_read: Callable[[], None] | None = None,
) -> Snapshot:
    """A take, in a snapshot thread, in a span: how it was taken and whether it is complete (not
    its reason, which may name a path)."""
    with tracing.span("snapshot.take", session_id=session_id) as span:
        if on_read is not None:
            snapshot = store.take(timeout_s, on_read=on_read)
        else:
            snapshot = store.take() if timeout_s is None else store.take(timeout_s)
        span.set(how=snapshot.how or "failed", complete=snapshot.complete)
        return snapshot
