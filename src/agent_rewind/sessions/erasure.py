"""DeleteSession: the commit that makes a session a tombstone (`Deletions`), and what it then
erases on disk: everything the Claude Code CLI keeps of a session under its config dir, its
workspace snapshots, its own directories, and its workspace when the caller asks. (The ledger's
rows are the store's to erase; the snapshot stores are `snapshots.taking.Snapshots.delete`.)

What the CLI (2.1.x, run through the SDK) writes for a session under `$CLAUDE_CONFIG_DIR`, as
found by running sessions through the service and listing the directory (docs/sessions.md):

- `projects/<project>/<sid>.jsonl`: the transcript, every branch of it;
- `projects/<project>/<sid>/`: `subagents/agent-*.jsonl` and `.meta.json` (subagent
  transcripts), `tool-results/` (large tool outputs);
- `file-history/<sid>/`: the file backups its checkpoints restore from;
- `session-env/<sid>/`;
- `sessions/<pid>.json` (naming the session and its workspace) and `sessions/<pid>.*.key`
  while a process runs; the CLI removes them when it exits, a killed one leaves them.

Other files it names after the session in some configurations (a task list `tasks/<sid>/`,
`todos/<sid>-agent-*.json`, `debug/<sid>.txt`, `startup-perf/<sid>.*`, `uploads/<sid>/`,
`image-cache/<sid>/`) are found the same way: any entry of the config dir's top two levels (three
under `projects/`) whose name holds the session id is the session's, since ids are UUIDs. The
prompt history `history.jsonl` is written by the interactive CLI only, never through the SDK; a
line of it naming the session or its workspace is dropped all the same. Nothing else the CLI
writes (`.claude.json`, `backups/`, `shell-snapshots/`, `plugins/`) holds a session's content.

A confined CLI (sandbox/cli.py, the default) has a config dir of its own in the session's
directory, whose `projects` and `file-history` are links into the shared one: what it writes
beside its transcript and backups (`sessions/<pid>.*`, `session-env/`, `.claude.json`, ...) goes
with the session's own directories; the shared config dir is swept as above all the same.

Symbolic links are never followed out of what is erased: a link is removed, not its target.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from agent_rewind import faults, retries, tasks
from agent_rewind.access import Principal
from agent_rewind.config import Config
from agent_rewind.errors import AgentRewindError, RequestIdReused, SessionNotFound, ShuttingDown
from agent_rewind.replicas import Elsewhere, Owners
from agent_rewind.snapshots.taking import Snapshots, repository, snapshots_dir
from agent_rewind.store.ledger import (
    Erasure,
    EventRecord,
    NewEvent,
    NewRequest,
    RequestIdTaken,
    Requests,
    dumps,
)

if TYPE_CHECKING:
    from agent_rewind.sessions.worker import SessionWorker

log = structlog.get_logger(__name__)

# The CLI's directory of live processes: `<pid>.json` names the session a process runs.
_LIVE_PROCESSES = "sessions"
_PROMPT_HISTORY = "history.jsonl"


def remove_tree(path: Path) -> None:
    """Removes a file, a link (never its target) or a directory tree (links in it removed as links)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _entries(directory: Path) -> Iterator[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as found:
            yield from found
    except (FileNotFoundError, NotADirectoryError):
        return


def named_after(config_dir: Path, session_id: str) -> list[Path]:
    """Entries of the CLI's config dir that are the session's by name (see the module's docstring)."""
    out: list[Path] = []
    for top in _entries(config_dir):
        if session_id in top.name:
            out.append(Path(top.path))
            continue
        if not top.is_dir():  # follows a linked directory: the CLI writes through it too
            continue
        for entry in _entries(Path(top.path)):
            if session_id in entry.name:
                out.append(Path(entry.path))
            elif top.name == "projects" and entry.is_dir():
                out.extend(Path(e.path) for e in _entries(Path(entry.path)) if session_id in e.name)
    return out


def _live_process_files(config_dir: Path, session_id: str) -> list[Path]:
    """`sessions/<pid>.json` of processes that ran the session, and their `<pid>.*.key`."""
    out: list[Path] = []
    directory = config_dir / _LIVE_PROCESSES
    for entry in _entries(directory):
        if not entry.name.endswith(".json") or not entry.is_file(follow_symlinks=False):
            continue
        try:
            record = json.loads(Path(entry.path).read_text(errors="replace"))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("sessionId") == session_id:
            pid = entry.name.removesuffix(".json")
            out.append(Path(entry.path))
            out.extend(Path(e.path) for e in _entries(directory) if e.name.startswith(f"{pid}."))
    return out


def _belongs(line: str, session_id: str, cwd: str) -> bool:
    try:
        entry = json.loads(line)
    except ValueError:
        return session_id in line
    if not isinstance(entry, dict):
        return False
    return entry.get("sessionId") == session_id or bool(cwd and entry.get("project") == cwd)


def _drop_history_lines(config_dir: Path, session_id: str, cwd: str) -> int:
    """Rewrites the CLI's prompt history without the session's lines (atomically); how many."""
    path = config_dir / _PROMPT_HISTORY
    if path.is_symlink() or not path.is_file():
        return 0
    lines = path.read_text(errors="surrogateescape").splitlines(keepends=True)
    kept = [line for line in lines if not (line.strip() and _belongs(line, session_id, cwd))]
    if len(kept) == len(lines):
        return 0
    temporary = path.with_name(f".{path.name}.{session_id}.tmp")
    with open(temporary, "w", errors="surrogateescape") as out:
        out.writelines(kept)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)
    return len(lines) - len(kept)


