"""Retention (`--retain-file-points`, `--retain-file-days`) end to end: a real server and real
Claude Code processes. Older points are marked files_pruned and what only they needed leaves the
disk (their snapshots' objects, the CLI's backups), the kept points still rewind files (from the
snapshots, and from the CLI's checkpoints in a session without snapshots), a pruned point stays
a point for the conversation, the session's history shrinks, and a server killed in the middle of
pruning leaves every kept point rewindable and every pruned point marked, the next start
finishing the deletion.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
from google.protobuf import struct_pb2

from agent_rewind.api.v1 import rewind_pb2, rewind_service_pb2
from agent_rewind.testing.server_process import ServerProcess
from tests.integration.harness import (
    CONVERSATION,
    FILES,
    Client,
    client_of,
    error_info,
    prompt_id,
    read,
    replicas,
    serve,
)
from tests.pgserver_fixture import PostgresServer

SNAPSHOT = rewind_pb2.FILES_SOURCE_SNAPSHOT
CHECKPOINT = rewind_pb2.FILES_SOURCE_CHECKPOINT
# Each turn rewrites data.txt: the CLI backs up what it held before each later turn.
TURNS = ["write data.txt one", "write data.txt two", "write data.txt three", "write data.txt four"]


def _has(repo: Path, tree: str) -> bool:
    done = subprocess.run(["git", "--git-dir", str(repo), "cat-file", "-e", tree], capture_output=True)
    return done.returncode == 0


def _starts(ledger: Path, sid: str) -> dict[str, str]:
    """Each turn's start snapshot (its tree), as the ledger recorded it."""
    db = sqlite3.connect(ledger)
    try:
        rows = db.execute(
            "SELECT ref, tree FROM snapshots WHERE session_id = ? AND kind = 'turn_start' ORDER BY seq",
            (sid,),
        )
        return {ref: tree for ref, tree in rows}
    finally:
        db.close()


def _versions(history: Path) -> list[int]:
    """The versions of the CLI's backups of data.txt (the only file it tracks here)."""
    return sorted(int(name.rpartition("@v")[2]) for name in (p.name for p in history.iterdir()))


async def _settled(c: Client, sid: str) -> None:
    """Waits for the session's retention passes (an in-process server)."""
    assert c.running is not None
    await asyncio.wait_for(c.running.registry.workers[sid].retention.settled(), 30)


