"""The real gRPC server in this process, its clients, and the CLI processes it starts.

Like tests/integration/harness.py: the offline scripted model, a state directory of the run's
own, a free port, no idle hibernation (the benchmarks hibernate sessions themselves, through
the same call the idle timer makes). What runs is asked of the operating system
(`agent_rewind.testing.processes`), never of the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

import grpc
from google.protobuf import struct_pb2

from agent_rewind.api.v1 import (
    rewind_pb2,
    rewind_service_pb2,
    rewind_service_pb2_grpc,
    session_pb2,
    session_service_pb2,
    session_service_pb2_grpc,
)
from agent_rewind.config import Config
from agent_rewind.logs import configure
from agent_rewind.server import RunningServer, start
from agent_rewind.store.ledger import NewSession
from agent_rewind.store.sqlite import SqliteLedger
from agent_rewind.testing.processes import cli_pids, cli_processes, rss_kb, tree_rss_kb
from agent_rewind.transcript.paths import transcript_path

Mode: TypeAlias = rewind_pb2.RewindMode.ValueType
FILES = rewind_pb2.REWIND_MODE_FILES
CONVERSATION = rewind_pb2.REWIND_MODE_CONVERSATION
BOTH = rewind_pb2.REWIND_MODE_BOTH


def bench_config(state_dir: Path, **overrides: Any) -> Config:
    values: dict[str, Any] = {
        "state_dir": state_dir,
        "listen": "127.0.0.1:0",
        "model": "offline",
        "idle_timeout": 0,
        "shutdown_grace": 5,
        "log_format": "console",
        "log_level": "warning",
        "storage_reserve": 0,  # (no 64 MiB file in each run's state dir)
    }
    return Config(**{**values, **overrides}).resolved()


@dataclass
class Client:
    running: RunningServer
    sessions: session_service_pb2_grpc.SessionServiceStub
    rewinds: rewind_service_pb2_grpc.RewindServiceStub
    leftover: list[int] = field(default_factory=list)  # CLI processes alive after the server stopped

    async def create(
        self, workspace_snapshots: bool = False, allowed_tools: Sequence[str] = ()
    ) -> session_pb2.Session:
        """A session; without workspace snapshots unless asked (the benchmarks of rewinds,
        prompts and memory measure the service without them; `snapshots` measures them)."""
        options = struct_pb2.Struct()
        if allowed_tools:
            options.update({"allowed_tools": list(allowed_tools)})
        session: session_pb2.Session = await self.sessions.CreateSession(
            session_service_pb2.CreateSessionRequest(workspace_snapshots=workspace_snapshots, options=options)
        )
        return session

    async def close(self, session_id: str) -> None:
        """CloseSession: returns once the session's CLI process has exited."""
        await self.sessions.CloseSession(session_service_pb2.CloseSessionRequest(session_id=session_id))

    async def prompt(self, session_id: str, text: str) -> str:
        """Runs one turn to its result; returns the prompt's message id (a rewind point)."""
        call = self.sessions.Prompt(session_service_pb2.PromptRequest(session_id=session_id, text=text))
        events = [event async for event in call]
        ids = [e.message_id for e in events if e.HasField("user_prompt") and not e.parent_tool_use_id]
        if len(ids) != 1 or not events[-1].HasField("result") or events[-1].result.is_error:
            raise RuntimeError(f"turn {text!r} did not run as scripted: {events}")
        return str(ids[0])

    async def rewind(self, session_id: str, message_id: str, mode: Mode) -> rewind_pb2.RewindResult:
        result: rewind_pb2.RewindResult = await self.rewinds.Rewind(
            rewind_service_pb2.RewindRequest(session_id=session_id, message_id=message_id, mode=mode)
        )
        return result

    async def dry_run(self, session_id: str, message_id: str, mode: Mode) -> rewind_pb2.RewindResult:
        result: rewind_pb2.RewindResult = await self.rewinds.DryRun(
            rewind_service_pb2.RewindRequest(session_id=session_id, message_id=message_id, mode=mode)
        )
        return result

    async def points(
        self, session_id: str, page_size: int, page_token: str = ""
    ) -> rewind_service_pb2.ListRewindPointsResponse:
        response: rewind_service_pb2.ListRewindPointsResponse = await self.rewinds.ListRewindPoints(
            rewind_service_pb2.ListRewindPointsRequest(
                session_id=session_id, page_size=page_size, page_token=page_token
            )
        )
        return response

    async def hibernate(self, session_id: str) -> None:
        """What the idle timer does: give the CLI process back (the server says when it is done;
        what is left running is for the operating system to say, see `cli_snapshot`)."""
        await self.running.registry.get(session_id).hibernate()

    def transcript(self, session_id: str, cwd: str) -> Path:
        return transcript_path(self.running.config.claude_config_dir, cwd, session_id)


