"""One worker per session: its state, its lock, its transcript view, its turns.

Every prompt, rewind and rebuild of the CLI process runs under the worker's lock (API.md rule 4);
different sessions have different workers and never wait on each other. A turn holds the lock
until its result; a rewind that finds a turn running is refused at once (TURN_IN_FLIGHT) rather
than queued behind it.

`SessionWorker` is the one object the registry, the rewind engine and the RPC layer use; its
work is done by its parts, each in a module of its own:

- `status.Status`: what the session accepts now (its phase, the turn that holds it, stopping);
- `view.TranscriptView`: the transcript as the service shows it, and a cut's durability;
- `running.TurnRunner`: turns, their bookkeeping, interrupts and the interrupt watchdog;
- `lifecycle.Lifecycle`: when the process starts, hibernates, closes, retires and stops;
- `process.AgentProcess`: the live process itself.

No path leaves a session unusable until a restart: every turn ends (on the CLI's result, on an
error, or, when it ignores Interrupt for `interrupt_timeout` seconds, by killing its process),
the lock is released on every path, and a failed write to the ledger fails the call that made it
without wedging the session.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any

import structlog

from agent_rewind import tasks
from agent_rewind.sessions import lifecycle, running
from agent_rewind.sessions.adapter import AgentClient
from agent_rewind.sessions.conversation import TranscriptView
from agent_rewind.sessions.lifecycle import Lifecycle
from agent_rewind.sessions.live import LiveSlots
from agent_rewind.sessions.points import SessionPoints
from agent_rewind.sessions.process import AgentProcess, ClientFactory
from agent_rewind.sessions.running import TurnRunner
from agent_rewind.sessions.state import SessionState
from agent_rewind.sessions.status import State
from agent_rewind.sessions.turn_events import FilesAnswer
from agent_rewind.sessions.turns import Prelude, Turn
from agent_rewind.snapshots.taking import Snapshots, repository
from agent_rewind.storage.reserve import Reserve
from agent_rewind.storage.retention import Retention, RewindTrees, SessionRetention
from agent_rewind.storage.usage import Places, UsageBook
from agent_rewind.store.ledger import EgressRecord, Ledger, PointsUpdate, SessionRecord
from agent_rewind.transcript import paths as transcript_paths
from agent_rewind.transcript.index import ConversationView, Reading, TranscriptIndex

__all__ = ["SessionWorker", "State", "WorkerContext"]

log = structlog.get_logger(__name__)

_NO_SNAPSHOTS: Mapping[str, bool] = MappingProxyType({})


async def _no_pending(worker: SessionWorker) -> None:
    return None


def _any_turn(worker: SessionWorker) -> None:
    return None


@dataclass(frozen=True)
class WorkerContext:
    """What every worker shares: the ledger, how to start a client, the CLI's environment."""

    ledger: Ledger
    client_factory: ClientFactory
    cli_env: Mapping[str, str]
    claude_config_dir: Path
    idle_timeout: float
    # Seconds a turn may ignore Interrupt before its process is killed.
    interrupt_timeout: float = 10.0
    # Finishes a session's pending rewind intents (set by the rewind engine); run under the lock
    # before any prompt or rewind, so nothing runs on a half-applied rewind.
    resolve_pending: Callable[[SessionWorker], Awaitable[None]] = _no_pending
    project_settings: bool = False
    # Raises (QuotaExceeded) when the session's principal may not start another turn now; called
    # in the same step that claims the session for a turn, so two prompts cannot both slip by.
    admit_turn: Callable[[SessionWorker], None] = _any_turn
    # The bound on live CLI processes (--max-live-sessions); None: no bound.
    live: LiveSlots | None = None
    # Workspace snapshots (None: off on this server), and what points keep what files rewinds need.
    snapshots: Snapshots | None = None
    retention: Retention = field(default_factory=Retention)
    # What a session's rewinds need of its snapshot store besides its snapshots (set by the
    # server from rewind/intent.py); None: retention leaves the snapshots as they are.
    rewind_trees: RewindTrees | None = None
    # This replica's id (--replica-id): the owner of the sessions it creates.
    replica_id: str = ""
    # What each session holds, and the storage limits (None: not measured, no limits).
    usage: UsageBook | None = None
    # The storage reserve (storage/reserve.py): no turn or fork starts on a full volume.
    reserve: Reserve | None = None


