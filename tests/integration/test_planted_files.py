"""No file an agent plants in its workspace can stall or exhaust the server (issue 36, item 2):
a FIFO, a socket, a 2 GiB sparse file or a file that grows while read, at a path the service
reads for a dry run, a rewind, a fork or the recovery of an interrupted rewind at start. Each
test plays the attacker against a real server and the real CLI, and another principal's session
must keep answering meanwhile."""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
import threading
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest

from agent_rewind.api.v1 import session_pb2, session_service_pb2
from agent_rewind.testing.server_process import ServerProcess
from tests.integration.harness import FILES, Client, client_of, prompt_id

# What another session's GetSession may take while one is attacked: a normal call takes a few
# milliseconds; the freeze the issue found held every call until its deadline.
ANSWERS_WITHIN = 5.0


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _socket(path: Path) -> socket.socket:
    """A listening socket at `path` (bound at a short path, then moved: a workspace's is long)."""
    if path.exists():
        path.unlink()
    short = Path(tempfile.mkdtemp(prefix="sock-")) / "s"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(short))
    sock.listen(1)
    short.rename(path)
    short.parent.rmdir()
    return sock


def _sparse(path: Path) -> None:
    path.unlink()
    with path.open("wb") as f:
        f.truncate(2 << 30)


class Watched:
    """The server process under attack, and the most memory it was seen to hold."""

    def __init__(self, server: ServerProcess) -> None:
        assert server.proc is not None
        self.process = psutil.Process(server.proc.pid)
        self.baseline = self.process.memory_info().rss
        self.peak = self.baseline

    def sample(self) -> None:
        self.peak = max(self.peak, self.process.memory_info().rss)

    def assert_bounded(self) -> None:
        grown = (self.peak - self.baseline) >> 20
        assert grown < 256, f"the server grew by {grown} MiB"


async def _answers(c: Client, session_id: str, during: Awaitable[Any], watched: Watched) -> Any:
    """Runs `during` while another session is asked for, again and again; each answer must come
    within ANSWERS_WITHIN, and the server's memory is sampled meanwhile."""
    task = asyncio.ensure_future(during)
    try:
        while not task.done():
            started = time.monotonic()
            await asyncio.wait_for(c.get(session_id), ANSWERS_WITHIN)
            assert time.monotonic() - started < ANSWERS_WITHIN
            watched.sample()
            await asyncio.sleep(0.02)
        return await task
    finally:
        task.cancel()


async def _two_sessions(c: Client) -> tuple[str, Path, list[str], str]:
    """The attacked session (a.txt made by its second turn) and a bystander."""
    session = await c.create()
    sid, cwd = session.session_id, Path(session.cwd)
    ids = [prompt_id(await c.prompt(sid, p)) for p in ("say hello", "write a.txt one")]
    assert (cwd / "a.txt").read_text() == "one\n"
    other = await c.create()
    await c.prompt(other.session_id, "say hi")
    return sid, cwd, ids, other.session_id


async def _serving(server: ServerProcess) -> tuple[Client, Watched]:
    """The attacked server, in a process of its own (a server whose loop blocks must not block
    the test's), serving from the CLI's checkpoints: snapshots off."""
    server.args = ["--no-workspace-snapshots"]
    await server.start()
    return client_of(server), Watched(server)


def _fork(c: Client, session_id: str) -> Awaitable[session_pb2.Session]:
    return c.sessions.ForkSession(session_service_pb2.ForkSessionRequest(session_id=session_id))


@pytest.mark.parametrize("plant", ["fifo", "socket", "sparse"])
async def test_a_special_or_huge_file_at_a_tracked_path_stalls_no_dry_run_rewind_or_fork(
    server: ServerProcess, plant: str
) -> None:
    c, watched = await _serving(server)
    sid, cwd, ids, other = await _two_sessions(c)
    kept: socket.socket | None = None
    if plant == "fifo":
        _fifo(cwd / "a.txt")
    elif plant == "socket":
        kept = _socket(cwd / "a.txt")
    else:
        _sparse(cwd / "a.txt")
    try:
        preview = await _answers(c, other, c.dry_run(sid, ids[0], FILES), watched)
        assert preview.files.can_rewind
        assert str(cwd / "a.txt") in preview.files.files_changed
        result = await _answers(c, other, c.rewind(sid, ids[0], FILES), watched)
        assert result.files.can_rewind
        # The planted file is what the rewind takes back: a.txt did not exist at the point.
        assert not os.path.lexists(cwd / "a.txt"), plant
        fork = await _answers(c, other, _fork(c, sid), watched)
        assert fork.session_id
    finally:
        if kept is not None:
            kept.close()
    watched.assert_bounded()


async def test_a_fork_leaves_out_what_is_not_a_file_or_a_link_and_waits_on_none(
    server: ServerProcess,
) -> None:
    c, watched = await _serving(server)
    sid, cwd, _, other = await _two_sessions(c)
    os.mkfifo(cwd / "pipe")
    kept = _socket(cwd / "a.txt")
    (cwd / "link").symlink_to("/etc/passwd")
    (cwd / "dir").mkdir()
    (cwd / "dir" / "b.txt").write_text("bee\n")
    try:
        fork = await _answers(c, other, _fork(c, sid), watched)
    finally:
        kept.close()
    copy = Path(fork.cwd)
    assert sorted(p.name for p in copy.iterdir()) == ["dir", "link"]
    assert os.readlink(copy / "link") == "/etc/passwd", "a link is copied as a link"
    assert (copy / "dir" / "b.txt").read_text() == "bee\n"


async def test_a_file_that_grows_while_it_is_read_is_read_no_further_than_its_bound(
    server: ServerProcess,
) -> None:
    c, watched = await _serving(server)
    sid, cwd, ids, other = await _two_sessions(c)
    stop = threading.Event()

    def grow() -> None:
        with (cwd / "a.txt").open("ab") as f:
            while not stop.is_set():
                f.write(b"x" * (1 << 20))
                f.flush()
                if f.tell() > (1 << 30):
                    f.truncate(0)
                    f.seek(0)

    writer = asyncio.get_running_loop().run_in_executor(None, grow)
    try:
        result = await _answers(c, other, c.rewind(sid, ids[0], FILES), watched)
    finally:
        stop.set()
        await writer
    assert result.files.can_rewind
    watched.assert_bounded()


async def test_a_fifo_left_in_an_interrupted_rewind_does_not_stop_the_restarted_server(
    server: ServerProcess,
) -> None:
    """The crash loop of the issue: killed in the middle of a rewind with a FIFO at the path its
    recovery reads, the server starts again, serves every session, and finishes the rewind."""
    server.args = ["--no-workspace-snapshots"]
    await server.start(fault="rewind.intent_recorded", fault_scope="group")
    c = client_of(server)
    sid, cwd, ids, other = await _two_sessions(c)
    _fifo(cwd / "a.txt")
    with pytest.raises(grpc.aio.AioRpcError):
        await c.rewind(sid, ids[0], FILES)
    assert await server.wait() == -9
    await server.start(ready_within=60)
    c = client_of(server)
    started = time.monotonic()
    assert (await c.get(other)).session_id == other
    assert time.monotonic() - started < ANSWERS_WITHIN
    points = [p.message_id for p in (await c.points(sid)).points]
    assert points == ids, "a files rewind keeps the conversation"
    assert not os.path.lexists(cwd / "a.txt"), "the recovered rewind took the FIFO back"
