"""The registry of sessions: creates them, finds them, lists them, and stops them all.

What else is done to the sessions it holds lives beside it, and it delegates: DeleteSession to
`erasure.Deletions`, ForkSession to `forking.Forks`, which stored sessions it serves to
`loading`, where a workspace may be to `workspace_paths`, the request-id rule to `requests`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC
from pathlib import Path
from typing import Any

import structlog

from agent_rewind import logs, retries, workspace_paths
from agent_rewind.access import Principal
from agent_rewind.config import Config
from agent_rewind.errors import (
    AgentUnavailable,
    LiveSessionsExhausted,
    QuotaExceeded,
    SessionAlreadyExists,
    SessionNotFound,
    ShuttingDown,
)
from agent_rewind.replicas import Elsewhere, Owners
from agent_rewind.sessions import loading
from agent_rewind.sessions import options as session_options
from agent_rewind.sessions.erasure import Deletions
from agent_rewind.sessions.forking import Forks
from agent_rewind.sessions.new_session import NewSessionRequest as NewSessionRequest
from agent_rewind.sessions.worker import SessionWorker, State, WorkerContext
from agent_rewind.store.ledger import (
    EventRecord,
    Ledger,
    NewRequest,
    NewSession,
    RequestIdTaken,
    SessionRecord,
)
from agent_rewind.transcript.paths import transcript_path

log = structlog.get_logger(__name__)


def page_key(worker: SessionWorker) -> tuple[str, str]:
    """A session's place in the newest-first listing: (create time in UTC ISO 8601, id)."""
    created = worker.record.create_time.astimezone(UTC).isoformat(timespec="microseconds")
    return created, worker.session_id