def erase_cli_files(config_dir: Path, session_id: str, cwd: str = "") -> list[Path]:
    """Erases everything the CLI keeps of the session (no process of it may be running); what it
    removed. Raises OSError when something could not be removed (a retry goes on from there)."""
    if len(session_id) < 32:  # every name holds the empty string: only a full id is safe
        raise ValueError(f"not a session id: {session_id!r}")
    removed: list[Path] = []
    for path in [*named_after(config_dir, session_id), *_live_process_files(config_dir, session_id)]:
        remove_tree(path)
        removed.append(path)
        parent = path.parent
        if parent.parent.name == "projects" and parent.parent.parent == config_dir:
            with contextlib.suppress(OSError):  # not empty: another session's transcripts
                parent.rmdir()
    if _drop_history_lines(config_dir, session_id, cwd):
        removed.append(config_dir / _PROMPT_HISTORY)
    return removed


class WorkspaceRefused(Exception):
    """The workspace is not where the session had it: a component of its path became a link."""


def remove_workspace(cwd: str, roots: Iterable[Path]) -> bool:
    """Deletes the session's workspace directory; whether there was one.

    Only a directory strictly inside a workspace root, reached without any symbolic link: a
    workspace replaced by a link loses the link (its target is not the session's), and one whose
    parent became a link is refused (WorkspaceRefused). Links inside are removed as links.
    """
    path = Path(cwd)
    roots = tuple(roots)
    if not path.is_absolute() or not any(path.is_relative_to(r) and path != r for r in roots):
        raise WorkspaceRefused(f"{cwd} does not lie inside a workspace root")
    if path.is_symlink():
        path.unlink()
        return True
    if not path.exists():
        return False
    if path.resolve() != path:
        raise WorkspaceRefused(f"{cwd} is reached through a symbolic link now; it is left alone")
    if not path.is_dir():
        raise WorkspaceRefused(f"{cwd} is not a directory")
    shutil.rmtree(path)
    return True


class Tombstones(Requests, Erasure, Protocol):
    """What a deletion writes and reads of the ledger: its request id, the tombstone."""


