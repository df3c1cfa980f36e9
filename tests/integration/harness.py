"""Helpers for integration tests: a real server on a free port, real CLI processes, the scripted model."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from agent_rewind.api.v1 import (
    rewind_pb2,
    rewind_service_pb2,
    rewind_service_pb2_grpc,
    session_pb2,
    session_service_pb2,
    session_service_pb2_grpc,
)
from agent_rewind.config import Config
from agent_rewind.server import RunningServer, start
from agent_rewind.testing import RECALL_PREFIX
from agent_rewind.testing.processes import cli_pids
from agent_rewind.testing.server_process import ServerProcess

__all__ = ["cli_pids"]  # re-exported: tests find CLI processes through the harness

RUNNING = session_pb2.SESSION_STATE_RUNNING
FILES = rewind_pb2.REWIND_MODE_FILES
CONVERSATION = rewind_pb2.REWIND_MODE_CONVERSATION
BOTH = rewind_pb2.REWIND_MODE_BOTH


def test_config(state_dir: Path, **overrides: Any) -> Config:
    """Always the offline scripted model, a state dir of the test's own, a free port. Workspace
    snapshots are off unless a test turns them on: most tests here are about the CLI's own
    checkpoints (and their failure paths); test_snapshots.py, and every test of a server process
    (ServerProcess, the real defaults), run with them on."""
    values: dict[str, Any] = {
        "state_dir": state_dir,
        "listen": "127.0.0.1:0",
        "model": "offline",
        "idle_timeout": 0,
        "shutdown_grace": 5,
        "workspace_snapshots": False,
        # No 64 MiB reserve file in every test's state dir (test_full_disk.py tests it).
        "storage_reserve": 0,
    }
    values.update(overrides)
    return Config(**values).resolved()


@dataclass
class Client:
    running: RunningServer | None  # None for a server in another process (ServerProcess)
    channel: grpc.aio.Channel
    sessions: session_service_pb2_grpc.SessionServiceStub
    rewinds: rewind_service_pb2_grpc.RewindServiceStub

    async def create(self, **kwargs: Any) -> session_pb2.Session:
        return await self.sessions.CreateSession(session_service_pb2.CreateSessionRequest(**kwargs))

    async def prompt(self, session_id: str, text: str) -> list[session_pb2.TurnEvent]:
        call = self.sessions.Prompt(session_service_pb2.PromptRequest(session_id=session_id, text=text))
        return [event async for event in call]

    async def prompt_events(self, session_id: str, text: str, request_id: str) -> list[session_pb2.TurnEvent]:
        request = session_service_pb2.PromptRequest(session_id=session_id, text=text, request_id=request_id)
        return [event async for event in self.sessions.Prompt(request)]

    async def get(self, session_id: str) -> session_pb2.Session:
        return await self.sessions.GetSession(session_service_pb2.GetSessionRequest(session_id=session_id))

    async def wait_for_state(self, session_id: str, state: int, within: float = 20.0) -> None:
        """Polls GetSession until the session is in `state` (no fixed sleeps: machines are noisy)."""
        deadline = asyncio.get_running_loop().time() + within
        while (await self.get(session_id)).state != state:
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"session {session_id} never reached state {state}")
            await asyncio.sleep(0.05)

    async def points(
        self, session_id: str, page_size: int = 0
    ) -> rewind_service_pb2.ListRewindPointsResponse:
        return await self.rewinds.ListRewindPoints(
            rewind_service_pb2.ListRewindPointsRequest(session_id=session_id, page_size=page_size)
        )

    async def all_points(self, session_id: str) -> list[rewind_pb2.RewindPoint]:
        out: list[rewind_pb2.RewindPoint] = []
        token = ""
        while True:
            page = await self.rewinds.ListRewindPoints(
                rewind_service_pb2.ListRewindPointsRequest(
                    session_id=session_id, page_size=1000, page_token=token
                )
            )
            out.extend(page.points)
            token = page.next_page_token
            if not token:
                return out

    async def dry_run(
        self, session_id: str, message_id: str, mode: int, **kw: Any
    ) -> rewind_pb2.RewindResult:
        return await self.rewinds.DryRun(
            rewind_service_pb2.RewindRequest(session_id=session_id, message_id=message_id, mode=mode, **kw)
        )

    async def rewind(self, session_id: str, message_id: str, mode: int, **kw: Any) -> rewind_pb2.RewindResult:
        return await self.rewinds.Rewind(
            rewind_service_pb2.RewindRequest(session_id=session_id, message_id=message_id, mode=mode, **kw)
        )

    async def events(self, session_id: str) -> list[rewind_pb2.RewindEvent]:
        """The session's whole event log, replayed from the start up to `caught_up`."""
        call = self.rewinds.WatchRewindEvents(
            rewind_service_pb2.WatchRewindEventsRequest(session_id=session_id, after_cursor=0)
        )
        out: list[rewind_pb2.RewindEvent] = []
        try:
            async for response in call:
                if response.HasField("caught_up"):
                    return out
                out.append(response.event)
        finally:
            call.cancel()
        raise AssertionError("the event stream ended before caught_up")

    async def recall(self, session_id: str) -> list[str]:
        """The user prompts the model sees, by the scripted model's `recall`."""
        events = await self.prompt(session_id, "recall")
        for event in events:
            text = event.assistant_message.text
            if text.startswith(RECALL_PREFIX):
                prompts: list[str] = json.loads(text[len(RECALL_PREFIX) :])
                return prompts
        raise AssertionError(f"no recall answer in {events}")


