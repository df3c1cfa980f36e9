"""The registry of sessions: creates them, finds them, lists them, and stops them all."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from datetime import UTC
from pathlib import Path
from typing import Any

import structlog

from agent_rewind.config import Config
from agent_rewind.errors import (
    AgentUnavailable,
    InvalidArgument,
    RequestIdReused,
    SessionAlreadyExists,
    SessionNotFound,
    ShuttingDown,
    WorkspaceOutsideRoot,
)
from agent_rewind.sessions.adapter import validate_options
from agent_rewind.sessions.worker import ClientFactory, SessionWorker, WorkerContext
from agent_rewind.store.ledger import Ledger
from agent_rewind.transcript.paths import transcript_path

log = structlog.get_logger(__name__)


def page_key(worker: SessionWorker) -> tuple[str, str]:
    """A session's place in the newest-first listing: (create time in UTC ISO 8601, id)."""
    created = worker.record.create_time.astimezone(UTC).isoformat(timespec="microseconds")
    return created, worker.session_id


class SessionRegistry:
    def __init__(
        self, config: Config, ledger: Ledger, client_factory: ClientFactory, cli_env: Mapping[str, str]
    ) -> None:
        self._config = config
        self._ledger = ledger
        self._ctx = WorkerContext(
            ledger=ledger,
            client_factory=client_factory,
            cli_env=cli_env,
            claude_config_dir=config.claude_config_dir,
            idle_timeout=config.idle_timeout,
        )
        self._workers: dict[str, SessionWorker] = {
            r.session_id: SessionWorker(r, self._ctx) for r in ledger.sessions()
        }
        self._create_lock = asyncio.Lock()
        self._shutting_down = False

    @property
    def workers(self) -> dict[str, SessionWorker]:
        return self._workers

    def get(self, session_id: str) -> SessionWorker:
        worker = self._workers.get(session_id)
        if worker is None:
            raise SessionNotFound(session_id)
        return worker

    def all(self) -> list[SessionWorker]:
        """Newest first."""
        return sorted(self._workers.values(), key=page_key, reverse=True)

    def page(self, after: tuple[str, str] | None, size: int) -> tuple[list[SessionWorker], bool]:
        """Up to `size` sessions, newest first, strictly after the key `after` (create time in ISO
        8601, session id); and whether more follow. A keyset, so sessions created between two
        pages neither repeat nor push others out of the next page."""
        ordered = self.all()
        if after is not None:
            ordered = [w for w in ordered if page_key(w) < after]
        return ordered[:size], len(ordered) > size

    def resolve_workspace(self, cwd: str, session_id: str) -> Path:
        """The absolute workspace for `cwd`, refused when it resolves outside every root."""
        roots = self._config.workspace_roots
        if "\x00" in cwd:
            raise InvalidArgument("cwd", "must not contain NUL characters")
        if not cwd:
            path = self._config.default_workspace_root / session_id
        else:
            given = Path(cwd).expanduser()
            path = given if given.is_absolute() else self._config.default_workspace_root / given
        # resolve() follows symlinks and `..`, so neither can lead out of a root.
        resolved = path.resolve()
        if not any(resolved == r or resolved.is_relative_to(r) for r in roots):
            raise WorkspaceOutsideRoot(cwd or str(path), [str(r) for r in roots])
        if resolved.exists() and not resolved.is_dir():
            raise InvalidArgument("cwd", f"{resolved} exists and is not a directory")
        return resolved

    async def create(
        self,
        *,
        cwd: str,
        session_id: str,
        options: dict[str, Any],
        checkpointing: bool,
        request_id: str,
    ) -> SessionWorker:
        """`session_id` and `request_id` are canonical UUIDs or empty (the RPC layer checks them)."""
        sid = session_id or str(uuid.uuid4())
        rid = request_id or None
        validate_options(options)
        async with self._create_lock:
            if self._shutting_down:
                raise ShuttingDown()
            if rid is not None:
                existing = self._ledger.session_by_request(rid)
                if existing is not None:
                    same = (not session_id or existing.session_id == sid) and existing.options == options
                    if not same or existing.checkpointing != checkpointing:
                        raise RequestIdReused(rid)
                    return self.get(existing.session_id)
            if sid in self._workers:
                raise SessionAlreadyExists(sid)
            workspace = self.resolve_workspace(cwd, sid)
            workspace.mkdir(parents=True, exist_ok=True)
            record = self._ledger.add_session(sid, str(workspace), options, checkpointing, rid)
            if transcript_path(self._config.claude_config_dir, str(workspace), sid).exists():
                # A caller-supplied id of a session this service already has a transcript for.
                self._ledger.touch_session(sid, started=True)
                record = self._ledger.session(sid) or record
            worker = SessionWorker(record, self._ctx)
            self._workers[sid] = worker
        log.info("session created", session_id=sid, cwd=str(workspace), checkpointing=checkpointing)
        return worker

    async def start(self, worker: SessionWorker) -> None:
        """Starts a new session's CLI now, so a session that cannot run fails at creation.

        A creation whose CLI cannot start is forgotten; a retry of it (same request_id) that
        waited meanwhile fails too instead of starting a process for a forgotten session.
        """
        if worker.turn_running:
            return  # a retried creation of a session already in use
        try:
            async with worker.exclusive():
                if self._workers.get(worker.session_id) is not worker:
                    raise AgentUnavailable(worker.session_id, "its creation failed; create it again")
                await worker.ensure_client()
        except Exception:
            if not worker.record.started and self._workers.get(worker.session_id) is worker:
                self.forget(worker.session_id)
            raise

    def forget(self, session_id: str) -> None:
        """Removes a session whose creation failed before it was usable."""
        self._workers.pop(session_id, None)
        self._ledger.remove_session(session_id)

    async def shutdown(self, grace: float) -> None:
        self._shutting_down = True
        await asyncio.gather(*(w.shutdown(grace) for w in self._workers.values()), return_exceptions=True)
