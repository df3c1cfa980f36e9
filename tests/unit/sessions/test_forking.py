"""ForkSession's steps on disk (sessions/forking.py), on real files, and the fork itself through a
real registry and ledger with the fake CLI (tests/integration/test_history.py runs the real one)."""

from __future__ import annotations

import json
import os
import socket
import stat
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from agent_rewind.config import Config
from agent_rewind.errors import SnapshotUnavailable
from agent_rewind.sessions import forking
from agent_rewind.sessions.adapter import AgentError
from agent_rewind.sessions.registry import NewSessionRequest, SessionRegistry
from agent_rewind.sessions.worker import SessionWorker, WorkerContext
from agent_rewind.snapshots import Limits
from agent_rewind.snapshots.files import open_regular
from agent_rewind.snapshots.taking import Snapshots
from agent_rewind.store.ledger import SnapshotRecord
from agent_rewind.store.sqlite import SqliteLedger
from agent_rewind.testing.fake_agent import FakeClient, FakeFactory, append, prompt_entry, reply_entry
from agent_rewind.transcript.paths import transcript_path

# copy_workspace: a fork of the whole session


def _tree(root: Path) -> dict[str, tuple[str, str | int]]:
    """Every path under `root`: a link's target, a file's text, or a directory's mode."""
    found: dict[str, tuple[str, str | int]] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            found[rel] = ("link", os.readlink(path))
        elif path.is_dir():
            found[rel] = ("dir", stat.S_IMODE(path.lstat().st_mode))
        else:
            found[rel] = ("file", path.read_text())
    return found


def test_a_copy_has_every_directory_file_and_link_with_the_files_modes(tmp_path: Path) -> None:
    """Nested directories, regular files (their permission bits kept, executables too) and links
    (as links, to the same target, dangling ones too) are all in the copy."""
    source, target = tmp_path / "ws", tmp_path / "fork"
    (source / "src" / "deep").mkdir(parents=True)
    (source / "empty").mkdir()
    (source / "a.txt").write_text("a\n")
    (source / "src" / "deep" / "b.txt").write_text("b\n")
    (source / "run.sh").write_text("#!/bin/sh\n")
    (source / "run.sh").chmod(0o755)
    (source / "secret").write_text("s\n")
    (source / "secret").chmod(0o600)
    (source / "to-a").symlink_to("a.txt")
    (source / "src" / "to-deep").symlink_to("deep")
    (source / "dangling").symlink_to("no-such-file")
    target.mkdir()

    forking.copy_workspace(source, target)

    assert _tree(target) == _tree(source)
    assert (target / "to-a").is_symlink() and (target / "src" / "to-deep").is_symlink()
    assert (target / "dangling").is_symlink()
    assert stat.S_IMODE((target / "run.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((target / "secret").stat().st_mode) == 0o600


def test_a_copy_makes_its_target_and_the_directories_above_it(tmp_path: Path) -> None:
    """The fork's workspace need not exist yet, nor its parent."""
    source, target = tmp_path / "ws", tmp_path / "new" / "fork"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "x.txt").write_text("x\n")

    forking.copy_workspace(source, target)

    assert _tree(target) == _tree(source)


def test_a_retried_copy_overwrites_what_the_first_left_links_included(tmp_path: Path) -> None:
    """A fork retried after a copy that was cut short copies over what is there."""
    source, target = tmp_path / "ws", tmp_path / "fork"
    source.mkdir()
    (source / "a.txt").write_text("now\n")
    (source / "link").symlink_to("a.txt")
    forking.copy_workspace(source, target)
    (source / "a.txt").write_text("later, and longer\n")
    (source / "link").unlink()
    (source / "link").symlink_to("elsewhere")

    forking.copy_workspace(source, target)

    assert _tree(target) == {"a.txt": ("file", "later, and longer\n"), "link": ("link", "elsewhere")}


def test_a_link_out_of_the_workspace_is_copied_as_a_link_and_never_followed(tmp_path: Path) -> None:
    """A link to a directory or a file outside the workspace is copied as a link: nothing is read
    from where it leads, and nothing there is written or truncated."""
    source, target, outside = tmp_path / "ws", tmp_path / "fork", tmp_path / "outside"
    source.mkdir()
    outside.mkdir()
    (outside / "private.txt").write_text("not the agent's\n")
    (source / "out").symlink_to(outside)
    (source / "out-file").symlink_to(outside / "private.txt")
    target.mkdir()

    forking.copy_workspace(source, target)

    assert _tree(target) == {
        "out": ("link", str(outside)),
        "out-file": ("link", str(outside / "private.txt")),
    }
    assert (outside / "private.txt").read_text() == "not the agent's\n"
    assert [p.name for p in outside.iterdir()] == ["private.txt"]


def test_fifos_and_sockets_are_left_out_and_never_waited_on(tmp_path: Path) -> None:
    """A FIFO nobody writes to would block a reader forever; a socket cannot be read: both are
    left out of the copy (and the copy returns)."""
    source, target = tmp_path / "ws", tmp_path / "fork"
    source.mkdir()
    os.mkfifo(source / "pipe")
    (source / "a.txt").write_text("a\n")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(source / "sock"))

        forking.copy_workspace(source, target)

    assert _tree(target) == {"a.txt": ("file", "a\n")}


