"""ForkSession: a new session that starts where another one was, and then lives on its own.

The fork gets its own id, workspace, transcript, snapshots and CLI process; nothing is shared
after the call, so prompts and rewinds on one never show in the other.

- Its **conversation** is the source's visible chain up to the fork's leaf (just before the
  point, or the whole conversation): those transcript lines are copied, in order, into the fork's
  own transcript, each re-labelled with the fork's session id and workspace. Hidden branches are
  not copied. The fork's first CLI process resumes at that leaf, as any session does.
- Its **files** are the workspace as it was when the point's turn started (the source's start
  snapshot, which must be complete), or, for a fork of the whole session, the workspace as it is
  (a copy; symlinks are copied as links, never followed; FIFOs, sockets and devices left out).

The fork keeps no file history of the source: its points from before the fork can be rewound in
conversation, and its files only back to where it began.

`Forks.fork` does it, the source's lock held meanwhile; the functions below are its steps on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from agent_rewind import tasks
from agent_rewind.errors import FilesUnavailable, SnapshotUnavailable
from agent_rewind.sessions.new_session import NewSessionRequest
from agent_rewind.snapshots import EMPTY_TREE, RestoreError, SnapshotStore
from agent_rewind.snapshots.files import chunks, open_regular
from agent_rewind.snapshots.taking import Snapshots, repository
from agent_rewind.store.ledger import ForkOrigin, SnapshotRecord
from agent_rewind.store.ledger import Sessions as StoredSessions
from agent_rewind.transcript.paths import transcript_path

if TYPE_CHECKING:
    from agent_rewind.sessions.worker import SessionWorker

log = structlog.get_logger(__name__)

_TURN_START = "turn_start"


def start_tree(records: list[SnapshotRecord], message_id: str) -> str:
    """The tree of the workspace when the point's turn started; SNAPSHOT_UNAVAILABLE without a
    complete one."""
    for record in reversed(records):
        if record.kind == _TURN_START and record.ref == message_id:
            if not record.complete or record.tree is None:
                raise SnapshotUnavailable(message_id, "incomplete", record.reason)
            return record.tree
    raise SnapshotUnavailable(message_id, "none", "no workspace snapshot was taken when its turn started")


def _moved(value: Any, old: str, new: str) -> Any:
    """`value` with every mention of the workspace `old` (a path in a tool call, a tool result, the
    CLI's environment notes) naming `new` instead."""
    if isinstance(value, str):
        return value.replace(old, new) if old in value else value
    if isinstance(value, list):
        return [_moved(v, old, new) for v in value]
    if isinstance(value, dict):
        return {k: _moved(v, old, new) for k, v in value.items()}
    return value


def write_transcript(
    source: Path, target: Path, offsets: list[int], session_id: str, cwd: str, source_cwd: str
) -> None:
    """The fork's transcript: the source's lines at `offsets`, in order, with the fork's session
    id, and its workspace wherever the source's was named (so the agent, reading its history,
    works in its own workspace). Written beside its place and renamed in: all there or nothing."""
    lines: list[bytes] = []
    with source.open("rb") as f:
        for offset in offsets:
            f.seek(offset)
            entry = _moved(json.loads(f.readline()), source_cwd.rstrip("/"), cwd.rstrip("/"))
            if "sessionId" in entry:
                entry["sessionId"] = session_id
            lines.append(json.dumps(entry, ensure_ascii=False, separators=(",", ":")).encode())
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = target.with_name(f".{target.name}.fork")
    with scratch.open("wb") as out:
        out.write(b"".join(line + b"\n" for line in lines))
        out.flush()
        os.fsync(out.fileno())
    scratch.replace(target)


def restore_into(store: SnapshotStore, tree: str, workspace: Path) -> None:
    """Writes every path of `tree` into the (empty) fork workspace. `store` is the source's
    repository, opened on the fork's workspace."""
    paths = store.files(tree)
    if paths:
        store.restore(tree, paths, rollback=EMPTY_TREE)


def copy_workspace(source: Path, target: Path) -> None:
    """The source workspace as it is now, into the (new, the service's own) `target`: its
    directories, regular files and symlinks (copied as links). The source is walked by
    descriptors that follow no link (`os.fwalk`), so a directory the agent swaps for a link
    meanwhile is not entered; a file is opened only if it is a regular one, without blocking (a
    FIFO, socket or device is left out, never waited on), and streamed. What is gone by the time
    it is reached (a process of the agent's still at work) is left out."""
    if not source.is_absolute() or source.is_symlink():
        raise OSError(f"the workspace {source} is not a directory of its own")
    for top, dirs, names, dirfd in os.fwalk(source, follow_symlinks=False):
        here = target / os.path.relpath(top, source)
        here.mkdir(parents=True, exist_ok=True)
        for name in dirs + names:
            try:
                info = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
                link = os.readlink(name, dir_fd=dirfd) if stat.S_ISLNK(info.st_mode) else None
            except FileNotFoundError:
                continue  # gone since its directory was listed (a process of the agent's at work)
            if link is not None:
                with contextlib.suppress(FileNotFoundError):  # a retried fork's
                    os.unlink(here / name)
                os.symlink(link, here / name)
            elif stat.S_ISREG(info.st_mode):
                _copy_file(name, dirfd, here / name)


def _copy_file(name: str, dirfd: int, target: Path) -> None:
    try:
        fd = open_regular(name, dirfd)
    except FileNotFoundError:
        return  # gone since it was listed
    if fd == -1:  # not a regular file (open_regular)
        return  # swapped since it was listed: not a regular file now
    try:
        mode = os.fstat(fd).st_mode & 0o777
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        try:
            for chunk in chunks(fd):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view) :]
        finally:
            os.close(out)
    finally:
        os.close(fd)


