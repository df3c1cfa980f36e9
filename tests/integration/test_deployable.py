"""What a deployment meets first (issue "Deployable"): one server per state dir and a port never
shared (a second server on either stops at once saying why, and the first serves on), and
capabilities that say what works on this host (no git: no snapshots, said at start, and the
CLI's checkpoints serve files rewinds)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gc
import os
import shutil
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent_rewind import agents, components, server, tracing
from agent_rewind.api.v1 import rewind_pb2, rewind_service_pb2, session_service_pb2
from agent_rewind.events import EventHub
from agent_rewind.replicas import Membership
from agent_rewind.rewind.engine import RewindEngine
from agent_rewind.sandbox.proxy import EgressProxy
from agent_rewind.server import StartError, start
from agent_rewind.sessions.registry import SessionRegistry
from agent_rewind.store.sqlite import SqliteLedger
from agent_rewind.testing.server_process import ServerProcess
from agent_rewind.webhooks.delivery import Deliverer
from agent_rewind.webhooks.secrets import new_key
from tests.integration.harness import FILES, prompt_id, read, serve
from tests.integration.harness import test_config as config_of
from tests.pgserver_fixture import PostgresServer


async def test_a_second_server_on_a_state_dir_in_use_stops_naming_the_holder(tmp_path: Path) -> None:
    async with serve(tmp_path / "state") as c:
        first = await c.create()
        with pytest.raises(StartError) as err:
            await start(config_of(tmp_path / "state"))
        assert c.running is not None
        assert "in use by another agent-rewind server" in str(err.value)
        assert f"listening on 127.0.0.1:{c.running.port}" in str(err.value), "it names the holder"
        # The first was not fenced off: it still serves its session.
        assert (await c.get(first.session_id)).session_id == first.session_id
    async with serve(tmp_path / "state") as c:  # once it stopped, the state dir is free
        assert (await c.get(first.session_id)).session_id == first.session_id


async def test_a_port_in_use_is_address_in_use_not_shared(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with serve(tmp_path / "one", listen=f"127.0.0.1:{port}") as c:
        with pytest.raises(OSError, match="address is in use"):
            await start(config_of(tmp_path / "two", listen=f"127.0.0.1:{port}"))
        assert (await c.create()).session_id


async def test_serve_on_a_state_dir_in_use_exits_at_once_naming_the_holder(tmp_path: Path) -> None:
    first = ServerProcess(tmp_path / "state")
    await first.start()
    try:
        second = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "agent-rewind"),
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--state-dir",
            str(first.state_dir),
            "--model",
            "offline",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(second.communicate(), 60)
        assert second.returncode != 0
        assert first.proc is not None
        said = (out + err).decode()
        assert "is in use by another agent-rewind server" in said
        assert f"pid {first.proc.pid}, listening on {first.address}" in said, said
        assert "Traceback" not in said
        assert first.sessions is not None
        listed = await first.sessions.ListSessions(session_service_pb2.ListSessionsRequest())
        assert list(listed.sessions) == [], "the first still serves, not fenced off"
    finally:
        await first.stop()


def _path_without_git(bin_dir: Path) -> str:
    """A PATH with every program of this one but git (links to them)."""
    bin_dir.mkdir()
    for directory in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            target = Path(directory) / name
            if name == "git" or (bin_dir / name).exists() or not os.access(target, os.X_OK):
                continue
            (bin_dir / name).symlink_to(target)
    return str(bin_dir)


async def test_without_git_snapshots_are_off_and_said_so_and_the_checkpoints_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", _path_without_git(tmp_path / "bin"))
    assert shutil.which("git") is None
    async with serve(tmp_path / "state", workspace_snapshots=True) as c:
        said = "".join(capfd.readouterr())
        assert "workspace snapshots are off: git is not installed" in said
        caps = await c.rewinds.GetCapabilities(rewind_service_pb2.GetCapabilitiesRequest())
        assert not caps.workspace_snapshots, "a capability is what works here"
        session = await c.create()
        assert not session.workspace_snapshots
        cwd = Path(session.cwd)
        first = prompt_id(await c.prompt(session.session_id, "write notes.txt one"))
        await c.prompt(session.session_id, "write notes.txt two")
        (point,) = [p for p in await c.all_points(session.session_id) if p.message_id == first]
        assert point.files_rewindable and not point.snapshot_available
        result = await c.rewind(session.session_id, first, FILES)
        assert result.files.source == rewind_pb2.FILES_SOURCE_CHECKPOINT
        assert read(cwd / "notes.txt") is None, "before the first prompt there was no notes.txt"
        assert "git is not installed" not in "".join(capfd.readouterr()), "said once, at start"


def _open_things() -> tuple[list[str], int]:
    """This process's threads (by name) and open file descriptors."""
    return sorted(t.name for t in threading.enumerate()), len(os.listdir("/proc/self/fd"))


