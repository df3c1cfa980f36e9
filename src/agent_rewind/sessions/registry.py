"""The registry of sessions: creates them, finds them, lists them, and stops them all."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from typing import Any

import structlog

from agent_rewind import logs
from agent_rewind.access import Principal
from agent_rewind.config import Config
from agent_rewind.errors import (
    AgentUnavailable,
    InvalidArgument,
    LiveSessionsExhausted,
    QuotaExceeded,
    RequestIdReused,
    SessionAlreadyExists,
    SessionNotFound,
    ShuttingDown,
    WorkspaceInUse,
    WorkspaceOutsideRoot,
)
from agent_rewind.sessions import options as session_options
from agent_rewind.sessions.worker import SessionWorker, State, WorkerContext
from agent_rewind.store.ledger import Ledger, NewRequest, NewSession, RequestIdTaken, dumps
from agent_rewind.transcript.paths import transcript_path

log = structlog.get_logger(__name__)


def page_key(worker: SessionWorker) -> tuple[str, str]:
    """A session's place in the newest-first listing: (create time in UTC ISO 8601, id)."""
    created = worker.record.create_time.astimezone(UTC).isoformat(timespec="microseconds")
    return created, worker.session_id


@dataclass(frozen=True)
class NewSessionRequest:
    """CreateSession's arguments, checked by the RPC layer (ids are canonical UUIDs or empty)."""

    cwd: str
    session_id: str
    options: dict[str, Any]
    checkpointing: bool
    workspace_snapshots: bool
    request_id: str
    principal: str = ""

    def fingerprint(self) -> str:
        return dumps(
            [
                self.cwd,
                self.session_id,
                self.options,
                self.checkpointing,
                self.workspace_snapshots,
                self.principal,
            ]
        )


