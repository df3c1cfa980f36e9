"""Files rewinds from workspace snapshots, end to end: a real server, real Claude Code processes.

What the CLI's checkpoints cannot restore (Bash edits, subagent edits, points beyond its window)
comes back from the service's snapshots; someone else's edit is never destroyed unasked; a point
whose snapshot is incomplete is served by the CLI's checkpoints or refused, never half restored
from the snapshots; nothing in the workspace runs.
"""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2

from agent_rewind.api.v1 import rewind_pb2, session_service_pb2
from agent_rewind.snapshots import SnapshotStore
from agent_rewind.testing.server_process import ServerProcess
from tests.integration.harness import BOTH, FILES, Client, client_of, error_info, prompt_id, read, serve

SNAPSHOT = rewind_pb2.FILES_SOURCE_SNAPSHOT
CHECKPOINT = rewind_pb2.FILES_SOURCE_CHECKPOINT


def _bash_allowed() -> struct_pb2.Struct:
    options = struct_pb2.Struct()
    options.update({"allowed_tools": ["Bash", "Agent"]})
    return options


async def _session(c: Client, **kw: Any) -> tuple[str, Path]:
    session = await c.create(options=_bash_allowed(), **kw)
    assert session.workspace_snapshots == kw.get("workspace_snapshots", True), "on by default"
    return session.session_id, Path(session.cwd)


def _snapshots_by_how() -> dict[str, float]:
    """How many complete snapshots this process has taken, by how (the server runs in it)."""
    from agent_rewind.metrics import REGISTRY

    return {
        how: REGISTRY.get_sample_value(
            "agent_rewind_workspace_snapshots_total", {"how": how, "complete": "true"}
        )
        or 0.0
        for how in ("scan", "watched", "paths", "unchanged")
    }


async def test_bash_and_subagent_edits_are_restored_from_the_snapshot(tmp_path: Path) -> None:
    before = _snapshots_by_how()
    async with serve(tmp_path, workspace_snapshots=True) as c:
        sid, cwd = await _session(c)
        first = prompt_id(await c.prompt(sid, "write keep.txt kept\nbash echo one > shell.txt"))
        second = prompt_id(
            await c.prompt(
                sid,
                "bash echo two > shell.txt && mkdir -p gen && echo made > gen/new.txt && rm keep.txt",
            )
        )
        await c.prompt(sid, "agent write sub.txt from the subagent\nsay delegated")
        assert (read(cwd / "shell.txt"), read(cwd / "gen/new.txt"), read(cwd / "sub.txt")) == (
            "two\n",
            "made\n",
            "from the subagent\n",
        )
        points = await c.points(sid)
        assert all(p.snapshot_available and p.files_rewindable for p in points.points)

        preview = await c.dry_run(sid, second, FILES, include_diff=True)
        assert preview.files.can_rewind and preview.files.source == SNAPSHOT
        assert sorted(Path(f).relative_to(cwd).as_posix() for f in preview.files.files_changed) == [
            "gen/new.txt",
            "keep.txt",
            "shell.txt",
            "sub.txt",
        ]
        diffs = {d.path: d for d in preview.files.diffs}
        assert diffs["shell.txt"].change == rewind_pb2.FILE_CHANGE_MODIFIED
        assert "-two" in diffs["shell.txt"].unified_diff and "+one" in diffs["shell.txt"].unified_diff
        assert diffs["keep.txt"].change == rewind_pb2.FILE_CHANGE_ADDED
        assert diffs["sub.txt"].change == rewind_pb2.FILE_CHANGE_DELETED

        result = await c.rewind(sid, second, FILES)
        assert result.files.source == SNAPSHOT
        assert list(result.files.files_changed) == list(preview.files.files_changed), "as the dry run said"
        assert (read(cwd / "shell.txt"), read(cwd / "keep.txt")) == ("one\n", "kept\n")
        assert read(cwd / "gen/new.txt") is None and read(cwd / "sub.txt") is None
        # And to the very first point: the workspace as it was before any turn.
        await c.rewind(sid, first, FILES)
        assert read(cwd / "shell.txt") is None and read(cwd / "keep.txt") is None
    # The workspace was scanned once, when the session went live; after that the watch told each
    # snapshot what the CLI's tools and subagent changed: files hashed alone, a new directory
    # scanned alone, nothing to do where nothing changed.
    taken = {how: n - before[how] for how, n in _snapshots_by_how().items()}
    assert taken["scan"] == 1 and taken["watched"] >= 2 and taken["paths"] >= 1 and taken["unchanged"] >= 1, (
        taken
    )


