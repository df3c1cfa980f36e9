"""A rewind's files through the CLI's checkpoints (its file history), for a session or a point
the workspace snapshots do not serve:

- planned (`plan`): without the CLI when the files it may change are few and small (they are read
  now, and what changed is seen after: rewind/checkpoints.py `look`); else by the CLI's own dry
  run, with the files the service puts right after it (`checkpoints.planned`); narrowed to some
  paths, by the service alone, since the CLI's restore takes every file (`checkpoints.chosen`);
- restored (`restore`): by the CLI's `rewind_files` and the service's fixes after it, or, narrowed,
  by the service alone from the CLI's backups. Both are idempotent: an interrupted rewind is
  restored again before anything else happens on its session.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import structlog

from agent_rewind.errors import (
    AgentUnavailable,
    CheckpointingDisabled,
    FileCheckpointUnavailable,
    FilesUnavailable,
)
from agent_rewind.rewind import checkpoints
from agent_rewind.rewind.calls import RewindRequest
from agent_rewind.rewind.intent import Intent
from agent_rewind.rewind.outcome import FilesHalf, refuse
from agent_rewind.rewind.session import RewindSession
from agent_rewind.sessions.turn_events import FilesAnswer
from agent_rewind.snapshots.errors import UnsafePath
from agent_rewind.store.ledger import Ledger, RewindRecord, SessionRecord
from agent_rewind.transcript.entries import RewindPoint
from agent_rewind.transcript.index import ConversationView

log = structlog.get_logger(__name__)


class CheckpointFiles:
    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    async def plan(
        self,
        worker: RewindSession,
        session: SessionRecord,
        view: ConversationView,
        point: RewindPoint,
        req: RewindRequest,
        *,
        preview: bool,
    ) -> tuple[FilesHalf, checkpoints.Files | None]:
        """The files half, and the files as they are now when it was planned without the CLI
        (what it changed is seen against them once applied); `preview`: a dry run, which the
        CLI's own preview serves."""
        if not session.checkpointing:
            return FilesHalf(True, refusal=refuse(CheckpointingDisabled(worker.session_id))), None
        if req.paths:
            return await self._narrowed(worker, session, view, point, req.paths), None
        looked = None if preview else await self._look(session.cwd, view, point)
        if looked is not None:
            # Planned without the CLI: the files it may change, kept for an undo; what it did
            # change is seen once it has (engine `_finish`).
            return FilesHalf(True, True, tuple(str(Path(session.cwd) / p) for p in looked)), looked
        answer = await worker.rewind_files(point.message_id, dry_run=True)
        if not answer.can_rewind:
            err = FileCheckpointUnavailable(point.message_id, answer.error or "the CLI cannot rewind files")
            return FilesHalf(True, refusal=refuse(err)), None
        # Files the CLI would leave as a dropped branch wrote them are listed too.
        root = Path(session.cwd)
        planned = checkpoints.planned(view, point, root, worker.file_history)
        fixes = await asyncio.to_thread(checkpoints.needed, planned, root)
        listed = checkpoints.without_links(answer.files_changed)
        extra = tuple(str(f.path) for f in fixes if str(f.path) not in set(listed))
        # Its counts are of every file it listed, links' targets too: not told then.
        counted = listed == answer.files_changed
        half = FilesHalf(
            True,
            True,
            listed + extra,
            answer.insertions if counted else 0,
            answer.deletions if counted else 0,
            answer.skipped_links,
        )
        return half, None

    @staticmethod
    async def _narrowed(
        worker: RewindSession,
        session: SessionRecord,
        view: ConversationView,
        point: RewindPoint,
        paths: tuple[str, ...],
    ) -> FilesHalf:
        """Narrowed to `paths`: the files under them the service writes from the CLI's backups, as
        they were just before the point (symbolic links left, as the CLI's restore leaves them)."""
        if not point.has_checkpoint or point.checkpoint_pending:
            why = (
                "its checkpoint is not in the transcript yet (the CLI writes the newest prompt's "
                "lazily); try again after the next turn"
                if point.checkpoint_pending
                else "No file checkpoint found for this message."
            )
            return FilesHalf(True, refusal=refuse(FileCheckpointUnavailable(point.message_id, why)))
        root = Path(session.cwd)
        fixes = checkpoints.chosen(view, point, root, worker.file_history, paths)
        try:
            found = await asyncio.to_thread(checkpoints.narrowed, fixes, root)
        except (OSError, UnsafePath) as err:
            raise FilesUnavailable(f"the files to restore could not be read: {err}") from err
        return FilesHalf(
            True,
            True,
            tuple(str(fix.path) for fix in found.fixes),
            found.insertions,
            found.deletions,
            found.skipped_links,
        )

    @staticmethod
    async def _look(
        workspace_dir: str, view: ConversationView, point: RewindPoint
    ) -> checkpoints.Files | None:
        """The files a rewind to `point` from the CLI's checkpoints may change, as they are now
        (read in a thread); None when the CLI's dry run must plan it (see checkpoints.py)."""
        if not point.has_checkpoint or point.checkpoint_pending:
            return None  # the CLI's answer says why, or the process holding it serves it
        cwd = Path(workspace_dir)
        paths = checkpoints.tracked(view, cwd)
        if paths is None:
            return None
        # (with the files `checkpoints.planned` puts right)
        return await asyncio.to_thread(checkpoints.look, cwd, paths)

    async def restore(
        self,
        worker: RewindSession,
        session: SessionRecord,
        record: RewindRecord,
        intent: Intent,
        view: ConversationView,
    ) -> FilesHalf:
        """Restores the files of a recorded intent; the files half as the restore tells it."""
        files = intent.outcome.files
        cwd = Path(session.cwd)
        point = view.resolve(intent.target)
        if intent.narrows_checkpoints:
            # The CLI's restore takes every file: the chosen ones are written from its backups.
            fixes = checkpoints.chosen(view, point, cwd, worker.file_history, intent.paths)
            await asyncio.to_thread(checkpoints.apply_narrowed, fixes, cwd)
            return files
        answer = await self._restore_files(worker, record, intent.target)
        fixes = checkpoints.planned(view, point, cwd, worker.file_history)
        await asyncio.to_thread(checkpoints.apply, fixes, cwd)
        return replace(files, skipped_links=answer.skipped_links)

    async def _restore_files(self, worker: RewindSession, record: RewindRecord, target: str) -> FilesAnswer:
        """Restores the files of a recorded intent. A process that fails mid-request leaves the
        outcome unknown: restoring is idempotent, so it is asked again in a new process. When that
        fails too, the intent stays pending and is resolved before anything else happens on the
        session."""
        try:
            answer = await worker.rewind_files(target, dry_run=False)
        except AgentUnavailable as err:
            log.warning(
                "files restore outcome unknown; restoring again",
                rewind_id=record.rewind_id,
                error=err.message,
            )
            answer = await worker.rewind_files(target, dry_run=False)
        if not answer.can_rewind:
            # A definite refusal: the CLI restored nothing.
            await self._ledger.abandon_rewind(record.rewind_id)
            raise FileCheckpointUnavailable(target, answer.error or "the CLI cannot rewind files")
        return answer
