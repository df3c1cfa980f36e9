"""A session's view of its transcript: what the CLI wrote, cut where a rewind left it.

The CLI's transcript is read incrementally (`transcript.index`); a conversation rewind's cut lives
in the ledger (an `Anchor`) until a new turn has written it into the transcript itself, and the
view applies it meanwhile. That is what makes a conversation rewind durable the moment it returns:
the ledger lets the cut go only once the transcript holding it is on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import Any

from agent_rewind.store.ledger import Anchor, Ledger
from agent_rewind.transcript import compaction
from agent_rewind.transcript.index import ConversationView, TranscriptIndex
from agent_rewind.transcript.paths import exists, transcript_path

# Transcript reads larger than this run in a thread (a 5,000-turn transcript is about 35 MB).
READ_INLINE_BYTES = 1 << 20


class TranscriptView:
    def __init__(
        self, *, session_id: str, cwd: str, claude_config_dir: Path, ledger: Ledger, log: Any
    ) -> None:
        self._session_id = session_id
        self._cwd = cwd
        self._claude_config_dir = claude_config_dir
        self._ledger = ledger
        self._log = log
        self._index: TranscriptIndex | None = None
        self._read_lock = asyncio.Lock()
        # The pending cut's anchor the last `view()` was cut at ("" none).
        self.cut = ""

    @property
    def loaded(self) -> bool:
        """Whether the transcript was read into memory since the start (or since `forget`)."""
        return self._index is not None and self._index.size > 0

    def index(self) -> TranscriptIndex:
        """The transcript as last read."""
        # Until the CLI has written the file, look again each time: the CLI shortens very long
        # project paths in its own way, which only the file's presence reveals.
        if self._index is None or (self._index.size == 0 and not exists(self._index.path)):
            path = transcript_path(self._claude_config_dir, self._cwd, self._session_id)
            if self._index is None or path != self._index.path:
                self._index = TranscriptIndex(path)
        return self._index

    def forget(self) -> None:
        """Frees the index (a hibernated session's); the next read parses the file again."""
        self._index = None

    async def catch_up(self) -> TranscriptIndex:
        """Reads what the CLI appended to the transcript since the last read.

        A large read (a long session's first) runs in a thread so the event loop, and every
        other session, never waits on it. Reads of one session are serialized.
        """
        index = self.index()
        async with self._read_lock:
            try:
                unread = index.path.stat().st_size - index.size
            except OSError:
                unread = 0
            if unread > READ_INLINE_BYTES:
                await asyncio.to_thread(index.refresh)
            else:
                index.refresh()
        return index

    async def resume_point(self, leaf: str) -> str:
        """The entry the CLI can resume for the conversation ending at `leaf`: itself, or, for a
        leaf before the CLI's newest compaction, the end of a copy of its conversation, written
        now (transcript/compaction.py). Call while no CLI process of the session runs."""
        async with self._read_lock:
            index = self.index()
            await asyncio.to_thread(index.refresh)  # what the process that just ended wrote too
            plan = await asyncio.to_thread(compaction.plan_resume, index, leaf)
            if plan.lines:
                await asyncio.to_thread(compaction.append, index.path, plan.lines)
                self._log.info(
                    "conversation from before a compaction copied to resume", leaf=leaf, at=plan.at
                )
            return plan.at

    async def view(self) -> ConversationView:
        """The visible conversation: the transcript's own, cut at a pending rewind anchor if any.

        A conversation rewind is durable the moment it returns because the cut lives in the
        ledger until a new turn has written it into the transcript itself (and that write is on
        disk: the transcript is fsynced before the ledger lets the cut go).
        """
        index = await self.catch_up()
        anchor = await self._ledger.anchor(self._session_id)
        if anchor is None:
            self.cut = ""
            return index.view()
        if cut_is_in_transcript(index, anchor):
            await asyncio.to_thread(_fsync, index.path)
            await self._ledger.clear_anchor(self._session_id, anchor.anchor_uuid)
            self._log.info("rewind cut now in transcript", anchor=anchor.anchor_uuid)
            self.cut = ""
            return index.view()
        view = index.view(anchor.anchor_uuid)
        self.cut = anchor.anchor_uuid
        return view


def cut_is_in_transcript(index: TranscriptIndex, anchor: Anchor) -> bool:
    """Whether a new turn wrote the cut at `anchor` into the transcript itself."""
    leaf = index.leaf
    entry = index.get(leaf) if leaf else None
    if entry is None or entry.offset < anchor.transcript_size:
        return False
    view = index.view(leaf)
    if not view.contains(anchor.anchor_uuid) or view.contains(anchor.target_message_id):
        return False
    # A whole new turn, not just bookkeeping written on resume.
    return any(
        p.message_id != anchor.target_message_id
        and (e := index.get(p.message_id)) is not None
        and e.offset >= anchor.transcript_size
        for p in view.points[-1:]
    )


def _fsync(path: Path) -> None:
    """Makes the CLI's appends to a file durable (its own writes may still be in the page cache)."""
    with contextlib.suppress(FileNotFoundError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