async def test_an_edit_made_outside_the_agent_is_never_destroyed_unasked(tmp_path: Path) -> None:
    async with serve(tmp_path, workspace_snapshots=True) as c:
        sid, cwd = await _session(c)
        await c.prompt(sid, "write a.txt agent one\nwrite b.txt agent b")
        point = prompt_id(await c.prompt(sid, "write a.txt agent two\nwrite b.txt agent b2"))
        # A person edits a.txt after the agent's last turn, and writes a file of their own.
        (cwd / "a.txt").write_text("human\n")
        (cwd / "mine.txt").write_text("person's\n")

        preview = await c.dry_run(sid, point, FILES)
        assert not preview.files.can_rewind
        assert [(x.path, x.resolution) for x in preview.files.conflicts] == [
            ("a.txt", rewind_pb2.CONFLICT_RESOLUTION_REFUSED)
        ]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.rewind(sid, point, FILES)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert error_info(err.value).reason == "EXTERNAL_CHANGES"
        assert (read(cwd / "a.txt"), read(cwd / "b.txt")) == ("human\n", "agent b2\n"), "nothing applied"

        skipped = await c.rewind(sid, point, FILES, conflict_policy=rewind_pb2.CONFLICT_POLICY_SKIP)
        assert [(x.path, x.resolution) for x in skipped.files.conflicts] == [
            ("a.txt", rewind_pb2.CONFLICT_RESOLUTION_SKIPPED)
        ]
        assert (read(cwd / "a.txt"), read(cwd / "b.txt")) == ("human\n", "agent b\n")

        await c.prompt(sid, "write a.txt agent three")
        (cwd / "a.txt").write_text("human again\n")
        overwritten = await c.rewind(sid, point, FILES, conflict_policy=rewind_pb2.CONFLICT_POLICY_OVERWRITE)
        assert [(x.path, x.resolution) for x in overwritten.files.conflicts] == [
            ("a.txt", rewind_pb2.CONFLICT_RESOLUTION_OVERWRITTEN)
        ]
        assert read(cwd / "a.txt") == "agent one\n"
        assert read(cwd / "mine.txt") == "person's\n", "a path only the person touched is never changed"


async def test_a_point_beyond_the_clis_window_is_restored_from_its_snapshot(tmp_path: Path) -> None:
    async with serve(tmp_path, workspace_snapshots=True) as c:
        sid, cwd = await _session(c)
        first = prompt_id(await c.prompt(sid, "write early.txt before"))
        for i in range(105):
            await c.prompt(sid, f"bash echo {i} > counter.txt")
        points = await c.all_points(sid)
        assert points[0].message_id == first and points[0].snapshot_available
        result = await c.rewind(sid, first, FILES)
        assert result.files.source == SNAPSHOT
        assert read(cwd / "early.txt") is None and read(cwd / "counter.txt") is None


async def test_a_point_whose_snapshot_hit_a_bound_is_served_by_the_checkpoints_never_by_half_a_snapshot(
    tmp_path: Path,
) -> None:
    async with serve(tmp_path, workspace_snapshots=True, snapshot_max_file_bytes=1000) as c:
        sid, cwd = await _session(c)
        tracked = await _session(c, enable_file_checkpointing=False, workspace_snapshots=True)
        targets = {}
        for session in (sid, tracked[0]):
            before = prompt_id(await c.prompt(session, "write small.txt s"))
            big = prompt_id(
                await c.prompt(session, "bash head -c 5000 /dev/zero > big.bin\nwrite small.txt t")
            )
            await c.prompt(session, "write small.txt u")
            targets[session] = (before, big)
        before, big = targets[sid]
        points = {p.message_id: p for p in await c.all_points(sid)}
        # Their start snapshots are complete, but a later one (big's end) is not: a rewind to
        # either would read it, so snapshots cannot serve them; the CLI's checkpoints can.
        for target in (before, big):
            assert not points[target].snapshot_available and points[target].files_rewindable
        preview = await c.dry_run(sid, big, FILES)
        assert preview.files.source == CHECKPOINT and preview.files.can_rewind
        result = await c.rewind(sid, big, FILES)
        assert result.files.source == CHECKPOINT
        assert read(cwd / "small.txt") == "s\n", "what the CLI tracked is restored"
        assert read(cwd / "big.bin") is not None, "a Bash edit is beyond the checkpoints, as documented"

        # Without checkpoints nothing can serve them: refused, nothing restored.
        other, other_cwd = tracked
        points = {p.message_id: p for p in await c.all_points(other)}
        for target in targets[other]:
            assert not points[target].snapshot_available and not points[target].files_rewindable
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.rewind(other, target, FILES)
            info = error_info(err.value)
            assert info.reason == "SNAPSHOT_UNAVAILABLE", target
            assert info.metadata["snapshot_state"] == "too_large"
        assert read(other_cwd / "small.txt") == "u\n", "nothing restored"


