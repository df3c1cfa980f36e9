"""Retention of what files rewinds need (`--retain-file-points`, `--retain-file-days`).

Which points keep it: the newest `points` visible points of a session (0: all) that are younger
than `days` days (0: no age bound); a point either bound leaves out is pruned. The ledger keeps
one mark per session, a time that only ever moves later (`files_pruned_before`): a point whose
prompt was sent before it is files_pruned, on any branch of the conversation. The mark is the
create time of the oldest point kept (the age bound itself when none is kept), so it never
reaches a kept point. A pruned point stays a point: a conversation rewind to it works; a files
rewind (or revert) to it is FILES_PRUNED; ListRewindPoints says `files_pruned`.

What is deleted is what only pruned points need; whatever a prompt sent at or after the mark may
need stays:

- the session's workspace snapshots from before the turn start of the oldest prompt kept (their
  records marked pruned), and every object no other snapshot reaches, by git's own reachability
  (`repack -a -d`, `prune`: snapshots/keeping.py). Trees an undo needs are no snapshots; kept
  besides are those of a rewind intent still pending, and those of the session's latest rewind
  while the point it rewound to is kept, so that it stays undoable (until a turn runs after it,
  which ends that anyway). Once that point is pruned, its undo is UNDO_UNAVAILABLE;
- the CLI's file backups (`file-history/<session>/`) the transcript names only for pruned
  prompts (`unneeded_backups`), never a file's first version (the CLI's own restore falls back
  to it; the CLI never deletes one either) nor its newest (the CLI compares the file with it at
  its next checkpoint).

A pass runs under the session's lock, so never while a turn or a rewind of it runs (one that
comes meanwhile waits for it: about as long as git takes to repack the repository), in the
background after each turn of a session, and once when the server loads a session with an age
bound (time alone prunes points) or whose last pass was cut short. In order, each step crash-safe:

1. a marker in the snapshot repository says a pass is under way (a crash leaves it: the next
   start runs a pass);
2. the mark is recorded: a crash after it leaves the points marked and nothing deleted that a
   kept point needs;
3. the snapshot records are pruned, then the repository is collected;
4. the backups are deleted; then the marker.

Every step is computed again from the mark by the next pass, which so finishes one cut short.
"""

from __future__ import annotations

import asyncio
import os
import re
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from agent_rewind import faults, tasks
from agent_rewind.snapshots.taking import TURN_START, Snapshots, repository
from agent_rewind.store.ledger import Ledger, RewindRecord, SessionRecord, SnapshotRecord
from agent_rewind.transcript.entries import RewindPoint, parse_timestamp
from agent_rewind.transcript.index import Reading
from agent_rewind.transcript.records import Backup

# In a session's snapshot repository while a pass is under way (git ignores it there).
UNDER_WAY = "agent-rewind-retention"

# The trees of a session's snapshot store its rewinds still need besides its snapshots, given
# its rewind records and whether a prompt keeps its files (rewind/intent.py `undo_trees`).
RewindTrees = Callable[[Sequence[RewindRecord], Callable[[str], bool]], set[str]]

# A backup's file name, as the CLI makes them: the file's hash, "@v" and the version.
_BACKUP_NAME = re.compile(r"(?P<file>[^/]+)@v(?P<version>[0-9]+)")


@dataclass(frozen=True)
class Retention:
    """The newest `points` of each session keep what a files rewind to them needs (0: all), and
    so does every point younger than `days` days (0: no age bound)."""

    points: int = 0
    days: float = 0.0

    @property
    def on(self) -> bool:
        return self.points > 0 or self.days > 0


def now() -> datetime:
    return datetime.now(UTC)


# The policy


def cutoff(points: Sequence[RewindPoint], retention: Retention, at: datetime) -> datetime | None:
    """The time before which a session's points are pruned under `retention` at the time `at`:
    the create time of the oldest of the visible `points` it keeps, the age bound itself when it
    keeps none; None when it prunes none (or cannot tell: the oldest kept has no time). Visible
    points are in the order they were sent."""
    n = len(points)
    first = n - retention.points if 0 < retention.points < n else 0
    bound = at - timedelta(days=retention.days) if retention.days > 0 else None
    if bound is not None:
        kept = n
        while kept > first and not is_pruned(points[kept - 1].create_time, bound):
            kept -= 1
        first = kept
        if first == n:
            return bound if n else None
    if first == 0:
        return None
    return points[first].create_time


def is_pruned(create_time: datetime | None, before: datetime | None) -> bool:
    """Whether a point sent at `create_time` is files_pruned by the mark `before` (a point of
    unknown time never is)."""
    return before is not None and create_time is not None and create_time < before