class Sessions(Protocol):
    """What a fork needs of the registry it adds the fork to."""

    async def create(self, req: NewSessionRequest) -> SessionWorker:
        """A new session, as CreateSession makes it (a retry: the one the first call made)."""
        ...

    async def forget(self, session_id: str) -> None:
        """Drops a new session whose files could not be filled."""
        ...

    async def start(self, worker: SessionWorker) -> None:
        """Starts a new session's CLI."""
        ...


class Forks:
    """ForkSession for one registry (`sessions`)."""

    def __init__(
        self,
        *,
        ledger: StoredSessions,
        snapshots: Snapshots | None,
        claude_config_dir: Path,
        sessions: Sessions,
    ) -> None:
        self._ledger = ledger
        self._snapshots = snapshots
        self._claude_config_dir = claude_config_dir
        self._sessions = sessions

    async def fork(self, source: SessionWorker, message_id: str, req: NewSessionRequest) -> SessionWorker:
        """A new session whose conversation and files are the source's just before `message_id`
        (empty: as they are now). The source's lock is held meanwhile, so no turn changes it
        while it is copied; it is otherwise untouched. The work runs in a task of its own: a
        caller that hangs up midway leaves a whole fork, not half."""
        return await tasks.shielded(self._fork(source, message_id, req), name=f"fork-{source.session_id}")

    async def _fork(self, source: SessionWorker, message_id: str, req: NewSessionRequest) -> SessionWorker:
        snapshots = self._snapshots
        async with source.exclusive():
            view = await source.view()
            tree: str | None = None
            at = ""  # the prompt forked before: "" for the whole session
            if message_id:
                point = view.resolve(message_id)
                at = point.message_id
                leaf = point.anchor or None
                if snapshots is None or not source.record.workspace_snapshots:
                    raise SnapshotUnavailable(
                        point.message_id, "off", "the session takes no workspace snapshots"
                    )
                tree = start_tree(await snapshots.records(source.session_id), point.message_id)
            else:
                leaf = view.leaf
            offsets = source.view_at(leaf).offsets() if leaf else []
            worker = await self._sessions.create(
                dataclasses.replace(
                    req,
                    options=dict(source.record.options),
                    checkpointing=source.record.checkpointing,
                    workspace_snapshots=source.record.workspace_snapshots,
                    forked_from=ForkOrigin(source.session_id, at),
                )
            )
            if worker.record.started:
                return worker  # a retry (same request_id) of a fork already made
            cwd = Path(worker.record.cwd)
            try:
                if tree is not None and snapshots is not None:
                    store = SnapshotStore(repository(snapshots.root, source.session_id), cwd)
                    await snapshots.run(lambda: restore_into(store, tree, cwd))
                else:
                    await asyncio.to_thread(copy_workspace, Path(source.record.cwd), cwd)
                if offsets:
                    target = transcript_path(self._claude_config_dir, str(cwd), worker.session_id)
                    await asyncio.to_thread(
                        write_transcript,
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
                await self._sessions.forget(worker.session_id)
                raise FilesUnavailable(f"the fork's workspace could not be filled: {err}") from err
            except Exception:
                await self._sessions.forget(worker.session_id)
                raise
        log.info("session forked", source=source.session_id, fork=worker.session_id, at=message_id or "now")
        await self._sessions.start(worker)
        return worker
