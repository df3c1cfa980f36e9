"""A session's rewind points as the ledger keeps them: the points index.

The replica that owns a session keeps the index in step with what it shows: a turn's record
writes it in the transaction that touches the session, a rewind's or an undo's in the one that
commits its cut, and any read that finds the conversation changed (a turn's prompt, a process
that wrote its last checkpoint at exit) writes the difference first, without waiting for the
disk where the ledger allows (a crash loses it, if at all, with this process, and the next start
reads it again from the transcript's tail, below). Every replica reads points
from the index, the owner too, so they give the same answer: nothing about a point is computed
from what only the owner holds in memory (its live process's checkpoint of the newest prompt is
recorded with the head, `holds_newest`).

A write costs what changed: the rows from the first point that differs on (found by comparing
the newest kept one, or by bisection after a rewind), and the snapshot orders the CLI wrote
since. A start, a wake from hibernation or a takeover reads the head, checks the transcript's
size and the bytes just before what it covers, and reads only the tail after it
(transcript/tail.py); only what the tail cannot settle rebuilds from the whole transcript.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import itertools
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from agent_rewind import faults, tasks
from agent_rewind.sessions.conversation import READ_INLINE_BYTES, TranscriptView
from agent_rewind.sessions.state import SessionState
from agent_rewind.store.ledger import Ledger, PointIndex, PointRow, PointsHead, PointsUpdate
from agent_rewind.transcript.entries import (
    FILE_CHECKPOINT_WINDOW,
    PREVIEW_CHARS,
    EntryKind,
    RewindPoint,
    parse_timestamp,
)
from agent_rewind.transcript.records import Entry
from agent_rewind.transcript.tail import read_tail
from agent_rewind.transcript.view import ConversationView

# How much of the transcript before `covered` the head's digest checks (a file replaced or
# rewritten under the index is read whole again).
DIGEST_BYTES = 4096


def digest(path: Path, covered: int) -> str:
    """Which file the index was made from, and what it held just before `covered`: its inode
    and the sha256 of those bytes ("" when it has fewer). The CLI only ever appends to a
    transcript (and the sandbox keeps agents out of the state dir): a file replaced, shrunk or
    rewritten where the index ended is read whole again. Called on the event loop: one read of
    4 KiB costs less than a thread's round trip (tens of microseconds against hundreds)."""
    start = max(0, covered - DIGEST_BYTES)
    try:
        with path.open("rb") as f:
            inode = os.fstat(f.fileno()).st_ino
            data = os.pread(f.fileno(), covered - start, start)
    except FileNotFoundError:
        return ""
    if len(data) != covered - start:
        return ""
    return f"{inode}:{hashlib.sha256(data).hexdigest()}"


def row_of(entry: Entry, parent: Entry | None, position: int | None) -> PointRow:
    """A prompt entry as the index keeps it (what `_Points._point` of transcript/view.py reads)."""
    return PointRow(
        idx=entry.prompts - 1,
        uuid=entry.uuid,
        message_id=entry.id,
        resume_at_message_id=parent.id if parent is not None else "",
        anchor=parent.uuid if parent is not None else "",
        text=entry.text[: PREVIEW_CHARS + 1],
        create_time=parse_timestamp(entry.timestamp),
        snapshot_pos=position,
        compactions=entry.compactions,
        copy=bool(entry.copy_of),
    )


def point_of(row: PointRow, head: PointsHead) -> RewindPoint:
    """A kept row as the point a view would make of its entry (the same rules, from the head)."""
    compacted = row.compactions < head.leaf_compactions
    if compacted or row.copy:
        has_checkpoint = pending = False
    elif row.snapshot_pos is None:
        has_checkpoint, pending = row.idx + 1 == head.count, True
    else:
        has_checkpoint, pending = row.snapshot_pos >= head.snapshot_count - FILE_CHECKPOINT_WINDOW, False
    return RewindPoint(
        message_id=row.message_id,
        resume_at_message_id=row.resume_at_message_id,
        text=row.text,
        index=row.idx,
        create_time=row.create_time,
        has_checkpoint=has_checkpoint,
        checkpoint_pending=pending,
        compacted=compacted,
        anchor=row.anchor,
    )


# How many of the leaf's nearest ancestors the head keeps, besides the leaf: the CLI writes
# bookkeeping entries off the chain (the leaf may be one), and the next turn goes on from an
# entry before it.
SEED_ANCESTORS = 8