@asynccontextmanager
async def serve(state_dir: Path, **overrides: Any) -> AsyncIterator[Client]:
    """The server, listening, with a client on its port; stopped on exit.

    A stopped server must have ended every CLI process it started. Any left the moment the stop
    returned (asked of the operating system) are in `Client.leftover`, which the memory benchmark
    checks, and are killed, so they weigh on no measurement after.
    """
    config = bench_config(state_dir, **overrides)
    configure(config.log_format, config.log_level)
    running = await start(config)
    channel = grpc.aio.insecure_channel(running.address)
    client = Client(
        running,
        session_service_pb2_grpc.SessionServiceStub(channel),
        rewind_service_pb2_grpc.RewindServiceStub(channel),
    )
    try:
        yield client
    finally:
        await channel.close()
        await running.stop(grace=2)
        client.leftover = cli_pids(config_dir=config.claude_config_dir)
        for pid in client.leftover:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if client.leftover:
            print(f"CLI processes outlived their server, killed: {client.leftover}", file=sys.stderr)


def register_session(state_dir: Path, session_id: str) -> tuple[str, Path]:
    """Registers a session in the ledger of `state_dir` as if it had been created and started
    there, so a server started on that state dir serves it. Call with no server running.

    Returns its workspace and where the server will look for its transcript (write it there).
    """
    config = bench_config(state_dir)
    cwd = config.default_workspace_root / session_id
    cwd.mkdir(parents=True, exist_ok=True)

    async def register() -> None:
        ledger = await SqliteLedger.open(config.ledger_path)
        try:
            await ledger.add_session(NewSession(session_id, str(cwd), {}, checkpointing=True))
            await ledger.touch_session(session_id, started=True)
        finally:
            await ledger.close()

    asyncio.run(register())
    path = transcript_path(config.claude_config_dir, str(cwd), session_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    return str(cwd), path


def register_sessions(state_dir: Path, session_ids: Sequence[str]) -> list[tuple[str, Path]]:
    """`register_session` for many sessions at once (thousands): the same ledger rows, written
    through the same ledger calls, on a copy of the ledger on tmpfs (/dev/shm when there is one),
    where a synced commit costs no disk flush, then copied into place. Two synced commits per
    session on disk would take minutes for 10,000. Call with no server running.

    Returns each session's workspace and where the server will look for its transcript.
    """
    config = bench_config(state_dir)
    shm = Path("/dev/shm")
    scratch = Path(tempfile.mkdtemp(prefix="agent-rewind-bench-", dir=shm if shm.is_dir() else None))
    suffixes = ("", "-wal", "-shm")
    try:
        copy = scratch / config.ledger_path.name
        for suffix in suffixes:  # a ledger already there is added to, not replaced
            if (source := Path(f"{config.ledger_path}{suffix}")).exists():
                shutil.copyfile(source, f"{copy}{suffix}")

        async def register() -> None:
            ledger = await SqliteLedger.open(copy)
            try:
                for session_id in session_ids:
                    cwd = str(config.default_workspace_root / session_id)
                    await ledger.add_session(NewSession(session_id, cwd, {}, checkpointing=True))
                    await ledger.touch_session(session_id, started=True)
            finally:
                await ledger.close()

        asyncio.run(register())
        config.ledger_path.parent.mkdir(parents=True, exist_ok=True)
        for suffix in suffixes:
            target = Path(f"{config.ledger_path}{suffix}")
            if Path(f"{copy}{suffix}").exists():
                shutil.copyfile(f"{copy}{suffix}", target)
            else:
                target.unlink(missing_ok=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    # Every path before any directory: `transcript_path` looks through projects/ for a file it
    # does not find where it computed it, which would cost O(sessions) per session.
    out = []
    for session_id in session_ids:
        workspace = str(config.default_workspace_root / session_id)
        out.append((workspace, transcript_path(config.claude_config_dir, workspace, session_id)))
    for workspace, path in out:
        Path(workspace).mkdir(parents=True, exist_ok=True)
        path.parent.mkdir(parents=True, exist_ok=True)
    return out


@dataclass(frozen=True)
class CliSnapshot:
    """The server's CLI processes, as /proc shows them at one instant."""

    at: float  # seconds since the watch began
    session_pids: tuple[int, ...]  # those whose command line names the session
    session_rss_kb: int  # their VmRSS, with everything they started
    session_hwm_kb: int  # their VmHWM (peak), the processes themselves
    server_pids: tuple[int, ...]  # every CLI process of the server


def cli_snapshot(c: Client, session_id: str, since: float | None = None) -> CliSnapshot:
    """A server's CLI processes are those running the bundled binary with its CLAUDE_CONFIG_DIR,
    below this process (where the server runs) or orphaned: none of its processes escapes, and
    no other server's (an earlier benchmark's) counts."""
    config_dir = c.running.config.claude_config_dir
    processes = cli_processes(config_dir=config_dir)
    mine = [p.pid for p in processes if p.names(session_id)]
    return CliSnapshot(
        at=0.0 if since is None else time.monotonic() - since,
        session_pids=tuple(mine),
        session_rss_kb=tree_rss_kb(mine),
        session_hwm_kb=sum(rss_kb(p)[1] for p in mine),
        server_pids=tuple(p.pid for p in processes),
    )


async def watch_cli(c: Client, session_id: str, seconds: float, every: float) -> list[CliSnapshot]:
    """Snapshots from now on, every `every` seconds for `seconds`, the first one at once.

    The event loop runs between snapshots, so the server (in this process) goes on with its
    background work while it is watched.
    """
    since = time.monotonic()
    out = [cli_snapshot(c, session_id, since)]
    while time.monotonic() - since < seconds:
        await asyncio.sleep(every)
        out.append(cli_snapshot(c, session_id, since))
    return out