async def test_a_hostile_workspace_runs_nothing_and_touches_nothing_outside(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "target.txt").write_text("outside\n")
    marker = tmp_path / "ran"
    async with serve(tmp_path / "state", workspace_snapshots=True) as c:
        sid, cwd = await _session(c)
        git = cwd / ".git"
        (git / "hooks").mkdir(parents=True)
        script = f"#!/bin/sh\ntouch {marker}\n"
        for hook in ("pre-commit", "post-checkout", "post-index-change", "fsmonitor-watchman"):
            path = git / "hooks" / hook
            path.write_text(script)
            path.chmod(path.stat().st_mode | stat.S_IXUSR)
        (git / "config").write_text(
            f"[core]\n\tfsmonitor = sh -c 'touch {marker}'\n\thooksPath = hooks\n"
            f"[filter \"x\"]\n\tclean = sh -c 'touch {marker}; cat'\n\tsmudge = sh -c 'touch {marker}; cat'\n"
        )
        (cwd / ".gitattributes").write_text("* filter=x\n")
        os.symlink(outside, cwd / "out")
        os.symlink(outside / "target.txt", cwd / "link.txt")
        point = prompt_id(await c.prompt(sid, "write a.txt one"))
        await c.prompt(
            sid, "bash rm out link.txt && mkdir out && echo inside > out/target.txt\nwrite a.txt two"
        )
        result = await c.rewind(sid, point, FILES)
        assert result.files.source == SNAPSHOT
        assert os.readlink(cwd / "out") == str(outside) and os.readlink(cwd / "link.txt") == str(
            outside / "target.txt"
        ), "the links come back as links"
        assert (outside / "target.txt").read_text() == "outside\n", "nothing written through them"
        assert sorted(p.name for p in outside.iterdir()) == ["target.txt"]
        assert not marker.exists(), "no hook, filter or fsmonitor ran"


async def test_without_snapshots_the_clis_checkpoints_serve(tmp_path: Path) -> None:
    async with serve(tmp_path, workspace_snapshots=True) as c:
        sid, cwd = await _session(c, workspace_snapshots=False)
        point = prompt_id(await c.prompt(sid, "write a.txt one"))
        await c.prompt(sid, "write a.txt two")
        assert not (await c.points(sid)).points[0].snapshot_available
        result = await c.rewind(sid, point, FILES)
        assert result.files.source == CHECKPOINT
        assert read(cwd / "a.txt") is None
    async with serve(tmp_path / "off", workspace_snapshots=False) as c:
        session = await c.create()
        assert not session.workspace_snapshots, "the server's default"