def _seed(entries: list[tuple[Entry, str]], newest: str, newest_position: int | None) -> dict[str, Any]:
    """What reading the transcript on from the head needs (transcript/tail.py): the leaf and its
    nearest ancestors, each with the client id of its chain's newest message."""
    return {
        "entries": [
            {
                "uuid": entry.uuid,
                "parent": entry.parent_uuid,
                "copy_of": entry.copy_of,
                "kind": entry.kind.value,
                "api": entry.api_message_id,
                "depth": entry.depth,
                "prompts": entry.prompts,
                "messages": entry.messages,
                "last_message": entry.last_message,
                "last_message_id": last,
                "compactions": entry.compactions,
                "segment": entry.segment,
            }
            for entry, last in entries
        ],
        "newest": newest,
        "newest_position": newest_position,
    }


def _view_seeds(view: ConversationView) -> list[tuple[Entry, str]]:
    seeds: list[tuple[Entry, str]] = []
    entry = view.leaf_entry
    while entry is not None and len(seeds) <= SEED_ANCESTORS:
        last = view.entry(entry.last_message) if entry.last_message else None
        seeds.append((entry, last.id if last is not None else ""))
        entry = view.entry(entry.parent_uuid) if entry.depth else None
    return seeds


def _seed_entries(seed: dict[str, Any]) -> list[tuple[Entry, str]]:
    return [
        (
            Entry(
                uuid=e["uuid"],
                parent_uuid=e["parent"],
                kind=EntryKind(e["kind"]),
                offset=-1,
                timestamp="",
                text="",
                api_message_id=e["api"],
                is_message=False,  # gremlin: pardon[equivalent] a tail index makes no view: never read
                depth=e["depth"],
                prompts=e["prompts"],
                messages=e["messages"],
                last_message=e["last_message"],
                compactions=e["compactions"],
                segment=e["segment"],
                copy_of=e["copy_of"],
            ),
            e["last_message_id"],
        )
        for e in seed.get("entries", ())
    ]


