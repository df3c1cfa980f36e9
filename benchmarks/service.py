"""The real gRPC server in this process, its clients, and the CLI processes it starts.

Like tests/integration/harness.py: the offline scripted model, a state directory of the run's
own, a free port, no idle hibernation (the benchmarks hibernate sessions themselves).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

import grpc

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
from agent_rewind.transcript.paths import transcript_path

Mode: TypeAlias = rewind_pb2.RewindMode.ValueType
FILES = rewind_pb2.REWIND_MODE_FILES
CONVERSATION = rewind_pb2.REWIND_MODE_CONVERSATION
BOTH = rewind_pb2.REWIND_MODE_BOTH


def bench_config(state_dir: Path) -> Config:
    return Config(
        state_dir=state_dir,
        listen="127.0.0.1:0",
        model="offline",
        idle_timeout=0,
        shutdown_grace=5,
        log_format="console",
        log_level="warning",
    ).resolved()


@dataclass
class Client:
    running: RunningServer
    sessions: session_service_pb2_grpc.SessionServiceStub
    rewinds: rewind_service_pb2_grpc.RewindServiceStub

    async def create(self) -> session_pb2.Session:
        session: session_pb2.Session = await self.sessions.CreateSession(
            session_service_pb2.CreateSessionRequest()
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

    def pid(self, session_id: str) -> int | None:
        """The pid of the session's live CLI process, None when it has none."""
        return self.running.registry.get(session_id).client_pid

    async def hibernate(self, session_id: str) -> None:
        """What the idle timer does: give the CLI process back. Returns once it has exited."""
        await self.running.registry.get(session_id).hibernate()

    def transcript(self, session_id: str, cwd: str) -> Path:
        return transcript_path(self.running.config.claude_config_dir, cwd, session_id)


@asynccontextmanager
async def serve(state_dir: Path) -> AsyncIterator[Client]:
    config = bench_config(state_dir)
    configure(config.log_format, config.log_level)
    running = await start(config)
    channel = grpc.aio.insecure_channel(running.address)
    try:
        yield Client(
            running,
            session_service_pb2_grpc.SessionServiceStub(channel),
            rewind_service_pb2_grpc.RewindServiceStub(channel),
        )
    finally:
        await channel.close()
        await running.stop(grace=2)


def rss_kb(pid: int | None) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in KB; (0, 0) when there is no process (or it is a zombie)."""
    if pid is None:
        return 0, 0
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0, 0
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    if fields.get("State", "").strip().startswith("Z"):
        return 0, 0

    def kb(name: str) -> int:
        return int(fields.get(name, "0 kB").split()[0])

    return kb("VmRSS"), kb("VmHWM")


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (the CLI may start helpers of its own)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


async def wait_gone(pid: int | None, limit_s: float = 10.0) -> None:
    """Waits until a CLI process let go in the background has exited, so it does not compete
    with the next measurement for the CPU. Another process's exit has no event to await: poll."""
    if pid is None:
        return
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if rss_kb(pid) == (0, 0):
            return
        await asyncio.sleep(0.01)