async def test_a_start_that_fails_after_opening_the_ledger_leaves_nothing_open(tmp_path: Path) -> None:
    """The port is found taken only after the ledger, the event hub, the scripted model and the
    snapshot threads were made: each is closed again, so an embedding process (or a retry) does
    not leak them, and the state dir is free for the next start."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        async with serve(tmp_path / "warm"):
            pass  # grpc's and asyncio's own threads, made once per process
        before = _open_things()
        for _ in range(2):
            with pytest.raises(OSError, match="address is in use"):
                await start(config_of(tmp_path / "state", listen=f"127.0.0.1:{port}"))
        # A thread pool shut down without waiting has its workers end just after.
        for _ in range(100):
            if _open_things() == before:
                break
            await asyncio.sleep(0.05)
        assert _open_things() == before
    async with serve(tmp_path / "state") as c:
        assert (await c.create()).session_id


class Refused(Exception):
    """What a start step raises in the tests below, instead of doing its work."""


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise Refused()


async def _refuse_later(*args: Any, **kwargs: Any) -> Any:
    raise Refused()


def _serving_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gRPC server is bound as usual, and refuses to start serving."""
    listen = components.listen

    def refusing(*args: Any) -> Any:
        listening = listen(*args)
        monkeypatch.setattr(listening, "serve", _refuse_later)
        return listening

    monkeypatch.setattr(components, "listen", refusing)


# Each step of a start, in order, and how the test makes it fail (instead of doing its work).
START_STEPS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "the sandbox's egress proxy": lambda m: m.setattr(EgressProxy, "start", _refuse_later),
    "the scripted model": lambda m: m.setattr(agents, "ScriptedModel", _refuse),
    "the ledger": lambda m: m.setattr(SqliteLedger, "open", _refuse_later),
    "the event hub": lambda m: m.setattr(EventHub, "start", _refuse_later),
    "the snapshot threads": lambda m: m.setattr(components, "Snapshots", _refuse),
    "the port": lambda m: m.setattr(components, "listen", _refuse),
    "the rewind engine": lambda m: m.setattr(server, "RewindEngine", _refuse),
    "the directory's entry": lambda m: m.setattr(server, "Membership", _refuse),
    "the registry": lambda m: m.setattr(server, "SessionRegistry", _refuse),
    "the services": lambda m: m.setattr(server, "RewindServicer", _refuse),
    "the side ports": lambda m: m.setattr(components.SidePorts, "start", _refuse_later),
    "joining the directory": lambda m: m.setattr(Membership, "join", _refuse_later),
    "loading the sessions": lambda m: m.setattr(SessionRegistry, "load", _refuse_later),
    "recovering interrupted rewinds": lambda m: m.setattr(RewindEngine, "recover", _refuse_later),
    "serving": _serving_refused,
    "the chores": lambda m: m.setattr(components, "start_chores", _refuse),
    "the webhook loops": lambda m: m.setattr(Deliverer, "claim", _refuse_later),
}
# With a shared ledger (PostgreSQL), the steps only it has, and the last one.
SHARED_STEPS = ("the channels to other replicas", "the webhook loops")
START_STEPS["the channels to other replicas"] = lambda m: m.setattr(components, "Forwarder", _refuse)