async def test_snapshot_bytes_are_reported_listed_and_both_mode_cuts_the_conversation_too(
    tmp_path: Path,
) -> None:
    async with serve(tmp_path, workspace_snapshots=True) as c:
        sid, cwd = await _session(c)
        await c.prompt(sid, "say hello")
        point = prompt_id(await c.prompt(sid, "bash echo one > s.txt"))
        await c.prompt(sid, "bash echo two > s.txt")
        held = (await c.get(sid)).snapshot_bytes
        assert held > 0
        listed = await c.sessions.ListSessions(session_service_pb2.ListSessionsRequest())
        assert [(s.session_id, s.snapshot_bytes) for s in listed.sessions] == [(sid, held)], "listed too"
        closed = await c.sessions.CloseSession(session_service_pb2.CloseSessionRequest(session_id=sid))
        assert closed.snapshot_bytes == held, "every answer that is a Session says it (the demo showed 0 B)"
        (c_file := cwd / "big.txt").write_bytes(os.urandom(50_000))
        await c.prompt(sid, "say again")  # its snapshots hold big.txt now
        listed = await c.sessions.ListSessions(session_service_pb2.ListSessionsRequest())
        assert listed.sessions[0].snapshot_bytes > held + 40_000, "measured again once it changed"
        c_file.unlink()
        result = await c.rewind(sid, point, BOTH)
        assert result.files.source == SNAPSHOT and result.conversation.rewound
        assert read(cwd / "s.txt") is None
        assert await c.recall(sid) == ["say hello", "recall"]


async def test_a_crash_in_a_snapshot_rewind_is_finished_by_the_restart(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "state")
    try:
        await server.start(fault="rewind.files_restored")
        c = client_of(server)
        session = await c.create(options=_bash_allowed())
        sid, cwd = session.session_id, Path(session.cwd)
        point = prompt_id(await c.prompt(sid, "bash echo one > s.txt"))
        await c.prompt(sid, "bash echo two > s.txt && echo x > extra.txt")
        with pytest.raises(grpc.aio.AioRpcError):
            await c.rewind(sid, point, FILES)
        assert await server.wait() == -9
        await server.start()
        c = client_of(server)
        assert read(cwd / "s.txt") is None and read(cwd / "extra.txt") is None
        events = await c.events(sid)
        assert len(events) == 1 and events[0].files.source == SNAPSHOT
    finally:
        await server.close()


async def test_a_caller_hanging_up_mid_restore_does_not_cut_it_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    restoring = threading.Event()
    original = SnapshotStore.restore

    def slow_restore(self: SnapshotStore, *args: Any, **kwargs: Any) -> None:
        restoring.set()
        time.sleep(0.5)
        original(self, *args, **kwargs)

    monkeypatch.setattr(SnapshotStore, "restore", slow_restore)
    async with serve(tmp_path, workspace_snapshots=True) as c:
        sid, cwd = await _session(c)
        await c.prompt(sid, "bash echo one > s.txt")
        point = prompt_id(await c.prompt(sid, "bash echo two > s.txt"))
        await c.prompt(sid, "bash echo three > s.txt")
        rid = str(uuid.uuid4())
        call = asyncio.ensure_future(c.rewind(sid, point, FILES, request_id=rid))
        assert await asyncio.to_thread(restoring.wait, 10)
        call.cancel()  # the caller hangs up while the files are being restored
        with pytest.raises(asyncio.CancelledError):
            await call
        result = await asyncio.wait_for(c.rewind(sid, point, FILES, request_id=rid), 10)
        assert result.files.source == SNAPSHOT and result.files.can_rewind
        assert read(cwd / "s.txt") == "one\n"
        assert len(await c.events(sid)) == 1, "applied once"


async def test_a_restore_that_fails_midway_puts_back_what_it_wrote_and_applies_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent_rewind.snapshots import files as files_module

    async with serve(tmp_path, workspace_snapshots=True) as c:
        sid, cwd = await _session(c)
        await c.prompt(sid, "write a.txt one\nwrite b.txt one")
        point = prompt_id(await c.prompt(sid, "write a.txt two\nwrite b.txt two"))
        await c.prompt(sid, "write a.txt three\nwrite b.txt three")
        real_write = files_module.Workspace.write

        def disk_full_on_b(self: files_module.Workspace, path: str, mode: str, chunks: Any) -> None:
            if path == "b.txt":
                raise OSError(28, "No space left on device")
            real_write(self, path, mode, chunks)

        monkeypatch.setattr(files_module.Workspace, "write", disk_full_on_b)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.rewind(sid, point, FILES)
        assert (err.value.code(), error_info(err.value).reason) == (
            grpc.StatusCode.UNAVAILABLE,
            "STORAGE_UNAVAILABLE",
        )
        assert (read(cwd / "a.txt"), read(cwd / "b.txt")) == ("three\n", "three\n"), "a.txt put back"
        assert await c.events(sid) == [], "no rewind happened"
        monkeypatch.setattr(files_module.Workspace, "write", real_write)
        result = await c.rewind(sid, point, FILES)  # the disk has room again
        assert result.files.source == SNAPSHOT
        assert (read(cwd / "a.txt"), read(cwd / "b.txt")) == ("one\n", "one\n")