class SessionPoints:
    """The points index of one session, as its owner keeps it (`worker.SessionWorker.points`).

    `holds_newest`: whether the live process ran the newest prompt (it holds that prompt's
    checkpoint before the CLI writes it down)."""

    def __init__(
        self,
        state: SessionState,
        transcript: TranscriptView,
        ledger: Ledger,
        holds_newest: Callable[[], bool],
    ) -> None:
        self._state = state
        self._transcript = transcript
        self._session_id = state.session_id
        self._ledger = ledger
        self._log = state.log
        self._holds_newest = holds_newest
        self._head: PointsHead | None = None
        self._head_read = False
        # What the index was last made from: (view, transcript bytes, cut, holds_newest).
        self._synced: tuple[ConversationView, int, str, bool] | None = None
        # The transcript's size when the index was last found to cover it (no view loaded).
        self._checked: int | None = None
        self.rebuilds = 0  # reads of the whole transcript the index needed (tests, logs)
        # One write of the index at a time: a read's, a turn's record, a rewind's cut (each
        # computes its change against the head the one before it wrote).
        self._lock = asyncio.Lock()

    def forget(self) -> None:
        """The session freed its view (hibernation): the next read checks the transcript again."""
        self._synced = None
        self._checked = None

    async def head(self) -> PointsHead | None:
        if not self._head_read:
            self._head = await self._ledger.points_head(self._session_id)
            self._head_read = True
        return self._head

    def applied(self, update: PointsUpdate, view: ConversationView | None, covered: int, cut: str) -> None:
        """`update` committed (by `record`, or by a rewind's transaction)."""
        self._head, self._head_read = update.head, True
        self._synced = (view, covered, cut, update.head.holds_newest) if view is not None else None

    # From a view of the whole transcript (the owner's, once it has read it)

    async def update_for(
        self, view: ConversationView, path: Path, covered: int, cut: str, holds: bool
    ) -> PointsUpdate | None:
        """What makes the index show `view` (None: it does already)."""
        head = await self.head()
        n = len(view.points)
        ids = view.snapshot_ids
        keep = await self._common_prefix(head, view, n)
        positions: list[tuple[str, int]] = []
        # gremlin: pardon[equivalent] entered with keep 0 (`or`), the branch leaves keep 0 and adds no position
        if head is not None and keep:
            if len(ids) < head.snapshot_count:
                keep = 0  # another file than the one the index was made from
            else:
                fresh = len(ids) - head.snapshot_count
                for uuid, position in itertools.islice(reversed(ids.items()), fresh):
                    entry = view.entry(uuid)
                    if (
                        entry is not None
                        and entry.kind is EntryKind.PROMPT
                        and entry.prompts - 1 < keep
                        and view.prompt_entry(entry.prompts - 1) is entry
                    ):
                        positions.append((uuid, position))
        added = []
        for i in range(keep, n):
            entry = view.prompt_entry(i)
            parent = view.entry(entry.parent_uuid) if entry.depth else None
            added.append(row_of(entry, parent, ids.get(entry.uuid)))
        leaf = view.leaf_entry
        newest = view.prompt_entry(n - 1).uuid if n else ""
        new_head = PointsHead(
            session_id=self._session_id,
            covered=covered,
            digest=digest(path, covered),
            leaf=leaf.uuid if leaf is not None else "",
            seed=_seed(_view_seeds(view), newest, ids.get(newest) if newest else None),
            count=n,
            last_message_id=view.last_message_id,
            snapshot_count=len(ids),
            leaf_compactions=leaf.compactions if leaf is not None else 0,
            holds_newest=holds,
            cut=cut,
        )
        if new_head == head and keep == n and not positions:
            return None
        return PointsUpdate(new_head, keep, tuple(added), tuple(positions))

    async def _common_prefix(self, head: PointsHead | None, view: ConversationView, n: int) -> int:
        """How many leading points the index and `view` share (the same entries: a chain's
        prefix is fixed by its newest entry, so the match is monotone and bisection finds it)."""
        if head is None:
            return 0
        m = min(head.count, n)
        if not m:
            return 0
        synced = self._synced[0] if self._synced is not None else None

        async def stored(i: int) -> str | None:
            if synced is not None and i < len(synced.points):
                return synced.prompt_entry(i).uuid  # the index holds what it was made from
            return await self._ledger.point_uuid(self._session_id, i)

        if await stored(m - 1) == view.prompt_entry(m - 1).uuid:
            return m
        lo, hi = 0, m - 1  # the first lo match; hi does not
        while lo < hi:
            mid = (lo + hi) // 2
            if await stored(mid) == view.prompt_entry(mid).uuid:
                lo = mid + 1
            else:
                hi = mid
        return lo

    async def record(self, *, touch: bool = False) -> datetime | None:
        """Makes the index show the session's view, in one transaction (with `touch`, the
        session's update_time too, which it returns and the worker keeps)."""
        async with self._lock:
            return await self._record(touch)

    async def _record(self, touch: bool) -> datetime | None:
        view = await self._transcript.view()
        index = self._transcript.index()
        covered, cut, holds = index.size, self._transcript.cut, self._holds_newest()
        if self._synced == (view, covered, cut, holds) and not touch:
            return None
        update = await self.update_for(view, index.path, covered, cut, holds)
        if update is None:
            self._synced = (view, covered, cut, holds)
            stamp = await self._ledger.touch_session(self._session_id) if touch else None
        else:
            faults.point("points.recording")
            # A turn's record is as durable as the turn; a read's catch-up need not be.
            stamp = await self._ledger.record_points(update, touch=touch, durable=touch)
            self.applied(update, view, covered, cut)
        if stamp is not None:
            self._state.update_time = stamp
        return stamp

    async def current_head(self) -> PointsHead:
        """`current`, then the head it left (the session's point count and newest message)."""
        await self.current()
        head = await self.head()
        assert head is not None, "an index exists once it is current"
        return head

    async def current_quietly(self) -> None:
        """`current`, for a caller whose own work is done whatever happens here: a failure is
        logged, and the next read writes the index instead."""
        try:
            await self.current()
        except Exception as err:
            self._log.warning("could not record the points index", error=str(err))

    @contextlib.asynccontextmanager
    async def cutting(self, leaf: str | None) -> AsyncIterator[PointsUpdate | None]:
        """The update a cut at `leaf` makes to the index (None: none, or no cut), for the
        transaction that commits the cut (a rewind's, an undo's) to write; kept as the index's
        once the body returns. No other write of the index comes between."""
        if leaf is None:
            yield None
            return
        async with self._lock:
            # Read up to date (a recovery at start may not have read the transcript yet).
            index = await self._transcript.catch_up()
            view, covered = index.view(leaf), index.size
            update = await self.update_for(view, index.path, covered, leaf, self._holds_newest())
            yield update
            if update is not None:
                self.applied(update, view, covered, leaf)

    def soon(self) -> None:
        """`current_quietly` in the background (after exclusive work: a files rewind's process
        let go, say), never holding up the caller."""
        tasks.detach(self.current_quietly(), name=f"points-{self._session_id}")

    async def current(self) -> None:
        """Brings the index up to date before a read: from the view once the transcript is in
        memory, else from the head and the transcript's tail (`refresh`)."""
        async with self._lock:
            if self._transcript.loaded:
                await self._record(False)
                return
            path = self._transcript.index().path
            await self._refresh(path, self._holds_newest())

    # Without a view: from the head and the transcript's tail (a start, a wake, a takeover)

    async def _refresh(self, path: Path, holds: bool) -> None:
        """Brings the index up to date with the transcript without reading all of it: nothing
        when the transcript has not grown since the index covered it, its tail when it has; a
        whole read for whatever the tail cannot settle."""
        head = await self.head()
        try:
            size = os.stat(path).st_size  # a stat: too small to leave the loop for
        except FileNotFoundError:
            size = 0
        if head is not None and self._checked == size and head.holds_newest == holds:
            return
        update = await self._tail_update(head, path, size, holds)
        if update is False:
            if head is None:  # a session's first read of the index (or one from before it)
                await self._record(False)
                return
            self.rebuilds += 1
            self._log.info("points index rebuilt from the whole transcript", covered=head.covered)
            await self._record(False)
            return
        if update is not None:
            faults.point("points.recording")
            await self._ledger.record_points(update, durable=False)
            self.applied(update, None, update.head.covered, update.head.cut)
        self._checked = size

    async def _tail_update(
        self, head: PointsHead | None, path: Path, size: int, holds: bool
    ) -> PointsUpdate | Literal[False] | None:  # gremlin: pardon[equivalent] an annotation, never evaluated
        """The update the transcript's tail makes; None: none needed; False: read it whole."""
        if head is None:
            return False
        anchor = await self._ledger.anchor(self._session_id)
        if (anchor.anchor_uuid if anchor is not None else "") != head.cut:
            return False  # a cut the index was not written with
        if size < head.covered or digest(path, head.covered) != head.digest:
            return False  # another file than the one the index was made from
        if size == head.covered:
            if head.holds_newest == holds:
                return None
            return PointsUpdate(replace(head, holds_newest=holds), keep=head.count)
        seed = head.seed
        read = functools.partial(
            read_tail,
            path,
            head.covered,
            _seed_entries(seed),
            head.snapshot_count,
            str(seed.get("newest") or ""),
            seed.get("newest_position"),
            SEED_ANCESTORS + 1,
        )
        # A large tail (a start after a long absence) in a thread, as the view's reads are.
        tail = await asyncio.to_thread(read) if size - head.covered > READ_INLINE_BYTES else read()
        if tail is None:
            return False
        leaf = tail.leaf
        if head.cut and (leaf.uuid if leaf is not None else "") != head.leaf:
            return False  # the conversation went on after a pending cut: the view decides
        added = tuple(row_of(e, parent, tail.positions.get(e.uuid)) for e, parent in tail.prompts)
        newest = str(seed.get("newest") or "")
        positions: tuple[tuple[str, int], ...] = ()
        newest_position = seed.get("newest_position")
        if newest and newest in tail.positions and tail.keep == head.count:
            positions = ((newest, tail.positions[newest]),)
            newest_position = tail.positions[newest]
        if added:
            newest, newest_position = added[-1].uuid, added[-1].snapshot_pos
        elif tail.keep != head.count:
            newest, newest_position = "", None
        return PointsUpdate(
            PointsHead(
                session_id=self._session_id,
                covered=tail.covered,
                digest=digest(path, tail.covered),
                leaf=leaf.uuid if leaf is not None else "",
                seed=_seed(tail.seeds, newest, newest_position),
                count=tail.keep + len(added),
                last_message_id=tail.last_message_id,
                snapshot_count=tail.snapshot_count,
                leaf_compactions=leaf.compactions if leaf is not None else 0,
                holds_newest=holds,
                cut=head.cut,
            ),
            keep=tail.keep,
            added=added,
            positions=positions,
        )


async def page(
    ledger: PointIndex, session_id: str, start: int, size: int
) -> tuple[PointsHead, list[RewindPoint]] | None:
    """A page of a session's points from its index, with the head it was read with (None: the
    session has no index)."""
    found = await ledger.points_page(session_id, start, size)
    if found is None:
        return None
    head, rows = found
    return head, [point_of(row, head) for row in rows]