def later(a: datetime | None, b: datetime | None) -> datetime | None:
    if a is None or b is None:
        return a or b
    return max(a, b)


# What is deleted


def snapshots_kept_from(records: Sequence[SnapshotRecord], kept: Callable[[str], bool]) -> int:
    """The seq from which a session's snapshot records are kept: its first turn start of a kept
    prompt (every later record, whatever it is, with it); past the last record when no kept
    prompt has one."""
    for record in records:
        if record.kind == TURN_START and kept(record.ref):
            return record.seq
    return records[-1].seq + 1 if records else 0


def unneeded_backups(
    backups: Iterable[Backup], sent: Callable[[str], datetime | None], before: datetime
) -> set[str]:
    """The CLI's backups (file names under `file-history/<session>/`) only prompts sent before
    `before` need, of those the transcript's file history names (`backups`; `sent` gives a
    prompt's create time, None when unknown).

    A backup is needed when a record of it belongs to a prompt sent at or after `before` (its
    checkpoint: what a files rewind to it restores) or was taken at or after it (what such a
    prompt's rewind restores of a file first recorded after it); a record of unknown time keeps
    it too. Never unneeded: a file's first version, its newest, a name not made as the CLI makes
    them, and any backup the transcript does not name (one the CLI wrote for a checkpoint it has
    not written down yet)."""
    candidates: set[str] = set()
    needed: set[str] = set()
    newest: dict[str, tuple[int, str]] = {}
    for backup in backups:
        name = backup.name
        if name is None:
            continue
        found = _BACKUP_NAME.fullmatch(name)
        if found is None or name in (".", ".."):
            needed.add(name)
            continue
        version = int(found["version"])
        known = newest.get(found["file"])
        if known is None or known[0] < version:
            newest[found["file"]] = (version, name)
        taken, prompt = parse_timestamp(backup.time), sent(backup.prompt)
        if version <= 1 or taken is None or prompt is None or taken >= before or prompt >= before:
            needed.add(name)
        else:
            candidates.add(name)
    needed |= {name for _, name in newest.values()}
    return candidates - needed


def delete_backups(history: Path, names: Iterable[str]) -> int:
    """Deletes the backups `names` of the directory `history` (entries unlinked, never followed;
    the directory itself never through a link). How many were there. Blocking."""
    try:
        fd = os.open(history, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return 0
    deleted = 0
    try:
        present = set(os.listdir(fd))
        for name in sorted(set(names) & present):
            try:
                os.unlink(name, dir_fd=fd)
            except FileNotFoundError:
                continue
            deleted += 1
    finally:
        os.close(fd)
    return deleted


# A session's passes


class Retained(Protocol):
    """What a pass asks of its session (sessions/worker.py's `SessionWorker` is it)."""

    session_id: str
    lock: asyncio.Lock
    # Where the CLI keeps the session's file backups.
    file_history: Path

    @property
    def record(self) -> SessionRecord: ...

    @property
    def gone(self) -> bool: ...

    @property
    def client_pid(self) -> int | None: ...

    @property
    def turn_running(self) -> bool: ...

    async def transcript(self) -> Reading:
        """The transcript read up to date: the visible conversation and the whole index."""
        ...

    def storage_changed(self) -> None:
        """What the session holds changed: measured again soon."""
        ...

    def forget(self) -> None:
        """Frees the transcript index of a session with no process (read again when needed)."""
        ...


# Passes at load run one at a time per server (per event loop): a start does not read every
# session's transcript at once.
_loading: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)


@dataclass(frozen=True)
class Pruned:
    """What a pass did: the mark it left, snapshot records pruned, backups deleted."""

    before: datetime | None
    snapshots: int = 0
    backups: int = 0
    collected: bool = False