def _listening_ports() -> set[int]:
    """The TCP ports this process listens on (its sockets in /proc/net/tcp*, state LISTEN)."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # (the listing's own, closed since)
            mine.add(os.readlink(f"/proc/self/fd/{fd}"))
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                if fields[3] == "0A" and f"socket:[{fields[9]}]" in mine:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _settled() -> tuple[list[str], int]:
    """`_open_things` once what the garbage collector may still close is collected (a failed
    start's traceback holds its frames, and so what they opened, until then)."""
    gc.collect()
    return _open_things()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _stray_tasks(before: set[asyncio.Task[Any]]) -> list[str]:
    return sorted(t.get_name() for t in asyncio.all_tasks() if not t.done() and t not in before)


async def _nothing_left_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str, **overrides: Any
) -> None:
    # Every part a start may open is opened: the egress proxy, snapshots, both side ports, a
    # webhook's loop (to a port where nothing listens).
    keys = tmp_path / "webhook-keys"
    keys.write_text(new_key() + "\n")
    keys.chmod(0o600)
    settings: dict[str, Any] = {
        "sandbox_allow_hosts": ("example.com",),
        "workspace_snapshots": True,
        "metrics_listen": "127.0.0.1:0",
        "health_listen": "127.0.0.1:0",
        "webhook_urls": (f"http://127.0.0.1:{_free_port()}/hook",),
        "webhook_secret_file": keys,
        **overrides,
    }
    # grpc's asyncio runtime (its poller thread and sockets) lives while any grpc.aio object
    # does, and ends when the last is collected, whenever that is: one held here keeps it
    # from coming or going between the two looks.
    runtime = grpc.aio.insecure_channel("127.0.0.1:1")
    try:
        async with serve(tmp_path / "warm", **settings):
            pass  # grpc's and asyncio's own threads, made once per process
        before, ports, tasks = _settled(), _listening_ports(), set(asyncio.all_tasks())
        with monkeypatch.context() as patched:
            START_STEPS[step](patched)
            with pytest.raises(Refused):
                await start(config_of(tmp_path / "state", **settings))
        # A thread pool shut down without waiting has its workers end just after.
        for _ in range(100):
            if _settled() == before and not _stray_tasks(tasks):
                break
            await asyncio.sleep(0.05)
        after = _open_things()
    finally:
        await runtime.close()
    assert after == before, "no thread (the ledger's, the scripted model's) nor descriptor left"
    assert not _stray_tasks(tasks)
    assert not any(t.name == "scripted-model" for t in threading.enumerate())
    assert not (tmp_path / "state" / "proxy.sock").exists(), "the egress proxy is closed"
    assert _listening_ports() == ports, "no port (gRPC's, the side ports, the scripted model's) is held"
    with open(tmp_path / "state" / "server.lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the state dir is free for the next start


@pytest.mark.parametrize("step", [s for s in START_STEPS if s != "the channels to other replicas"])
async def test_a_start_that_fails_at_any_step_leaves_nothing_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """Whichever step of a start fails, everything the steps before it opened is closed again:
    no thread, descriptor, task or port of it is left, the scripted model and the egress proxy
    are stopped, and the state dir is free."""
    await _nothing_left_open(tmp_path, monkeypatch, step)


@pytest.mark.parametrize("step", SHARED_STEPS)
async def test_a_replica_whose_start_fails_at_any_step_leaves_nothing_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, postgres: PostgresServer, step: str
) -> None:
    """The same with a shared ledger: its connection pool and the channels to the other
    replicas are closed too."""
    database = postgres.url(postgres.create_database())
    await _nothing_left_open(tmp_path, monkeypatch, step, database_url=database)


@pytest.mark.parametrize("step", ["the port", "the services"])
async def test_a_start_that_fails_with_tracing_on_leaves_no_exporter_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """With traces exported (OTLP, to a collector that is not there), a failed start closes the
    tracer provider too: its export thread and channel, and the interceptors' provider."""
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{_free_port()}")
    await _nothing_left_open(tmp_path, monkeypatch, step)
    assert not tracing.enabled()