def test_a_workspace_that_is_a_link_or_not_absolute_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The source must be a directory of its own, named absolutely: a link to one is not walked
    (wherever it leads), and a relative name is not taken from the service's own directory."""
    real, target = tmp_path / "real", tmp_path / "fork"
    real.mkdir()
    (real / "a.txt").write_text("a\n")
    (tmp_path / "link").symlink_to(real)

    with pytest.raises(OSError, match="not a directory of its own"):
        forking.copy_workspace(tmp_path / "link", target)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OSError, match="not a directory of its own"):
        forking.copy_workspace(Path("real"), target)
    assert not target.exists()


def test_what_vanishes_during_the_walk_is_left_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file, a link or a directory deleted after its directory was listed (a process of the
    agent's still at work) is not in the copy, and the rest is."""
    source, target = tmp_path / "ws", tmp_path / "fork"
    (source / "gone-dir").mkdir(parents=True)
    (source / "gone-dir" / "x.txt").write_text("x\n")
    (source / "gone.txt").write_text("g\n")
    (source / "gone-link").symlink_to("gone.txt")
    (source / "kept.txt").write_text("k\n")
    real_fwalk = os.fwalk

    def vanishing(*args: Any, **kwargs: Any) -> Iterator[Any]:
        for top, dirs, names, dirfd in real_fwalk(*args, **kwargs):
            if Path(top) == source:
                assert {"gone-dir", "gone.txt", "gone-link"} <= set(dirs + names), "listed first"
                (source / "gone-dir" / "x.txt").unlink()
                (source / "gone-dir").rmdir()
                (source / "gone.txt").unlink()
                (source / "gone-link").unlink()
            yield top, dirs, names, dirfd

    monkeypatch.setattr(os, "fwalk", vanishing)
    forking.copy_workspace(source, target)

    assert _tree(target) == {"kept.txt": ("file", "k\n")}


@pytest.mark.parametrize("fifo", [True, False], ids=["swapped-for-a-fifo", "deleted"])
def test_a_file_swapped_or_deleted_before_it_is_opened_is_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fifo: bool
) -> None:
    """A regular file when it was looked at, a FIFO (never opened) or nothing when it is opened:
    left out, and the rest is copied."""
    source, target = tmp_path / "ws", tmp_path / "fork"
    source.mkdir()
    (source / "swapped").write_text("a file, at first\n")
    (source / "kept.txt").write_text("k\n")
    real_open = open_regular

    def swapping(name: str | Path, parent: int | None = None) -> int:
        if name == "swapped":
            os.unlink(name, dir_fd=parent)
            if fifo:
                os.mkfifo(name, dir_fd=parent)
        return real_open(name, parent)

    monkeypatch.setattr(forking, "open_regular", swapping)
    forking.copy_workspace(source, target)

    assert _tree(target) == {"kept.txt": ("file", "k\n")}