async def test_one_sessions_slow_snapshot_never_delays_another_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow_workspace: list[Path] = []
    taking = threading.Event()
    release = threading.Event()
    original = SnapshotStore.take

    def take(self: SnapshotStore, *args: Any, **kwargs: Any) -> Any:  # a first take has a bound, on_read
        if slow_workspace and self.workspace == slow_workspace[0]:
            taking.set()
            release.wait(30)  # a huge workspace, as long as the test likes
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SnapshotStore, "take", take)
    async with serve(tmp_path, workspace_snapshots=True) as c:
        slow_id, slow_cwd = await _session(c)
        fast_id, fast_cwd = await _session(c)
        slow_workspace.append(slow_cwd)
        slow_turn = asyncio.ensure_future(c.prompt(slow_id, "write a.txt slow"))
        try:
            assert await asyncio.to_thread(taking.wait, 10)
            # The other session's turns, snapshots included, and every read go on meanwhile.
            for i in range(3):
                await asyncio.wait_for(c.prompt(fast_id, f"write b.txt {i}"), 10)
            assert read(fast_cwd / "b.txt") == "2\n"
            assert len((await c.points(fast_id)).points) == 3
            assert not slow_turn.done()
        finally:
            release.set()
        await asyncio.wait_for(slow_turn, 20)
        assert read(slow_cwd / "a.txt") == "slow\n"


def _git(cwd: Path, *args: str) -> None:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": "/nonexistent",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


async def test_a_git_checkout_is_seeded_from_its_git_and_restored_from_it(tmp_path: Path) -> None:
    """A session whose workspace is a git checkout: its first snapshot comes from the checkout's
    index and objects (copied, verified), and a files rewind to the first point restores the
    tracked files the agent changed or deleted, and removes what it made. The checkout's `.git`
    is never written, and its planted fsmonitor never runs."""
    from agent_rewind.metrics import REGISTRY  # the server runs in this process

    def seeded() -> float:
        return (
            REGISTRY.get_sample_value(
                "agent_rewind_workspace_snapshots_total", {"how": "seeded", "complete": "true"}
            )
            or 0.0
        )

    state = tmp_path / "state"
    repo = state / "workspaces" / "repo"
    marker = tmp_path / "fsmonitor-ran"
    past = time.time() - 3600
    for i in range(30):
        path = repo / f"src/m{i % 3}/f{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"value = {i}\n")
        os.utime(path, (past, past))
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "init")
    with (repo / ".git/config").open("a") as config:
        config.write(f'[core]\n\tfsmonitor = "touch {marker}"\n')
    git_before = {p: p.read_bytes() for p in (repo / ".git").rglob("*") if p.is_file()}
    index_mtime = (repo / ".git/index").stat().st_mtime_ns
    before = seeded()
    async with serve(state, workspace_snapshots=True) as c:
        sid = (await c.create(cwd="repo", options=_bash_allowed())).session_id
        first = prompt_id(await c.prompt(sid, "write src/m0/f0.py value = 'changed'\nbash rm src/m1/f1.py"))
        await c.prompt(sid, "write src/new.py made by the agent")
        assert seeded() - before == 1, "the first snapshot was seeded from the checkout's git"
        points = await c.points(sid)
        assert all(p.snapshot_available for p in points.points)
        result = await c.rewind(sid, first, FILES)
        assert result.files.source == SNAPSHOT
        assert read(repo / "src/m0/f0.py") == "value = 0\n"
        assert read(repo / "src/m1/f1.py") == "value = 1\n"
        assert read(repo / "src/new.py") is None
        assert all(read(repo / f"src/m{i % 3}/f{i}.py") == f"value = {i}\n" for i in range(30))
    assert not marker.exists(), "the checkout's fsmonitor ran"
    assert {p: p.read_bytes() for p in (repo / ".git").rglob("*") if p.is_file()} == git_before
    assert (repo / ".git/index").stat().st_mtime_ns == index_mtime
