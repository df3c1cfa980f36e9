"""The registry of sessions: creates them, finds them, lists them, deletes them, and stops them all."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from typing import Any

import structlog

from agent_rewind import faults, logs, tasks
from agent_rewind.access import Principal
from agent_rewind.config import Config
from agent_rewind.errors import (
    AgentRewindError,
    AgentUnavailable,
    FilesUnavailable,
    LiveSessionsExhausted,
    QuotaExceeded,
    RequestIdReused,
    SessionAlreadyExists,
    SessionNotFound,
    ShuttingDown,
    SnapshotUnavailable,
)
from agent_rewind.replicas import Elsewhere, Owners
from agent_rewind.sessions import erasure, forking, workspaces
from agent_rewind.sessions import options as session_options
from agent_rewind.sessions.worker import SessionWorker, State, WorkerContext
from agent_rewind.snapshots import RestoreError, SnapshotStore
from agent_rewind.store.ledger import (
    EventRecord,
    Ledger,
    NewEvent,
    NewRequest,
    NewSession,
    RequestIdTaken,
    SessionRecord,
    Tombstone,
    dumps,
)
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
    # The directory the caller's workspaces lie under in each root (authentication on, not an
    # admin: sessions/workspaces.py); None: anywhere under a root.
    workspace_home: str | None = None
    # A fork: the workspace must be new or empty (the fork writes into it).
    fresh_workspace: bool = False

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
    def __init__(
        self,
        config: Config,
        ledger: Ledger,
        ctx: WorkerContext,
        publish: Callable[[EventRecord], None] | None = None,
    ) -> None:
        self._config = config
        # Told of every event the registry commits (SESSION_DELETED), after the commit: the event hub.
        self._publish = publish
        # Deletions in progress, by session: a second DeleteSession waits for the first's outcome.
        self._deletions: dict[str, asyncio.Task[None]] = {}
        # Workspaces of deleted sessions whose files are being erased: no new session takes one
        # until then (its erasure would delete what the new session put there).
        self._erasing: dict[str, str] = {}
        # New sessions snapshot their workspace unless they say otherwise (and the server can).
        self.workspace_snapshots_default = config.workspace_snapshots and ctx.snapshots is not None
        self._ledger = ledger
        self._ctx = dataclasses.replace(ctx, admit_turn=self._admit_turn)
        self._workers: dict[str, SessionWorker] = {}
        # Which replica owns the sessions this one does not hold (None: a registry of its own).
        self.owners: Owners | None = None
        self._create_lock = asyncio.Lock()
        self._shutting_down = False
        self.operator = session_options.OperatorOptions(
            allow_bypass_permissions=config.allow_bypass_permissions,
            allow_stdio_mcp=config.allow_stdio_mcp,
            mcp_hosts=frozenset(h.lower() for h in config.mcp_hosts),
            sandbox_hosts=tuple(config.sandbox_allow_hosts) if config.sandbox == "on" else None,
        )

    async def load(self) -> None:
        """Registers every session this replica owns (none has a live process yet). Sessions
        that name no owner were made by the deployment's only server before replicas were
        recorded: the first replica to start claims them. On an embedded ledger, which one
        server uses, every session is this server's, whatever replica id made it.

        Stored options are checked again: what an older version (or a withdrawn operator opt-in)
        let through and the allowlist now refuses is not passed to the CLI any more. First,
        deletions a crash interrupted after their commit are finished: nothing of a deleted
        session is served, nor left on disk, once the server admits calls.
        """
        me = self._ctx.replica_id
        claimed = await self._ledger.claim_sessions(me, every=not self._config.database_url)
        if claimed:
            log.info("sessions claimed by this replica", count=claimed, replica_id=me)
        for tombstone in await self._ledger.unfinished_erasures():
            if tombstone.replica == me:  # (another's is on its owner's disk)
                await self._finish_erasure(tombstone)
        for record in await self._ledger.sessions():
            if record.replica == me:  # (another's: calls for it are forwarded there)
                self._register_checked(record)

    async def adopt(self, session_ids: list[str]) -> list[SessionWorker]:
        """Registers sessions this replica just took over from one whose lease ran out (on
        storage every replica mounts), and finishes the erasures it left unfinished. Returns
        the new workers (the rewind engine finishes their interrupted rewinds)."""
        adopted = []
        for session_id in session_ids:
            record = await self._ledger.session(session_id)
            if record is None:
                tombstone = await self._ledger.tombstone(session_id)
                if tombstone is not None and tombstone.erasure is not None:
                    await self._finish_erasure(tombstone)
            elif session_id not in self._workers and (worker := self._register_checked(record)):
                adopted.append(worker)
        return adopted

    def _register_checked(self, record: SessionRecord) -> SessionWorker | None:
        """Registers a stored session unless its workspace lies outside every root now."""
        if not workspaces.stored_workspace_allowed(record.cwd, self._config.workspace_roots):
            log.error(
                "a stored session's workspace lies outside every workspace root; it is not served",
                session_id=record.session_id,
                cwd=record.cwd,
            )
            return None
        return self._register(record)

    async def _finish_erasure(self, tombstone: Tombstone) -> None:
        log.warning("finishing the erasure of a deleted session", session_id=tombstone.session_id)
        try:
            await self._erase_files(tombstone.session_id, tombstone.erasure or {})
        except AgentRewindError as err:  # tried again at the next start
            log.error(
                "could not finish erasing a deleted session",
                session_id=tombstone.session_id,
                error=err.message,
            )

    def _register(self, record: SessionRecord) -> SessionWorker:
        options, dropped = session_options.sanitize(record.options, self.operator)
        if dropped:
            log.warning(
                "stored options no longer allowed are not used",
                session_id=record.session_id,
                keys=dropped,
            )
            record = dataclasses.replace(record, options=options)
        _register_secrets(record.options)
        worker = SessionWorker(record, self._ctx)
        self._workers[record.session_id] = worker
        return worker

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

    def resolve_workspace(self, cwd: str, session_id: str, home: str | None = None) -> Path:
        """The absolute workspace for `cwd` (sessions/workspaces.py): apart from every session's,
        a deleted one's included while its erasure runs."""
        taken = [Path(w.record.cwd) for w in self._workers.values()]
        taken.extend(Path(erasing) for erasing in self._erasing.values())
        return workspaces.resolve(cwd, session_id, roots=self._config.workspace_roots, taken=taken, home=home)

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
            if request is not None:
                existing = await self._ledger.request(request.request_id)
                if existing is not None:
                    return await self._repeat(
                        existing.method, existing.fingerprint, existing.session_id, request
                    )
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
                workspaces.check_apart(workspace, [Path(r.cwd) for r in await self._ledger.sessions()])
            if req.fresh_workspace:
                workspaces.require_fresh(workspace)
            workspaces.make(workspace)
            new = NewSession(
                session_id=sid,
                cwd=str(workspace),
                options=options,
                checkpointing=req.checkpointing,
                principal=req.principal,
                workspace_snapshots=req.workspace_snapshots,
                replica=self._ctx.replica_id,
            )
            try:
                record = await self._ledger.add_session(new, request)
            except RequestIdTaken as taken:
                assert request is not None
                existing_request = taken.existing
                return await self._repeat(
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

    async def _repeat(
        self, method: str, fingerprint: str, session_id: str, request: NewRequest
    ) -> SessionWorker:
        """A retried CreateSession: the session it made, if it is the same call (on the replica
        that made it: Elsewhere when that is another)."""
        if method != request.method or fingerprint != request.fingerprint:
            raise RequestIdReused(request.request_id)
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

    async def fork(self, source: SessionWorker, message_id: str, req: NewSessionRequest) -> SessionWorker:
        """ForkSession (sessions/forking.py): a new session whose conversation and files are the
        source's just before `message_id` (empty: as they are now). The source's lock is held
        meanwhile, so no turn changes it while it is copied; it is otherwise untouched. The work
        runs in a task of its own: a caller that hangs up midway leaves a whole fork, not half."""
        return await tasks.shielded(self._fork(source, message_id, req), name=f"fork-{source.session_id}")

    async def _fork(self, source: SessionWorker, message_id: str, req: NewSessionRequest) -> SessionWorker:
        snapshots = self._ctx.snapshots
        async with source.exclusive():
            view = await source.view()
            tree: str | None = None
            if message_id:
                point = view.resolve(message_id)
                leaf = point.anchor or None
                if snapshots is None or not source.record.workspace_snapshots:
                    raise SnapshotUnavailable(
                        point.message_id, "off", "the session takes no workspace snapshots"
                    )
                tree = forking.start_tree(await snapshots.records(source.session_id), point.message_id)
            else:
                leaf = view.leaf
            offsets = source.view_at(leaf).offsets() if leaf else []
            worker = await self.create(
                dataclasses.replace(
                    req,
                    options=dict(source.record.options),
                    checkpointing=source.record.checkpointing,
                    workspace_snapshots=source.record.workspace_snapshots,
                )
            )
            if worker.record.started:
                return worker  # a retry (same request_id) of a fork already made
            cwd = Path(worker.record.cwd)
            try:
                if tree is not None and snapshots is not None:
                    store = SnapshotStore(snapshots.root / f"{source.session_id}.git", cwd)
                    await snapshots.run(lambda: forking.restore_into(store, tree, cwd))
                else:
                    await asyncio.to_thread(forking.copy_workspace, Path(source.record.cwd), cwd)
                if offsets:
                    target = transcript_path(self._config.claude_config_dir, str(cwd), worker.session_id)
                    await asyncio.to_thread(
                        forking.write_transcript,
                        source.transcript_file,
                        target,
                        offsets,
                        worker.session_id,
                        str(cwd),
                        source.record.cwd,
                    )
                    await self._ledger.touch_session(worker.session_id, started=True)
                    worker.record = dataclasses.replace(worker.record, started=True)
            except RestoreError as err:
                await self.forget(worker.session_id)
                raise FilesUnavailable(f"the fork's workspace could not be filled: {err}") from err
            except Exception:
                await self.forget(worker.session_id)
                raise
        log.info("session forked", source=source.session_id, fork=worker.session_id, at=message_id or "now")
        await self.start(worker)
        return worker

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
        """DeleteSession: erases the session for good (docs/sessions.md, "Deleting a session").

        In order: nothing new is accepted on the session, a running turn is ended and the CLI
        process exits (`SessionWorker.retiring`); then the commit, one ledger transaction: the
        session becomes a tombstone holding what remains to erase on disk, its rows with content
        go, and its SESSION_DELETED event is appended. Only then are the files erased (the CLI's,
        the workspace snapshots, the workspace if asked) and the tombstone told so. A crash
        before the commit deleted nothing; after it, the next start finishes the erasure before
        it admits a call, so no read ever serves a deleted session's content.

        It runs in a task of its own: a caller that hangs up does not stop it halfway. A
        `request_id` makes it idempotent: a retry answers as the first call did (and finishes an
        erasure a failure left unfinished); without one, a second delete is SESSION_NOT_FOUND.
        """
        principal_name = principal.name if principal is not None else ""
        fingerprint = dumps([session_id, delete_workspace, principal_name])
        request = NewRequest(request_id, "DeleteSession", fingerprint, session_id) if request_id else None
        while True:
            if self._shutting_down:
                raise ShuttingDown()
            running = self._deletions.get(session_id)
            if running is not None and not running.done():
                # Its outcome decides: the session is gone (this call's own retry is answered
                # below), or it is still there and this call tries again.
                with contextlib.suppress(Exception):
                    await asyncio.shield(running)
                continue
            if request is not None:
                recorded = await self._ledger.request(request.request_id)
                if recorded is not None:
                    if not recorded.same_call(request):
                        raise RequestIdReused(request.request_id)
                    tombstone = await self._ledger.tombstone(session_id)
                    if tombstone is not None and tombstone.erasure is not None:
                        if tombstone.replica != self._ctx.replica_id:
                            # What remains is on its owner's disk: the retry finishes it there.
                            if self.owners is None:
                                return  # its owner finishes it when it starts
                            raise Elsewhere(await self.owners.replica(tombstone.replica))
                        await self._erase_files(session_id, tombstone.erasure)
                    return
            worker = self.get(session_id, principal)
            task = tasks.detach(
                self._delete(worker, request, delete_workspace, principal_name), name=f"delete-{session_id}"
            )
            self._deletions[session_id] = task
            await asyncio.shield(task)
            return

    async def _delete(
        self, worker: SessionWorker, request: NewRequest | None, delete_workspace: bool, deleter: str
    ) -> None:
        sid = worker.session_id
        try:
            async with worker.retiring():
                # What the erasure needs until it is finished (a crash midway: the next start).
                plan = {"cwd": worker.record.cwd, "workspace": delete_workspace}
                event = NewEvent(
                    kind="SESSION_DELETED",
                    session_id=sid,
                    principal=deleter,
                    # The session's owner, who (with admins) may see its events. Never any content.
                    data={"owner": worker.record.principal},
                )
                try:
                    committed = await self._ledger.erase_session(sid, event, request, plan)
                except LookupError:
                    raise SessionNotFound(sid) from None
                except RequestIdTaken as taken:
                    assert request is not None
                    raise RequestIdReused(request.request_id) from taken
                # The commit: from here on the session is gone, whatever happens next.
                worker.deleted = True
                if self._workers.get(sid) is worker:
                    del self._workers[sid]
                if self._publish is not None:
                    self._publish(committed)
                log.info(
                    "session deleted", session_id=sid, cursor=committed.cursor, workspace=delete_workspace
                )
                faults.point("delete.recorded")
                await self._erase_files(sid, plan)
        finally:
            if self._deletions.get(sid) is asyncio.current_task():
                del self._deletions[sid]

    async def _erase_files(self, session_id: str, plan: Mapping[str, Any]) -> None:
        """Erases what a deleted session left on disk, then tells the tombstone. Idempotent."""
        cwd = str(plan.get("cwd") or "")
        if cwd:
            self._erasing[session_id] = cwd
        try:
            removed = await asyncio.to_thread(
                erasure.erase_cli_files, self._ctx.claude_config_dir, session_id, cwd
            )
            snapshots = self._ctx.snapshots
            if snapshots is not None:
                await snapshots.delete(session_id)
            repository = self._config.state_dir / "snapshots" / f"{session_id}.git"
            if snapshots is not None:
                repository = snapshots.root / f"{session_id}.git"
            if repository.exists() or repository.is_symlink():
                await asyncio.to_thread(erasure.remove_tree, repository)
            # The CLI's temporary and scratch directories, its runtime directory, its sandbox.
            await asyncio.to_thread(erasure.remove_tree, self._config.sessions_dir / session_id)
            if plan.get("workspace") and cwd:
                try:
                    await asyncio.to_thread(erasure.remove_workspace, cwd, self._config.workspace_roots)
                except erasure.WorkspaceRefused as err:
                    # For good: what is there is not the session's workspace any more.
                    log.error(
                        "the deleted session's workspace is left in place",
                        session_id=session_id,
                        reason=str(err),
                    )
        except OSError as err:
            raise AgentRewindError(
                f"session {session_id!r} is deleted, but its files could not all be erased yet ({err}); "
                "retry DeleteSession with the same request_id (or restart the server) to finish"
            ) from err
        finally:
            self._erasing.pop(session_id, None)
        faults.point("delete.erased")
        await self._ledger.finish_erasure(session_id)
        log.info("deleted session erased", session_id=session_id, cli_files=len(removed))

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
        # A deletion in progress finishes (it waits for a running turn only as long as Interrupt
        # may take): stopped halfway, it would be finished at the next start instead.
        await asyncio.gather(*self._deletions.values(), return_exceptions=True)
        await asyncio.gather(*(w.shutdown(grace) for w in workers), return_exceptions=True)


def _register_secrets(options: Mapping[str, Any]) -> None:
    """MCP header values are credentials: the logs must never show them."""
    servers = options.get("mcp_servers")
    for config in servers.values() if isinstance(servers, dict) else ():
        for value in (config.get("headers") or {}).values() if isinstance(config, dict) else ():
            logs.secret(str(value))