class SessionRetention:
    """A session's retention: its mark (read once, then kept in step) and its passes."""

    def __init__(
        self,
        session: Retained,
        ledger: Ledger,
        snapshots: Snapshots | None,
        retention: Retention,
        log: Any,
        rewind_trees: RewindTrees | None = None,
        clock: Callable[[], datetime] = now,
    ) -> None:
        """`rewind_trees`: None leaves the snapshots as they are (what a rewind needs of the
        snapshot store is not known then)."""
        self._session = session
        self._ledger = ledger
        self._snapshots = snapshots
        self._rewind_trees = rewind_trees
        self.retention = retention
        self._log = log
        self._clock = clock
        self._mark: datetime | None = None
        self._mark_read = False
        self._task: asyncio.Task[None] | None = None
        self._again = False

    async def pruned_before(self) -> datetime | None:
        """The session's mark: its points sent before it are files_pruned (None: none is)."""
        if not self._mark_read:
            found = await self._ledger.usage(self._session.session_id)
            self._mark = later(self._mark, found.files_pruned_before if found is not None else None)
            self._mark_read = True
        return self._mark

    def soon(self) -> None:
        """A pass, in the background (asked while one runs: once more after it)."""
        if not self.retention.on:
            return
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = tasks.detach(self._passes(), name=f"retention-{self._session.session_id}")

    def loaded(self) -> None:
        """The server loaded the session: a pass in the background if time alone may have pruned
        points (an age bound) or its last pass was cut short; one session at a time."""
        if not self.retention.on or (self._task is not None and not self._task.done()):
            return
        self._task = tasks.detach(self._at_load(), name=f"retention-load-{self._session.session_id}")

    async def settled(self) -> None:
        """Waits for the passes asked for so far."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)

    async def _passes(self) -> None:
        while True:
            self._again = False
            await self._logged()
            if not self._again:
                return

    async def _at_load(self) -> None:
        loop = asyncio.get_running_loop()
        lane = _loading.get(loop)
        if lane is None:
            lane = _loading[loop] = asyncio.Semaphore(1)
        async with lane:
            if self.retention.days > 0 or self._under_way():
                await self._logged(release=True)
        if self._again:  # a turn ended meanwhile: its pass
            await self._passes()

    async def _logged(self, *, release: bool = False) -> None:
        try:
            await self.run(release=release)
        except Exception as err:  # the next pass tries again; nothing a kept point needs is lost
            self._log.error("retention could not prune the session's files history", error=str(err))

    def _marker(self) -> Path | None:
        """Where the marker of a pass under way is: in the snapshot repository, if any."""
        snaps = self._snapshots
        if snaps is None:
            return None
        return repository(snaps.root, self._session.session_id) / UNDER_WAY

    def _under_way(self) -> bool:
        marker = self._marker()
        return marker is not None and marker.exists()

    async def run(self, *, release: bool = False) -> Pruned | None:
        """One pass, under the session's lock; None when the session prunes nothing. `release`:
        then frees the transcript it read when the session has no process (as hibernation does)."""
        s = self._session
        async with s.lock:
            if s.gone:
                return None
            try:
                return await self._run_locked(s)
            finally:
                if release and s.client_pid is None and not s.turn_running:
                    s.forget()

    async def _run_locked(self, s: Retained) -> Pruned | None:
        sid = s.session_id
        snaps = self._snapshots
        if snaps is not None:
            await snaps.settled(sid)  # a first snapshot still being taken is recorded first
        reading = await s.transcript()
        moved = cutoff(reading.view.points, self.retention, self._clock())
        current = await self.pruned_before()
        before = later(moved, current)
        if before is None:
            return None
        marker = self._marker()
        owed = False
        if marker is not None and marker.parent.is_dir():
            owed = marker.exists()
            await asyncio.to_thread(marker.touch)
        if moved is not None and (current is None or moved > current):
            await self._ledger.mark_files_pruned(sid, s.record.principal, moved)
            self._mark = moved
            self._log.info("retention marked points files_pruned", before=moved.isoformat())
        faults.point("retention.marked")

        index = reading.index

        def sent(prompt: str) -> datetime | None:
            entry = index.get(prompt)
            return entry.create_time if entry is not None else None

        def kept(prompt: str) -> bool:
            """Sent at or after the mark (a snapshot's ref that is no prompt is not kept)."""
            time = sent(prompt)
            return time is not None and time >= before

        def unmarked(prompt: str) -> bool:
            """Not files_pruned (a prompt of unknown time never is)."""
            return not is_pruned(sent(prompt), before)

        pruned, collected = 0, False
        if snaps is not None and self._rewind_trees is not None:
            records = await snaps.records(sid)
            keep_from = snapshots_kept_from(records, kept)
            if any(r.seq < keep_from and r.tree is not None for r in records):
                pruned = await snaps.prune_records(sid, keep_from)
            faults.point("retention.pruned")
            if pruned or owed:
                also = self._rewind_trees(await self._ledger.rewinds(sid), unmarked)
                await snaps.collect(sid, s.record.cwd, also)
                collected = True
            faults.point("retention.collected")
        view = reading.view
        names = unneeded_backups(view.backups, sent, before)
        deleted = await asyncio.to_thread(delete_backups, s.file_history, names) if names else 0
        if marker is not None:
            await asyncio.to_thread(marker.unlink, missing_ok=True)
        if pruned or deleted or collected:
            self._log.info(
                "retention deleted what only pruned points needed",
                snapshots=pruned,
                backups=deleted,
                collected=collected,
            )
            s.storage_changed()
        return Pruned(before, pruned, deleted, collected)