class Deletions:
    """DeleteSession for one registry (docs/sessions.md, "Deleting a session").

    In order: nothing new is accepted on the session, a running turn is ended and the CLI
    process exits (`SessionWorker.retiring`); then the commit, one ledger transaction: the
    session becomes a tombstone holding what remains to erase on disk, its rows with content
    go, and its SESSION_DELETED event is appended. Only then are the files erased (the CLI's,
    the workspace snapshots, the workspace if asked) and the tombstone told so. A crash
    before the commit deleted nothing; after it, the next start finishes the erasure before
    it admits a call (`finish`), so no read ever serves a deleted session's content.
    """

    def __init__(
        self,
        *,
        config: Config,
        ledger: Tombstones,
        claude_config_dir: Path,
        snapshots: Snapshots | None,
        replica_id: str,
        find: Callable[[str, Principal | None], SessionWorker],
        drop: Callable[[SessionWorker], None],
        publish: Callable[[EventRecord], None] | None = None,
        owners: Owners | None = None,
    ) -> None:
        """`find`: the registry's session, to a principal that may see it (SESSION_NOT_FOUND
        otherwise); `drop`: forgets a session the commit deleted; `publish`: told of every event
        committed (SESSION_DELETED), after the commit; `owners`: who finishes an erasure that
        lies on another replica's disk (None: a registry of its own)."""
        self._config = config
        self._ledger = ledger
        self._claude_config_dir = claude_config_dir
        self._snapshots = snapshots
        self._replica_id = replica_id
        self._find = find
        self._drop = drop
        self._publish = publish
        self._owners = owners
        self._stopping = False
        # Deletions in progress, by session: a second DeleteSession waits for the first's outcome.
        self._running: dict[str, asyncio.Task[None]] = {}
        # Workspaces of deleted sessions whose files are being erased: no new session takes one
        # until then (its erasure would delete what the new session put there).
        self._erasing: dict[str, str] = {}

    def erasing(self) -> list[Path]:
        """The workspaces of deleted sessions whose erasure runs now."""
        return [Path(cwd) for cwd in self._erasing.values()]

    async def delete(
        self, session_id: str, principal: Principal | None, request_id: str, delete_workspace: bool
    ) -> None:
        """Deletes the session for good (as `principal`, if given: it must see the session). It runs in a task of its own: a caller that hangs up
        does not stop it halfway. A `request_id` makes it idempotent: a retry answers as the
        first call did (and finishes an erasure a failure left unfinished); without one, a
        second delete is SESSION_NOT_FOUND."""
        principal_name = principal.name if principal is not None else ""
        fingerprint = dumps([session_id, delete_workspace, principal_name])
        request = NewRequest(request_id, "DeleteSession", fingerprint, session_id) if request_id else None
        while True:
            if self._stopping:
                raise ShuttingDown()
            running = self._running.get(session_id)
            if running is not None and not running.done():
                # Its outcome decides: the session is gone (this call's own retry is answered
                # below), or it is still there and this call tries again.
                with contextlib.suppress(Exception):
                    await asyncio.shield(running)
                continue
            if await retries.recorded(self._ledger, request) is not None:
                await self._repeat(session_id)
                return
            worker = self._find(session_id, principal)
            task = tasks.detach(
                self._delete(worker, request, delete_workspace, principal_name), name=f"delete-{session_id}"
            )
            self._running[session_id] = task
            await asyncio.shield(task)
            return

    async def _repeat(self, session_id: str) -> None:
        """A retried deletion: it finishes what the first left to erase (on this replica's disk)."""
        tombstone = await self._ledger.tombstone(session_id)
        if tombstone is None or tombstone.erasure is None:
            return
        if tombstone.replica != self._replica_id:
            # What remains is on its owner's disk: the retry finishes it there.
            if self._owners is None:
                return  # its owner finishes it when it starts
            raise Elsewhere(await self._owners.replica(tombstone.replica))
        await self.erase(session_id, tombstone.erasure)

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
                self._drop(worker)
                if self._publish is not None:
                    self._publish(committed)
                log.info(
                    "session deleted", session_id=sid, cursor=committed.cursor, workspace=delete_workspace
                )
                faults.point("delete.recorded")
                await self.erase(sid, plan)
        finally:
            if self._running.get(sid) is asyncio.current_task():
                del self._running[sid]

    async def finish(self, session_id: str, plan: Mapping[str, Any]) -> None:
        """Finishes the erasure a crash (or a failure) interrupted; a failure is logged, and the
        erasure tried again at the next start."""
        log.warning("finishing the erasure of a deleted session", session_id=session_id)
        try:
            await self.erase(session_id, plan)
        except AgentRewindError as err:
            log.error("could not finish erasing a deleted session", session_id=session_id, error=err.message)

    async def erase(self, session_id: str, plan: Mapping[str, Any]) -> None:
        """Erases what a deleted session left on disk, then tells the tombstone. Idempotent."""
        cwd = str(plan.get("cwd") or "")
        if cwd:
            self._erasing[session_id] = cwd
        try:
            removed = await asyncio.to_thread(erase_cli_files, self._claude_config_dir, session_id, cwd)
            snapshots = self._snapshots
            if snapshots is not None:
                await snapshots.delete(session_id)
            root = snapshots.root if snapshots is not None else snapshots_dir(self._config.state_dir)
            store = repository(root, session_id)
            if store.exists() or store.is_symlink():
                await asyncio.to_thread(remove_tree, store)
            # The CLI's temporary and scratch directories, its runtime directory, its sandbox.
            await asyncio.to_thread(remove_tree, self._config.sessions_dir / session_id)
            if plan.get("workspace") and cwd:
                try:
                    await asyncio.to_thread(remove_workspace, cwd, self._config.workspace_roots)
                except WorkspaceRefused as err:
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

    async def stop(self) -> None:
        """Refuses new deletions; one in progress finishes (it waits for a running turn only as
        long as Interrupt may take): stopped halfway, it would be finished at the next start."""
        self._stopping = True
        await asyncio.gather(*self._running.values(), return_exceptions=True)