@asynccontextmanager
async def serve(state_dir: Path, **overrides: Any) -> AsyncIterator[Client]:
    running = await start(test_config(state_dir, **overrides))
    client = _client(running)
    try:
        yield client
    finally:
        await client.channel.close()
        await running.stop(grace=2)


def _client(running: RunningServer) -> Client:
    channel = grpc.aio.insecure_channel(running.address)
    return Client(
        running,
        channel,
        session_service_pb2_grpc.SessionServiceStub(channel),
        rewind_service_pb2_grpc.RewindServiceStub(channel),
    )


def replica_dir(state_dir: Path, index: int) -> Path:
    """The state dir of replica `index` of a deployment whose first replica uses `state_dir`."""
    return state_dir if index == 0 else state_dir.with_name(f"{state_dir.name}-replica-{index}")


@asynccontextmanager
async def replicas(
    state_dir: Path, database_url: str, count: int = 3, **overrides: Any
) -> AsyncIterator[list[Client]]:
    """`count` replicas of one deployment on loopback: real servers, one PostgreSQL database,
    each with a state dir (and so a disk) of its own; replica i is `replica-i`. Started again on
    the same arguments, each replica finds its own state again."""
    running: list[RunningServer] = []
    clients: list[Client] = []
    try:
        for i in range(count):
            server = await start(
                test_config(
                    replica_dir(state_dir, i),
                    database_url=database_url,
                    replica_id=f"replica-{i}",
                    **overrides,
                )
            )
            running.append(server)
            clients.append(_client(server))
        for server in running:  # each knows of all the others before the test begins
            assert server.membership is not None
            await server.membership.refresh()
        yield clients
    finally:
        for client in clients:
            await client.channel.close()
        for server in reversed(running):
            await server.stop(grace=2)


class _Split:
    """A stub whose CreateSession goes to one replica and every other call to another."""

    def __init__(self, creates: Any, rest: Any) -> None:
        self._creates = creates
        self._rest = rest

    def __getattr__(self, name: str) -> Any:
        return getattr(self._creates if name == "CreateSession" else self._rest, name)


def through(owner: Client, other: Client) -> Client:
    """A client that creates sessions on `owner` and sends every other call to `other`, which
    owns none of them: each is forwarded. `running` is the owner's server."""
    return Client(owner.running, other.channel, _Split(owner.sessions, other.sessions), other.rewinds)  # type: ignore[arg-type]


def client_of(server: ServerProcess) -> Client:
    """A Client for a server running in another process (after each start: the address changes)."""
    assert server.channel is not None and server.sessions is not None and server.rewinds is not None
    return Client(None, server.channel, server.sessions, server.rewinds)


def error_info(err: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo:
    """The ErrorInfo of a failed call; fails the test when there is none."""
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    assert status is not None, f"no rich status on {err.code()}: {err.details()}"
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            assert info.domain == "agent-rewind.v1"
            return info
    raise AssertionError(f"no ErrorInfo in {status}")


def bad_request(err: grpc.aio.AioRpcError) -> error_details_pb2.BadRequest:
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    assert status is not None
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            out = error_details_pb2.BadRequest()
            detail.Unpack(out)
            return out
    raise AssertionError(f"no BadRequest in {status}")


def prompt_id(events: list[session_pb2.TurnEvent]) -> str:
    ids = [e.message_id for e in events if e.HasField("user_prompt") and not e.parent_tool_use_id]
    assert len(ids) == 1, events
    return ids[0]


def result_of(events: list[session_pb2.TurnEvent]) -> session_pb2.TurnResult:
    assert events and events[-1].HasField("result"), events
    return events[-1].result


def transcript_entries(state_dir: Path, session_id: str) -> list[dict[str, Any]]:
    files = list((state_dir / "claude" / "projects").glob(f"*/{session_id}.jsonl"))
    assert len(files) == 1, files
    return [json.loads(line) for line in files[0].read_text().splitlines() if line.strip()]


def read(path: Path) -> str | None:
    return path.read_text() if path.exists() else None
