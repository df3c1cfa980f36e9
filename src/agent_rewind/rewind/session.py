"""What a rewind asks of the session it rewinds: one narrow interface (`sessions/worker.py`'s
`SessionWorker` is the one the server hands the engine; the engine's tests use a small fake).

Plan: hold the session (`exclusive`), read its transcript and what its commands reached. Apply:
the CLI's own file restore (`rewind_files`), the process told of the cut (`cut_conversation`) or
of turns brought back (`conversation_restored`). Record: the points index's update for the
transaction that commits the cut (`cutting`). Everything else a rewind does is its own (the
ledger, the snapshots, the files).
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Protocol

from agent_rewind.sessions.turn_events import FilesAnswer
from agent_rewind.store.ledger import EgressRecord, PointsUpdate, SessionRecord
from agent_rewind.transcript.index import Reading


class RewindSession(Protocol):
    session_id: str
    record: SessionRecord
    # Where the CLI keeps the session's file backups (its checkpoints' content).
    file_history: Path

    def exclusive(self) -> AbstractAsyncContextManager[SessionRecord]:
        """The session held for a rewind, and its record as it is while held: TURN_IN_FLIGHT at
        once while a turn runs, never queued; SESSION_NOT_FOUND once it is being deleted."""
        ...

    async def transcript(self) -> Reading:
        """The transcript read up to date: the visible conversation (cut where a pending rewind
        left it) and the whole index (other leaves' views, its size)."""
        ...

    async def egress(self) -> list[EgressRecord]:
        """The hosts the session's commands reached, every turn's."""
        ...

    async def rewind_files(self, message_id: str, *, dry_run: bool) -> FilesAnswer:
        """The CLI's own files rewind to `message_id` (or its preview)."""
        ...

    def cutting(self, leaf: str | None) -> AbstractAsyncContextManager[PointsUpdate | None]:
        """The points index's update for a cut at `leaf`, for the transaction that commits it."""
        ...

    async def cut_conversation(self, target: str) -> None:
        """The live process cut just before the prompt `target` (after the cut is committed)."""
        ...

    def conversation_restored(self) -> None:
        """An undo brought dropped turns back: the live process is replaced."""
        ...