# start_tree: the files of a fork at a point


def _record(ref: str, tree: str | None, *, complete: bool = True, kind: str = "turn_start") -> SnapshotRecord:
    return SnapshotRecord(0, "s", kind, ref, tree, complete, "" if complete else "too big", datetime.now(UTC))


def test_the_start_tree_is_the_newest_turn_start_of_the_point() -> None:
    """The snapshot taken when the point's turn started (its newest, after a retried turn); a
    point with none has no files to fork."""
    records = [
        _record("p1", "t-old"),
        _record("p1", "t-end", kind="turn_end"),
        _record("p1", "t-new"),
        _record("p2", "t-p2"),
    ]
    assert forking.start_tree(records, "p1") == "t-new"
    with pytest.raises(SnapshotUnavailable) as err:
        forking.start_tree(records, "p3")
    assert err.value.metadata["snapshot_state"] == "none"


@pytest.mark.parametrize(
    ("tree", "complete"), [("a-partial-tree", False), (None, True)], ids=["incomplete", "without-tree"]
)
def test_a_point_whose_start_snapshot_is_incomplete_or_has_no_tree_has_no_files_to_fork(
    tree: str | None, complete: bool
) -> None:
    """An incomplete snapshot (some files left out) is never a fork's workspace, even with a tree."""
    with pytest.raises(SnapshotUnavailable) as err:
        forking.start_tree([_record("p1", tree, complete=complete)], "p1")
    assert err.value.metadata["snapshot_state"] == "incomplete"


# write_transcript: the fork's conversation