async def _refused(call: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    return err.value


async def _four_turns(c: Client, **create: object) -> tuple[str, Path, list[str]]:
    session = await c.create(**create)
    sid, cwd = session.session_id, Path(session.cwd)
    (cwd / "base.txt").write_text("there before the first turn\n")  # its start snapshot: a tree of its own
    ids = [prompt_id(await c.prompt(sid, text)) for text in TURNS]
    return sid, cwd, ids


def _pruned(points: list[rewind_pb2.RewindPoint]) -> list[bool]:
    return [p.files_pruned for p in points]


async def test_the_newest_points_keep_their_files_and_what_only_older_ones_needed_is_deleted(
    tmp_path: Path,
) -> None:
    async with serve(tmp_path, workspace_snapshots=True, retain_file_points=2) as c:
        assert c.running is not None and c.running.snapshots is not None
        sid, cwd, ids = await _four_turns(c)
        await _settled(c, sid)
        points = list((await c.points(sid)).points)
        assert _pruned(points) == [True, True, False, False]
        assert [p.files_rewindable for p in points] == [False, False, True, True]
        assert [p.snapshot_available for p in points] == [False, False, True, True]

        # Gone from disk: the first two turns' snapshots (their objects: nothing kept reaches
        # them) and the CLI's backup of data.txt before the second turn; kept: the rest.
        starts = _starts(tmp_path / "ledger.sqlite3", sid)
        repo = c.running.snapshots.root / f"{sid}.git"
        assert [starts[i] is None for i in ids] == [True, True, False, False], "their records pruned"
        assert _has(repo, starts[ids[2]]) and _has(repo, starts[ids[3]])
        history = c.running.config.claude_config_dir / "file-history" / sid
        assert _versions(history) == [3, 4], "data.txt as it was before the third and fourth turns"

        # A kept point rewinds files, from the snapshots.
        kept = await c.rewind(sid, ids[2], FILES)
        assert kept.files.can_rewind and kept.files.source == SNAPSHOT
        assert read(cwd / "data.txt") == "two\n"
        # A pruned one: refused for files, in a dry run as in a rewind; its conversation still rewinds.
        preview = await c.dry_run(sid, ids[1], rewind_pb2.REWIND_MODE_BOTH)
        assert not preview.files.can_rewind and preview.files.refusal.reason == "FILES_PRUNED"
        assert preview.conversation.can_rewind
        err = await _refused(c.rewind(sid, ids[1], FILES))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
        info = error_info(err)
        assert info.reason == "FILES_PRUNED" and info.metadata["message_id"] == ids[1]
        cut = await c.rewind(sid, ids[1], CONVERSATION)
        assert cut.conversation.rewound
        assert [p.message_id for p in (await c.points(sid)).points] == ids[:1]
        assert read(cwd / "data.txt") == "two\n", "a conversation rewind leaves the files"


async def test_a_session_without_snapshots_keeps_the_clis_backups_its_kept_points_need(
    tmp_path: Path,
) -> None:
    async with serve(tmp_path, workspace_snapshots=True, retain_file_points=2) as c:
        sid, cwd, ids = await _four_turns(c, workspace_snapshots=False)
        await _settled(c, sid)
        points = list((await c.points(sid)).points)
        assert _pruned(points) == [True, True, False, False]
        assert [p.files_rewindable for p in points] == [False, False, True, True]
        assert c.running is not None
        history = c.running.config.claude_config_dir / "file-history" / sid
        assert _versions(history) == [3, 4]
        # The CLI restores a kept point from the backups left.
        kept = await c.rewind(sid, ids[2], FILES)
        assert kept.files.can_rewind and kept.files.source == CHECKPOINT
        assert read(cwd / "data.txt") == "two\n"
        err = await _refused(c.rewind(sid, ids[0], FILES))
        assert error_info(err).reason == "FILES_PRUNED"


def _bash() -> struct_pb2.Struct:
    options = struct_pb2.Struct()
    options.update({"allowed_tools": ["Bash"]})
    return options


async def _history_bytes(c: Client, sid: str) -> int:
    return int((await c.get(sid)).storage.history_bytes)


async def test_the_sessions_history_shrinks_once_retention_prunes(tmp_path: Path) -> None:
    async with serve(tmp_path, workspace_snapshots=True, retain_file_points=2) as c:
        session = await c.create(options=_bash())
        sid = session.session_id
        await c.prompt(sid, "bash head -c 3000000 /dev/urandom > big.bin")
        await c.prompt(sid, "bash rm big.bin")
        await _settled(c, sid)
        deadline = time.monotonic() + 20
        while (grown := await _history_bytes(c, sid)) < 3_000_000 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert grown >= 3_000_000, "the snapshots hold big.bin"
        await c.prompt(sid, "write small.txt one")
        await c.prompt(sid, "write small.txt two")  # the first two points pruned now
        await _settled(c, sid)
        deadline = time.monotonic() + 20
        while (shrunk := await _history_bytes(c, sid)) > grown - 2_500_000 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert shrunk <= grown - 2_500_000, (grown, shrunk)


async def test_points_older_than_the_age_bound_are_pruned(tmp_path: Path) -> None:
    """An age bound of 0.0002 days (17.3 s), in real time: two turns, a wait, a third turn."""
    days = 0.0002
    async with serve(tmp_path, workspace_snapshots=True, retain_file_days=days) as c:
        session = await c.create()
        sid, cwd = session.session_id, Path(session.cwd)
        ids = [prompt_id(await c.prompt(sid, text)) for text in TURNS[:2]]
        await _settled(c, sid)
        assert _pruned(list((await c.points(sid)).points)) == [False, False], "young yet"
        second = (await c.points(sid)).points[1].create_time.ToDatetime(tzinfo=UTC)
        wait = (second - datetime.now(UTC)).total_seconds() + days * 86400 + 1
        await asyncio.sleep(max(0.0, wait))
        ids.append(prompt_id(await c.prompt(sid, TURNS[2])))
        await _settled(c, sid)
        points = list((await c.points(sid)).points)
        assert _pruned(points) == [True, True, False]
        assert [p.files_rewindable for p in points] == [False, False, True]
        kept = await c.rewind(sid, ids[2], FILES)
        assert kept.files.can_rewind and read(cwd / "data.txt") == "two\n"
        assert error_info(await _refused(c.rewind(sid, ids[1], FILES))).reason == "FILES_PRUNED"


@pytest.mark.parametrize("step", ["retention.marked", "retention.pruned", "retention.collected"])
async def test_a_server_killed_while_pruning_leaves_kept_points_whole_and_the_next_start_finishes(
    tmp_path: Path, step: str
) -> None:
    server = ServerProcess(tmp_path / "state", args=["--retain-file-points", "2"])
    try:
        # The third turn's pass prunes the first point; the fourth's, killed at `step`, the second.
        await server.start(fault=f"{step}@2")
        c = client_of(server)
        session = await c.create()
        sid, cwd = session.session_id, Path(session.cwd)
        (cwd / "base.txt").write_text("there before the first turn\n")
        ids = [prompt_id(await c.prompt(sid, text)) for text in TURNS[:3]]
        starts = _starts(server.state_dir / "ledger.sqlite3", sid)
        with contextlib.suppress(grpc.aio.AioRpcError):  # its stream may end before the kill, or not
            await c.prompt(sid, TURNS[3])
        assert await server.wait() == -9
        await server.start()
        c = client_of(server)
        points = list((await c.points(sid)).points)
        ids.append(points[3].message_id)
        assert _pruned(points) == [True, True, False, False], "marked before anything was deleted"
        # The start finishes the pass the kill cut short: the second point's snapshots and backup go.
        repo = server.state_dir / "snapshots" / f"{sid}.git"
        history = server.config_dir / "file-history" / sid
        deadline = time.monotonic() + 30
        while (_has(repo, starts[ids[1]]) or _versions(history) != [3, 4]) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert not _has(repo, starts[ids[1]]) and not _has(repo, starts[ids[0]])
        assert _versions(history) == [3, 4]
        assert not (repo / "agent-rewind-retention").exists()
        # Every kept point still rewinds its files.
        for target, held in ((ids[3], "three\n"), (ids[2], "two\n")):
            done = await c.rewind(sid, target, FILES)
            assert done.files.can_rewind and done.files.source == SNAPSHOT
            assert read(cwd / "data.txt") == held
        assert error_info(await _refused(c.rewind(sid, ids[1], FILES))).reason == "FILES_PRUNED"
    finally:
        await server.close()


async def test_the_latest_rewind_stays_undoable_while_its_point_is_kept(tmp_path: Path) -> None:
    """A pass at the next start (there is an age bound) under a tighter count: the undo of a
    rewind to the point still kept works after the collection; of one to the point pruned now, it
    is UNDO_UNAVAILABLE."""
    async with serve(tmp_path, workspace_snapshots=True, retain_file_points=2) as c:
        kept_sid, kept_cwd, kept_ids = await _four_turns(c)
        pruned_sid, _, pruned_ids = await _four_turns(c)
        await _settled(c, kept_sid)
        await _settled(c, pruned_sid)
        to_kept = await c.rewind(kept_sid, kept_ids[3], FILES)
        to_pruned = await c.rewind(pruned_sid, pruned_ids[2], FILES)
        assert read(kept_cwd / "data.txt") == "three\n"
    async with serve(tmp_path, workspace_snapshots=True, retain_file_points=1, retain_file_days=30) as c:
        await _settled(c, kept_sid)
        await _settled(c, pruned_sid)
        assert _pruned(list((await c.points(kept_sid)).points)) == [True, True, True, False]
        undone = await c.rewinds.UndoRewind(_undo(kept_sid, to_kept.rewind_id))
        assert undone.files.can_rewind and read(kept_cwd / "data.txt") == "four\n"
        err = await _refused(c.rewinds.UndoRewind(_undo(pruned_sid, to_pruned.rewind_id)))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert error_info(err).reason == "UNDO_UNAVAILABLE" and "retention" in err.details()


def _undo(sid: str, rewind_id: str) -> rewind_service_pb2.UndoRewindRequest:
    return rewind_service_pb2.UndoRewindRequest(session_id=sid, rewind_id=rewind_id)


async def test_a_replica_that_does_not_own_the_session_shows_its_pruned_points(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    """ListRewindPoints served from the shared ledger by another replica: the same marks."""
    url = postgres.url(postgres.create_database())
    async with replicas(tmp_path / "state", url, count=2, workspace_snapshots=True, retain_file_points=2) as (
        owner,
        other,
    ):
        session = await owner.create()
        sid = session.session_id
        for text in TURNS[:3]:
            await owner.prompt(sid, text)
        await _settled(owner, sid)
        theirs = list((await other.points(sid)).points)
        assert _pruned(theirs) == [True, False, False]
        assert [p.files_rewindable for p in theirs] == [False, True, True]
        assert theirs == list((await owner.points(sid)).points)