class SessionRegistry:
    def __init__(
        self,
        *,
        config: Config,
        ledger: Ledger,
        ctx: WorkerContext,
        publish: Callable[[EventRecord], None] | None = None,
        owners: Owners | None = None,
    ) -> None:
        """`publish`: told of every event the registry commits (SESSION_DELETED), after the
        commit (the event hub). `owners`: which replica owns the sessions this one does not hold
        (None: a registry of its own)."""
        self._config = config
        # New sessions snapshot their workspace unless they say otherwise (and the server can).
        self.workspace_snapshots_default = config.workspace_snapshots and ctx.snapshots is not None
        self._ledger = ledger
        self._ctx = dataclasses.replace(ctx, admit_turn=self._admit_turn)
        self._workers: dict[str, SessionWorker] = {}
        self.owners = owners
        self._create_lock = asyncio.Lock()
        self._shutting_down = False
        self.operator = session_options.OperatorOptions(
            allow_bypass_permissions=config.allow_bypass_permissions,
            allow_stdio_mcp=config.allow_stdio_mcp,
            mcp_hosts=frozenset(h.lower() for h in config.mcp_hosts),
            sandbox_hosts=tuple(config.sandbox_allow_hosts) if config.sandbox == "on" else None,
        )
        self._deletions = Deletions(
            config=config,
            ledger=ledger,
            claude_config_dir=ctx.claude_config_dir,
            snapshots=ctx.snapshots,
            replica_id=ctx.replica_id,
            find=self.get,
            drop=self._drop,
            publish=publish,
            owners=owners,
        )
        self._forks = Forks(
            ledger=ledger, snapshots=ctx.snapshots, claude_config_dir=config.claude_config_dir, sessions=self
        )

    async def load(self) -> None:
        """Registers every session this replica owns, once the deletions a crash interrupted
        are finished (sessions/loading.py)."""
        await loading.load(
            self._ledger,
            replica_id=self._ctx.replica_id,
            embedded=not self._config.database_url,
            finish=self._deletions.finish,
            register=self._register_checked,
        )

    async def adopt(self, session_ids: list[str]) -> list[SessionWorker]:
        """Registers sessions this replica just took over from one whose lease ran out (on
        storage every replica mounts), and finishes the erasures it left unfinished. Returns
        the new workers (the rewind engine finishes their interrupted rewinds)."""
        return await loading.adopt(
            self._ledger,
            session_ids,
            held=self._workers.__contains__,
            finish=self._deletions.finish,
            register=self._register_checked,
        )

    def _register_checked(self, record: SessionRecord) -> SessionWorker | None:
        """Registers a stored session, as it may be served now (none if it may not be)."""
        servable = loading.servable(record, roots=self._config.workspace_roots, operator=self.operator)
        if servable is None:
            return None
        worker = self._register(servable)
        worker.retention.loaded()  # time alone may have pruned its points, or a pass was cut short
        return worker

    def _register(self, record: SessionRecord) -> SessionWorker:
        _register_secrets(record.options)
        worker = SessionWorker(record, self._ctx)
        self._workers[record.session_id] = worker
        return worker

    def _drop(self, worker: SessionWorker) -> None:
        """Forgets a deleted session (unless another worker holds its id now)."""
        if self._workers.get(worker.session_id) is worker:
            del self._workers[worker.session_id]

    def states(self) -> dict[str, int]:
        """How many sessions are in each state (for metrics)."""
        counts = dict.fromkeys((State.IDLE, State.RUNNING, State.HIBERNATED, State.CLOSED), 0)
        for worker in self._workers.values():
            counts[worker.state] += 1
        return counts

    @property
    def workers(self) -> dict[str, SessionWorker]:
        return self._workers

    async def visible(self, session_id: str, principal: Principal) -> str:
        """`session_id`, if the session exists on any replica and `principal` may see it;
        SESSION_NOT_FOUND otherwise (WatchRewindEvents, served by any replica from the log)."""
        if session_id in self._workers:
            return self.get(session_id, principal).session_id
        record = await self._ledger.session(session_id)
        if record is None or not principal.owns(record.principal):
            raise SessionNotFound(session_id)
        return session_id

    async def stored(self, session_id: str, principal: Principal) -> SessionRecord:
        """The ledger's record of a session this replica does not hold (another replica owns
        it), if `principal` may see it; SESSION_NOT_FOUND otherwise."""
        record = await self._ledger.session(session_id)
        if record is None or not principal.owns(record.principal):
            raise SessionNotFound(session_id)
        return record

    async def stored_snapshot_availability(
        self, record: SessionRecord, refs: Sequence[str]
    ) -> Mapping[str, bool]:
        """What `SessionWorker.snapshot_availability` answers on the session's owner, from the
        ledger (the snapshots' order and completeness are all it reads)."""
        snaps = self._ctx.snapshots
        if snaps is None or not record.workspace_snapshots:
            return {}
        return await self._ledger.snapshots_served(record.session_id, refs)

    @property
    def ledger(self) -> Ledger:
        return self._ledger

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
        if self._ctx.reserve is not None:
            self._ctx.reserve.admit(Path(worker.record.cwd))

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

    def resolve_workspace(self, cwd: str, session_id: str, home: str | None = None) -> Path:
        """The absolute workspace for `cwd` (workspace_paths.py): apart from every session's,
        a deleted one's included while its erasure runs."""
        taken = [Path(w.record.cwd) for w in self._workers.values()]
        taken.extend(self._deletions.erasing())
        return workspace_paths.resolve(
            cwd, session_id, roots=self._config.workspace_roots, taken=taken, home=home
        )

    async def create(self, req: NewSessionRequest, *, place: bool = False) -> SessionWorker:
        """A new session on this replica. `place`: it may go to another replica instead
        (--placement): Elsewhere is raised then, before anything is written."""
        options = session_options.validate(req.options, self.operator)
        _register_secrets(options)
        sid = req.session_id or str(uuid.uuid4())
        request = (
            NewRequest(req.request_id, "CreateSession", req.fingerprint(), sid) if req.request_id else None
        )
        async with self._create_lock:
            if self._shutting_down:
                raise ShuttingDown()
            existing = await retries.recorded(self._ledger, request, new_session=True)
            if existing is not None:
                return await self._repeat(existing.session_id)
            if place and self.owners is not None:
                elsewhere = await self.owners.place()
                if elsewhere is not None:
                    raise Elsewhere(elsewhere)
            if sid in self._workers:
                raise SessionAlreadyExists(sid)
            if await self._ledger.tombstone(sid) is not None:
                # A deleted session's id is never used again: watchers saw it deleted for good.
                raise SessionAlreadyExists(sid)
            owned = sum(1 for w in self._workers.values() if w.record.principal == req.principal)
            if owned >= self._config.max_sessions_per_principal:
                raise QuotaExceeded("sessions", self._config.max_sessions_per_principal)
            workspace = self.resolve_workspace(req.cwd, sid, req.workspace_home)
            if self._config.shared_storage:
                # Every replica's sessions have their workspaces on this disk too.
                workspace_paths.check_apart(workspace, [Path(r.cwd) for r in await self._ledger.sessions()])
            if req.fresh_workspace:
                workspace_paths.require_fresh(workspace)
            workspace_paths.make(workspace)
            new = NewSession(
                session_id=sid,
                cwd=str(workspace),
                options=options,
                checkpointing=req.checkpointing,
                principal=req.principal,
                workspace_snapshots=req.workspace_snapshots,
                replica=self._ctx.replica_id,
                forked_from=req.forked_from,
            )
            try:
                record = await self._ledger.add_session(new, request)
            except RequestIdTaken as taken:
                assert request is not None
                return await self._repeat(retries.check(taken.existing, request, new_session=True).session_id)
            if transcript_path(self._config.claude_config_dir, str(workspace), sid).exists():
                # A caller-supplied id of a session this service already has a transcript for.
                await self._ledger.touch_session(sid, started=True)
                record = await self._ledger.session(sid) or record
            worker = SessionWorker(record, self._ctx)
            self._workers[sid] = worker
        log.info("session created", session_id=sid, cwd=str(workspace), checkpointing=req.checkpointing)
        return worker

    async def _repeat(self, session_id: str) -> SessionWorker:
        """A retried CreateSession (the same call: `retries.check`): the session it made, on the
        replica that made it (Elsewhere when that is another)."""
        if session_id not in self._workers and self.owners is not None:
            owner = await self.owners.owner(session_id)
            if owner is not None:
                raise Elsewhere(owner)
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
                await worker.ensure_client(wait=False)  # no creation waits for a slot
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
        # Its points index from the start (a fork's copied points too): any replica serves it.
        await worker.points.current_quietly()

    async def fork(self, source: SessionWorker, message_id: str, req: NewSessionRequest) -> SessionWorker:
        """ForkSession (sessions/forking.py): a new session whose conversation and files are the
        source's just before `message_id` (empty: as they are now)."""
        if self._ctx.reserve is not None:
            self._ctx.reserve.admit(Path(source.record.cwd))
        await source.admit_fork()
        return await self._forks.fork(source, message_id, req)

    async def forget(self, session_id: str) -> None:
        """Removes a session whose creation failed before it was usable."""
        self._workers.pop(session_id, None)
        await self._ledger.remove_session(session_id)

    async def delete(
        self,
        session_id: str,
        *,
        principal: Principal | None = None,
        request_id: str = "",
        delete_workspace: bool = False,
    ) -> None:
        """DeleteSession: erases the session for good (sessions/erasure.py, `Deletions`)."""
        await self._deletions.delete(session_id, principal, request_id, delete_workspace)

    async def abandon(self) -> None:
        """This replica may no longer run its sessions (fenced off, or its lease lost on shared
        storage): every agent ends now, and the sessions are forgotten here, so calls for them
        go to whichever replica owns them now (or answer REPLICA_UNAVAILABLE until one does)."""
        await self.shutdown(0, forget=True)

    async def shutdown(self, grace: float, *, forget: bool = False) -> None:
        """Ends every session's work (`grace`: what a running turn gets); `forget`: and forgets
        them at once, before their processes have ended."""
        self._shutting_down = True
        workers = list(self._workers.values())
        if forget:
            self._workers.clear()
        await self._deletions.stop()
        await asyncio.gather(*(w.shutdown(grace) for w in workers), return_exceptions=True)


def _register_secrets(options: Mapping[str, Any]) -> None:
    """MCP header values are credentials: the logs must never show them."""
    servers = options.get("mcp_servers")
    for config in servers.values() if isinstance(servers, dict) else ():
        for value in (config.get("headers") or {}).values() if isinstance(config, dict) else ():
            logs.secret(str(value))