class SessionWorker:
    def __init__(self, record: SessionRecord, ctx: WorkerContext) -> None:
        self._ctx = ctx
        self.session_id = record.session_id
        self._log = log.bind(session_id=self.session_id)
        # Where the CLI keeps this session's file backups (its checkpoints' content).
        self.file_history = ctx.claude_config_dir / "file-history" / self.session_id
        # The session's state, which its parts share; each part reaches another only through
        # the calls it is given here.
        process = AgentProcess(self.session_id, ctx.client_factory, self._log, ctx.live, self._evict)
        self._state = SessionState(record, process, self._log)
        self.process, self.status, self.lock = process, self._state.status, self._state.lock
        self._view = TranscriptView(
            session_id=self.session_id,
            cwd=record.cwd,
            claude_config_dir=ctx.claude_config_dir,
            ledger=ctx.ledger,
            log=self._log,
        )
        self.points = SessionPoints(  # the points index
            self._state, self._view, ctx.ledger, lambda: self.holds_newest_checkpoint
        )
        self.lifecycle = Lifecycle(
            self._state,
            self._view,
            self.points,
            lifecycle.Settings(
                ledger=ctx.ledger,
                cli_env=ctx.cli_env,
                project_settings=ctx.project_settings,
                idle_timeout=ctx.idle_timeout,
                snapshots=ctx.snapshots,
            ),
            lifecycle.Others(interrupt=self.interrupt, end_turns=self._end_turns, forget=self.forget),
        )
        # Retention of what files rewinds need (storage/retention.py): its mark and its passes.
        self.retention = SessionRetention(
            self, ctx.ledger, ctx.snapshots, ctx.retention, self._log, ctx.rewind_trees
        )
        self.turns = TurnRunner(
            self._state,
            self._view,
            self.points,
            self.lifecycle,
            running.Settings(
                ledger=ctx.ledger,
                snapshots=ctx.snapshots,
                retain=self.retention.soon,
                interrupt_timeout=ctx.interrupt_timeout,
                resolve_pending=lambda: ctx.resolve_pending(self),
                admit_turn=lambda: ctx.admit_turn(self),
                admit_storage=self._admit_storage,
                storage_changed=self.storage_changed,
            ),
        )
        if ctx.usage is not None:
            # Its transcript, its subagents' (a directory named after it), the CLI's backups, its
            # snapshot repository.
            project = transcript_paths.project_dir(ctx.claude_config_dir, record.cwd, self.session_id)
            history = (
                project / f"{self.session_id}.jsonl",
                project / self.session_id,
                self.file_history,
                *((repository(ctx.snapshots.root, self.session_id),) if ctx.snapshots is not None else ()),
            )
            ctx.usage.track(self.session_id, record.principal, Places(Path(record.cwd), history))
        self._reached: set[tuple[str, str, int]] = set()  # (prompt, host, port) kept as egress
        self._keeping: set[asyncio.Task[None]] = set()  # their ledger writes, until done
        self._egress: list[EgressRecord] | None = None  # what the ledger holds of them, once read

    async def _admit_storage(self) -> None:
        if self._ctx.usage is not None:
            await self._ctx.usage.admit(self.session_id, self._state.record.principal)

    async def storage(self) -> tuple[int, int] | None:
        """What the session holds, as last measured (workspace_bytes, history_bytes; None: not
        measured yet; storage/usage.py says how fresh)."""
        return await self._ctx.usage.of(self.session_id) if self._ctx.usage is not None else None

    async def admit_fork(self) -> None:
        """Raises QUOTA_EXCEEDED when a fork of the session may not be made: a fork copies it,
        and is refused as a turn is."""
        await self._admit_storage()

    def storage_changed(self) -> None:
        """What the session holds may have changed (a turn, a rewind): measured again soon."""
        if self._ctx.usage is not None:
            self._ctx.usage.changed(self.session_id)

    async def _evict(self) -> bool:
        return await self.lifecycle.evict()

    async def _end_turns(self, grace: float) -> None:
        await self.turns.end(grace)

    @property
    def record(self) -> SessionRecord:
        return self._state.record

    @record.setter
    def record(self, value: SessionRecord) -> None:
        self._state.record = value

    @property
    def update_time(self) -> datetime:
        return self._state.update_time

    # State

    @property
    def replica(self) -> str:
        """The replica that owns the session: this one. A replica holds workers only for the
        sessions it owns (`SessionRegistry.load`); the others forward calls here."""
        return self._ctx.replica_id

    @property
    def state(self) -> str:
        return self.status.state(closed=self.record.closed)

    @property
    def turn_running(self) -> bool:
        return self._state.turn_running

    @property
    def gone(self) -> bool:
        """Being deleted, or deleted: nothing new runs on the session."""
        return self._state.gone

    @property
    def deleted(self) -> bool:
        """Set by DeleteSession at the ledger's commit: from then on the session is gone for good."""
        return self._state.deleted

    @deleted.setter
    def deleted(self, value: bool) -> None:
        if not value:
            raise ValueError("a deleted session stays deleted")
        self.status.delete()
        if self._ctx.usage is not None:
            self._ctx.usage.forget(self.session_id)

    @property
    def client_pid(self) -> int | None:
        return self.process.pid

    @property
    def holds_newest_checkpoint(self) -> bool:
        """Whether the live process ran the newest prompt: then it holds that prompt's file
        checkpoint even before the CLI writes it to the transcript."""
        return self.process.alive and self.process.pid == self.turns.newest_pid

    def check_no_turn(self) -> None:
        self._state.check_no_turn()

    def check_not_deleted(self) -> None:
        """SESSION_NOT_FOUND for work that reached the session while it was being deleted."""
        self._state.check_not_deleted()

    # The transcript, as the service shows it (view.py)

    async def catch_up(self) -> TranscriptIndex:
        """Reads what the CLI appended to the transcript since the last read."""
        return await self._view.catch_up()

    async def view(self) -> ConversationView:
        """The visible conversation: the transcript's own, cut at a pending rewind anchor if any."""
        return await self._view.view()

    async def transcript(self) -> Reading:
        """The visible conversation (`view`) and the whole index it was read into."""
        view = await self._view.view()
        return Reading(view, self._view.index())

    @contextlib.asynccontextmanager
    async def cutting(self, leaf: str | None) -> AsyncIterator[PointsUpdate | None]:
        """The points index's update for a cut at `leaf`, for the transaction that commits the
        cut to write; the index's own once the body returns (`SessionPoints.cutting`)."""
        async with self.points.cutting(leaf) as update:
            yield update

    # The three below read what the last `view()` caught up with.

    def reached(self, host: str, port: int) -> None:
        """The egress proxy opened a connection for this session's commands: kept (once per turn
        and host) as a side effect of the running turn, or of the newest prompt when none runs
        (a background command of an earlier turn). Never waits: the proxy goes on at once."""
        turn = self.status.claimed
        if turn is not None:
            prompt = turn.prompt_id
        else:
            points = self.transcript_view().points
            prompt = points[-1].message_id if points else ""
        key = (prompt, host, port)
        if not prompt or key in self._reached:
            return
        self._reached.add(key)
        task = tasks.detach(
            self._keep_egress(EgressRecord(self.session_id, prompt, host, port)), name="egress"
        )
        self._keeping.add(task)
        task.add_done_callback(self._keeping.discard)

    async def egress(self) -> list[EgressRecord]:
        """The hosts the session's commands reached, every turn's (read from the ledger once, then
        kept up to date here). Waits for the records reported so far."""
        if self._keeping:
            await asyncio.gather(*self._keeping, return_exceptions=True)
        if self._egress is None:
            self._egress = await self._ctx.ledger.egress(self.session_id)
        return self._egress

    async def _keep_egress(self, record: EgressRecord) -> None:
        try:
            await self._ctx.ledger.record_egress(record)
            if self._egress is not None:
                self._egress.append(record)
        except Exception as err:  # a warning lost, never the connection: it is already open
            self._reached.discard((record.prompt_id, record.host, record.port))
            self._log.warning("could not keep a host the commands reached", host=record.host, error=str(err))

    async def resume_point(self, leaf: str) -> str:
        """Where the CLI resumes the conversation ending at `leaf` (a copy of it when it lies
        before a compaction). Call while no CLI process of the session runs."""
        return await self._view.resume_point(leaf)

    def transcript_view(self) -> ConversationView:
        """The conversation as the transcript alone shows it, ignoring a pending cut."""
        return self._view.index().view()

    def view_at(self, leaf: str) -> ConversationView:
        """The conversation as it would be after a cut at `leaf`."""
        return self._view.index().view(leaf)

    @property
    def transcript_file(self) -> Path:
        """Where the CLI writes this session's transcript."""
        return self._view.index().path

    def forget(self) -> None:
        """Frees what a hibernated session need not hold: its transcript index and remembered
        turns come back from the disk and the ledger when next needed."""
        self._view.forget()
        self.points.forget()
        self.turns.forget()

    # The process (lifecycle.py)

    async def ensure_client(self, *, wait: bool = True) -> AgentClient:
        """The live client, started (or resumed) if needed. Call under the lock. `wait`: queue
        for a live slot when every one is busy, rather than fail at once."""
        return await self.lifecycle.ensure_client(wait=wait)

    async def cut_conversation(self, target: str) -> None:
        """The conversation was cut just before the prompt `target` (a rewind). Call under the lock.

        A live process still remembers the dropped turns. It is cut in place when the CLI agrees
        (milliseconds, and the next prompt finds the process ready); otherwise it is let go and a
        new one resuming at the cut starts in the background once the caller releases the lock.
        A session without a live process needs nothing: its next start resumes at the cut.
        """
        await self.lifecycle.cut_conversation(target)

    def conversation_restored(self) -> None:
        """An undo brought dropped turns back into the conversation the service shows. The live
        process cannot un-cut itself: it is let go, and a new one resuming at the restored leaf
        starts in the background once the caller releases the lock. Call under the lock."""
        if self.process.client is not None:
            self.lifecycle.replace_process()

    @property
    def _background(self) -> set[asyncio.Task[None]]:
        return self.lifecycle.background

    async def rewind_files(self, message_id: str, *, dry_run: bool) -> FilesAnswer:
        """Asks the CLI to rewind (or preview rewinding) files. Call under the lock.

        AgentUnavailable when the process failed: then whether the files were restored is not
        known, and the caller must find out (restoring again is idempotent).
        """
        return await self.lifecycle.rewind_files(message_id, dry_run=dry_run)

    # Exclusive work (rewinds)

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[SessionRecord]:
        """Holds the session's lock for work that must not wait behind a turn (a rewind), and
        gives its record as it is while held.

        A running turn holds the lock until its result, so this checks before waiting for
        the lock as well as after getting it: a rewind is refused at once, never queued.
        """
        self.check_not_deleted()
        self.check_no_turn()
        async with self.lock:
            self.check_not_deleted()
            self.check_no_turn()
            try:
                yield self._state.record
            finally:
                self.after_exclusive_use()
                self.points.soon()  # what a rewind or an undo changed, and a process let go

    def after_exclusive_use(self) -> None:
        """Called when a rewind or other exclusive work ends: closed sessions give their process back."""
        self.lifecycle.after_exclusive_use()

    # Turns (running.py)

    async def start_turn(
        self, text: str, request_id: str = "", prelude: Prelude | None = None, prelude_key: Any = None
    ) -> Turn:
        """Accepts a prompt and returns its turn's event log at once.

        Everything after the acceptance (a rewind first, for PromptRequest.rewind; starting or
        resuming the CLI; sending the prompt; reading the turn) runs in the turn's own task, so a
        caller that hangs up, even while the CLI is still starting, loses nothing. A request_id
        seen before returns that turn (a retry re-attaches to it, or gets it replayed from the
        ledger after a restart); with other arguments it is REQUEST_ID_REUSED.
        """
        return await self.turns.start(text, request_id, prelude, prelude_key)

    async def interrupt(self) -> None:
        """Stops the turn in flight: asks the CLI, and kills its process if the turn has not
        ended `interrupt_timeout` seconds later. A turn still starting its CLI is stopped as soon
        as its prompt is sent."""
        await self.turns.interrupt()

    # Workspace snapshots

    async def snapshot_bytes(self) -> int:
        """Bytes the session's workspace snapshots hold on disk (0 when it has none)."""
        snaps = self._ctx.snapshots
        if snaps is None:
            return 0
        return await snaps.disk_bytes(self.session_id)

    async def snapshot_availability(self, refs: Sequence[str]) -> Mapping[str, bool]:
        """Per prompt id of `refs` whose turn started with a snapshot: whether snapshots can serve
        a files rewind to it."""
        snaps = self._ctx.snapshots
        if snaps is None or not self.record.workspace_snapshots:
            return _NO_SNAPSHOTS
        return await snaps.availability_of(self.session_id, refs)

    # Lifecycle (lifecycle.py)

    async def close(self, *, force: bool = False) -> None:
        """CloseSession: ends the live process. With `force`, a running turn is ended first (as an
        Interrupt that escalates to a kill); without, a running turn is TURN_IN_FLIGHT."""
        await self.lifecycle.close(force=force)

    def retiring(self) -> contextlib.AbstractAsyncContextManager[None]:
        """DeleteSession's hold on the session. From the first moment nothing new is accepted (a
        prompt, a rewind, a start of the CLI: SESSION_NOT_FOUND); a running turn is ended as
        CloseSession(force) ends it (Interrupt, then a kill); a rewind in progress finishes; the
        CLI process exits. Yields holding the lock, with no process, for the erasure. Should the
        body fail before the registry marked the worker `deleted`, the session is usable again."""
        return self.lifecycle.retiring()

    async def hibernate(self) -> None:
        """Gives the process back (the idle timer). Skipped when the session is in use."""
        await self.lifecycle.hibernate()

    async def shutdown(self, grace: float) -> None:
        """Gives a running turn `grace` seconds and a rewind in progress its time to finish, then
        ends the CLI process whatever happens."""
        await self.lifecycle.shutdown(grace)