class SessionRegistry:
    def __init__(self, config: Config, ledger: Ledger, ctx: WorkerContext) -> None:
        self._config = config
        # New sessions snapshot their workspace unless they say otherwise (and the server can).
        self.workspace_snapshots_default = config.workspace_snapshots and ctx.snapshots is not None
        self._ledger = ledger
        self._ctx = dataclasses.replace(ctx, admit_turn=self._admit_turn)
        self._workers: dict[str, SessionWorker] = {}
        self._create_lock = asyncio.Lock()
        self._shutting_down = False
        self.operator = session_options.OperatorOptions(
            allow_bypass_permissions=config.allow_bypass_permissions,
            allow_stdio_mcp=config.allow_stdio_mcp,
            mcp_hosts=frozenset(h.lower() for h in config.mcp_hosts),
        )

    async def load(self) -> None:
        """Registers every session the ledger holds (none has a live process yet).

        Stored options are checked again: what an older version (or a withdrawn operator opt-in)
        let through and the allowlist now refuses is not passed to the CLI any more.
        """
        for record in await self._ledger.sessions():
            options, dropped = session_options.sanitize(record.options, self.operator)
            if dropped:
                log.warning(
                    "stored options no longer allowed are not used",
                    session_id=record.session_id,
                    keys=dropped,
                )
                record = dataclasses.replace(record, options=options)
            _register_secrets(record.options)
            self._workers[record.session_id] = SessionWorker(record, self._ctx)

    def states(self) -> dict[str, int]:
        """How many sessions are in each state (for metrics)."""
        counts = dict.fromkeys((State.IDLE, State.RUNNING, State.HIBERNATED, State.CLOSED), 0)
        for worker in self._workers.values():
            counts[worker.state] += 1
        return counts

    @property
    def workers(self) -> dict[str, SessionWorker]:
        return self._workers

    def get(self, session_id: str, principal: Principal | None = None) -> SessionWorker:
        """The session; to a principal that may not see it (not its owner, not admin) it does not
        exist: the same SESSION_NOT_FOUND, no hint."""
        worker = self._workers.get(session_id)
        if worker is None or (principal is not None and not principal.owns(worker.record.principal)):
            raise SessionNotFound(session_id)
        return worker

    def _admit_turn(self, worker: SessionWorker) -> None:
        owner = worker.record.principal
        limit = self._config.max_running_turns_per_principal
        running = sum(1 for w in self._workers.values() if w.turn_running and w.record.principal == owner)
        if running >= limit:
            raise QuotaExceeded("running_turns", limit)

    def all(self, principal: Principal | None = None) -> list[SessionWorker]:
        """Newest first; only those `principal` may see, if given."""
        workers = list(self._workers.values())
        if principal is not None and not principal.admin:
            workers = [w for w in workers if w.record.principal == principal.name]
        return sorted(workers, key=page_key, reverse=True)

    def page(
        self, after: tuple[str, str] | None, size: int, principal: Principal | None = None
    ) -> tuple[list[SessionWorker], bool]:
        """Up to `size` sessions, newest first, strictly after the key `after` (create time in ISO
        8601, session id); and whether more follow. A keyset, so sessions created between two
        pages neither repeat nor push others out of the next page."""
        ordered = self.all(principal)
        if after is not None:
            ordered = [w for w in ordered if page_key(w) < after]
        return ordered[:size], len(ordered) > size

    def resolve_workspace(self, cwd: str, session_id: str) -> Path:
        """The absolute workspace for `cwd`: inside a root, not a root, and no other session's."""
        roots = self._config.workspace_roots
        if "\x00" in cwd:
            raise InvalidArgument("cwd", "must not contain NUL characters")
        if len(cwd) > 4096:
            raise InvalidArgument("cwd", "must be at most 4096 characters")
        # resolve() follows symlinks and `..`, so neither can lead out of a root.
        try:
            if not cwd:
                path = self._config.default_workspace_root / session_id
            else:
                # `~user` of a user the server's host does not know cannot be expanded.
                given = Path(cwd).expanduser()
                path = given if given.is_absolute() else self._config.default_workspace_root / given
            resolved = path.resolve()
        except (OSError, RuntimeError) as err:
            raise InvalidArgument("cwd", f"cannot be resolved: {err}") from None
        if not any(resolved.is_relative_to(r) for r in roots):
            raise WorkspaceOutsideRoot(cwd or str(path), [str(r) for r in roots])
        if resolved in roots:
            raise WorkspaceInUse(str(resolved), "is a workspace root; a session's workspace lies below one")
        for other in self._workers.values():
            theirs = Path(other.record.cwd)
            if resolved == theirs:
                raise WorkspaceInUse(str(resolved), "is another session's workspace")
            if theirs.is_relative_to(resolved):
                raise WorkspaceInUse(str(resolved), "contains another session's workspace")
            if resolved.is_relative_to(theirs):
                raise WorkspaceInUse(str(resolved), "lies inside another session's workspace")
        if resolved.exists() and not resolved.is_dir():
            raise InvalidArgument("cwd", f"{resolved} exists and is not a directory")
        return resolved

    async def create(self, req: NewSessionRequest) -> SessionWorker:
        options = session_options.validate(req.options, self.operator)
        _register_secrets(options)
        sid = req.session_id or str(uuid.uuid4())
        request = (
            NewRequest(req.request_id, "CreateSession", req.fingerprint(), sid) if req.request_id else None
        )
        async with self._create_lock:
            if self._shutting_down:
                raise ShuttingDown()
            if request is not None:
                existing = await self._ledger.request(request.request_id)
                if existing is not None:
                    return self._repeat(existing.method, existing.fingerprint, existing.session_id, request)
            if sid in self._workers:
                raise SessionAlreadyExists(sid)
            owned = sum(1 for w in self._workers.values() if w.record.principal == req.principal)
            if owned >= self._config.max_sessions_per_principal:
                raise QuotaExceeded("sessions", self._config.max_sessions_per_principal)
            workspace = self.resolve_workspace(req.cwd, sid)
            workspace.mkdir(parents=True, exist_ok=True)
            new = NewSession(
                session_id=sid,
                cwd=str(workspace),
                options=options,
                checkpointing=req.checkpointing,
                principal=req.principal,
                workspace_snapshots=req.workspace_snapshots,
            )
            try:
                record = await self._ledger.add_session(new, request)
            except RequestIdTaken as taken:
                assert request is not None
                existing_request = taken.existing
                return self._repeat(
                    existing_request.method,
                    existing_request.fingerprint,
                    existing_request.session_id,
                    request,
                )
            if transcript_path(self._config.claude_config_dir, str(workspace), sid).exists():
                # A caller-supplied id of a session this service already has a transcript for.
                await self._ledger.touch_session(sid, started=True)
                record = await self._ledger.session(sid) or record
            worker = SessionWorker(record, self._ctx)
            self._workers[sid] = worker
        log.info("session created", session_id=sid, cwd=str(workspace), checkpointing=req.checkpointing)
        return worker

    def _repeat(self, method: str, fingerprint: str, session_id: str, request: NewRequest) -> SessionWorker:
        """A retried CreateSession: the session it made, if it is the same call."""
        if method != request.method or fingerprint != request.fingerprint:
            raise RequestIdReused(request.request_id)
        # With no session_id asked for, the retry is the first call whatever id it got.
        return self.get(session_id)

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
        except LiveSessionsExhausted:
            # Every live slot runs a turn: the session is created hibernated; its first use
            # starts it (or says LIVE_SESSIONS_EXHAUSTED, retryable, if still none is free).
            log.info(
                "session created without a process: every live slot is busy", session_id=worker.session_id
            )
        except Exception:
            if not worker.record.started and self._workers.get(worker.session_id) is worker:
                await self.forget(worker.session_id)
            raise

    async def forget(self, session_id: str) -> None:
        """Removes a session whose creation failed before it was usable."""
        self._workers.pop(session_id, None)
        await self._ledger.remove_session(session_id)

    async def shutdown(self, grace: float) -> None:
        self._shutting_down = True
        await asyncio.gather(*(w.shutdown(grace) for w in self._workers.values()), return_exceptions=True)


def _register_secrets(options: Mapping[str, Any]) -> None:
    """MCP header values are credentials: the logs must never show them."""
    servers = options.get("mcp_servers")
    for config in servers.values() if isinstance(servers, dict) else ():
        for value in (config.get("headers") or {}).values() if isinstance(config, dict) else ():
            logs.secret(str(value))