def _cli_line(entry: dict[str, Any]) -> bytes:
    """A transcript line as the CLI writes it (JSON.stringify: compact, UTF-8 as it is)."""
    return json.dumps(entry, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def _entry(uid: str, session_id: str, cwd: str, text: str) -> dict[str, Any]:
    return {
        "type": "user",
        "uuid": uid,
        "parentUuid": None,
        "isSidechain": False,
        "sessionId": session_id,
        "cwd": cwd,
        "message": {"role": "user", "content": [{"type": "text", "text": text}]},
        "toolUseResult": {"exitCode": 0, "interrupted": False, "stdout": f"{cwd}/a.txt", "size": 12.5},
        "snapshot": None,
    }


def test_the_fork_s_transcript_is_the_source_s_lines_renamed_and_otherwise_as_written(tmp_path: Path) -> None:
    """The lines at the offsets, in their order, each with the fork's id and workspace and nothing
    else changed: numbers, booleans and nulls as they were, non-ASCII text in UTF-8 as the CLI
    writes it (escaped, a conversation in Japanese would take twice the bytes)."""
    source = tmp_path / "source.jsonl"
    lines = [
        _cli_line(_entry("u1", "src", "/ws/src", "hello")),
        _cli_line(_entry("u2", "src", "/ws/src", "skipped")),
        _cli_line(_entry("u3", "src", "/ws/src", "ファイルを読む ✓ /ws/src/b.txt")),
    ]
    source.write_bytes(b"".join(lines))
    offsets = [len(lines[0]) + len(lines[1]), 0]
    target = tmp_path / "config" / "projects" / "-ws-fork" / "fork.jsonl"

    forking.write_transcript(source, target, offsets, "fork", "/ws/fork/", "/ws/src/")

    assert target.read_bytes() == (
        _cli_line(_entry("u3", "fork", "/ws/fork", "ファイルを読む ✓ /ws/fork/b.txt"))
        + _cli_line(_entry("u1", "fork", "/ws/fork", "hello"))
    )
    assert not list(target.parent.glob(".*")), "no scratch file is left"


def test_a_fork_s_transcript_is_written_beside_others_already_in_its_directory(tmp_path: Path) -> None:
    """Two workspaces can share the CLI's project directory (the name is the path with every
    other character a '-'): a fork's transcript joins what is there and leaves it alone."""
    source = tmp_path / "source.jsonl"
    source.write_bytes(_cli_line(_entry("u1", "src", "/ws/src", "hi")))
    project = tmp_path / "projects" / "-ws-a-b"
    project.mkdir(parents=True)
    (project / "other.jsonl").write_text("another session's\n")

    forking.write_transcript(source, project / "fork.jsonl", [0], "fork", "/ws/a-b", "/ws/src")

    assert (project / "other.jsonl").read_text() == "another session's\n"
    assert json.loads((project / "fork.jsonl").read_text())["sessionId"] == "fork"


# Forks.fork, through a real registry and ledger


class _World:
    """A registry over a real SQLite ledger whose sessions' CLI is the fake one; `restart` makes
    another registry over the same ledger, as a restarted server has."""

    def __init__(self, tmp_path: Path, ledger: SqliteLedger, snapshots: Snapshots | None) -> None:
        self.config = Config(state_dir=tmp_path).resolved()
        self.ledger = ledger
        self.snapshots = snapshots
        self.failing_start = False
        self.factory = FakeFactory(self._setup, config_dir=self.config.claude_config_dir)
        self.registry = self._registry()

    def _setup(self, client: FakeClient) -> None:
        if self.failing_start:
            client.start_error = AgentError("the CLI could not start")

    def _registry(self) -> SessionRegistry:
        ctx = WorkerContext(
            ledger=self.ledger,
            client_factory=self.factory,
            cli_env={},
            claude_config_dir=self.config.claude_config_dir,
            idle_timeout=0.0,
            snapshots=self.snapshots,
        )
        return SessionRegistry(config=self.config, ledger=self.ledger, ctx=ctx)

    async def restart(self) -> None:
        await self.registry.shutdown(0)
        self.registry = self._registry()
        await self.registry.load()

    async def source(
        self, *, workspace_snapshots: bool = False, prompts: int = 2
    ) -> tuple[SessionWorker, list[str]]:
        """A session with `prompts` turns in its transcript (each a prompt and its answer) and a
        file in its workspace."""
        worker = await self.registry.create(
            NewSessionRequest("", "", {}, True, workspace_snapshots, "", principal="alice")
        )
        (Path(worker.record.cwd) / "a.txt").write_text("a\n")
        ids = self.say(worker, *(f"prompt {n}" for n in range(prompts)))
        return worker, ids

    def say(self, worker: SessionWorker, *texts: str, parent: str | None = None) -> list[str]:
        """Turns appended to the session's transcript, as its CLI writes them."""
        path = transcript_path(self.config.claude_config_dir, worker.record.cwd, worker.session_id)
        if parent is None and path.exists():
            parent = json.loads(path.read_text().splitlines()[-1])["uuid"]
        ids = []
        for text in texts:
            prompt, reply = str(uuid.uuid4()), str(uuid.uuid4())
            append(path, prompt_entry(prompt, parent, text), reply_entry(reply, prompt, f"echo: {text}"))
            ids.append(prompt)
            parent = reply
        return ids

    def transcript(self, worker: SessionWorker) -> list[str]:
        """The prompts of a session's transcript, in order."""
        path = transcript_path(self.config.claude_config_dir, worker.record.cwd, worker.session_id)
        entries = [json.loads(line) for line in path.read_text().splitlines()]
        return [e["message"]["content"] for e in entries if e["type"] == "user"]


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[_World]:
    ledger = await SqliteLedger.open(tmp_path / "ledger.sqlite3")
    made = _World(tmp_path, ledger, None)
    yield made
    await made.registry.shutdown(0)
    await ledger.close()


def _fork_request(request_id: str = "") -> NewSessionRequest:
    return NewSessionRequest("", "", {}, True, True, request_id, principal="alice", fresh_workspace=True)


async def test_a_whole_fork_copies_the_conversation_and_files_and_logs_it_as_of_now(world: _World) -> None:
    """A fork of the whole session: its conversation and its files as they are, its CLI resumed
    at the source's leaf; the log says it was forked as of now."""
    source, _ = await world.source()
    with capture_logs() as logs:
        fork = await world.registry.fork(source, "", _fork_request())
    assert world.transcript(fork) == ["prompt 0", "prompt 1"]
    assert (Path(fork.record.cwd) / "a.txt").read_text() == "a\n"
    assert fork.record.started and world.factory.last.started
    [forked] = [e for e in logs if e["event"] == "session forked"]
    assert (forked["source"], forked["fork"], forked["at"]) == (source.session_id, fork.session_id, "now")


async def test_a_retried_fork_after_a_restart_is_the_fork_first_made_not_a_new_copy(world: _World) -> None:
    """The ledger records that the fork's conversation was written: after a restart, a retry of
    the fork (the same request id) answers the fork as it is, and copies nothing again from a
    source that has gone on meanwhile."""
    source, _ = await world.source()
    rid = str(uuid.uuid4())
    fork = await world.registry.fork(source, "", _fork_request(rid))
    await world.restart()
    source = world.registry.get(source.session_id)
    world.say(source, "prompt 2")
    (Path(source.record.cwd) / "later.txt").write_text("after the fork\n")

    again = await world.registry.fork(source, "", _fork_request(rid))

    assert again.session_id == fork.session_id
    assert world.transcript(again) == ["prompt 0", "prompt 1"]
    assert not (Path(again.record.cwd) / "later.txt").exists()


async def test_a_fork_whose_cli_cannot_start_is_kept_and_a_retry_starts_it(world: _World) -> None:
    """The fork's conversation is written before its CLI starts: a CLI that fails to start leaves
    the fork (not forgotten, its files and transcript not orphaned), a retry of the call answers
    that fork, and its CLI resumes its conversation when it is used."""
    source, _ = await world.source()
    rid = str(uuid.uuid4())
    world.failing_start = True
    with pytest.raises(Exception, match="could not start"):
        await world.registry.fork(source, "", _fork_request(rid))
    failed = world.factory.last.spec.session_id
    assert failed != source.session_id
    stored = await world.ledger.session(failed)
    assert stored is not None and stored.started, "the fork is still there"

    world.failing_start = False
    again = await world.registry.fork(source, "", _fork_request(rid))

    assert again.session_id == failed
    assert world.transcript(again) == ["prompt 0", "prompt 1"]
    async with again.exclusive():
        await again.ensure_client()
    client = world.factory.last
    assert client.started and client.spec.session_id == failed
    assert client.spec.resume and client.spec.resume_session_at == source.transcript_view().leaf


async def test_a_fork_at_a_point_of_a_session_without_snapshots_is_refused_as_off(world: _World) -> None:
    """A session that takes no workspace snapshots (or a server that takes none, since it was
    created) has no files to start a fork at a point from: SNAPSHOT_UNAVAILABLE, "off", and no
    fork is made."""
    source, ids = await world.source(workspace_snapshots=True)  # made when the server took them
    with pytest.raises(SnapshotUnavailable) as err:
        await world.registry.fork(source, ids[1], _fork_request())
    assert err.value.metadata["snapshot_state"] == "off"

    world.snapshots = Snapshots(world.config.state_dir / "snapshots", world.ledger, Limits())
    try:
        await world.restart()
        source, ids = await world.source(workspace_snapshots=False)
        with pytest.raises(SnapshotUnavailable) as err:
            await world.registry.fork(source, ids[1], _fork_request())
        assert err.value.metadata["snapshot_state"] == "off"
    finally:
        await world.registry.shutdown(0)
        world.snapshots.close()
    assert len(await world.ledger.sessions()) == 2, "the two sources, no fork"
