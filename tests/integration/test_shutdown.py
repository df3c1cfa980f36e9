"""`agent-rewind serve` as a process: SIGTERM drains and leaves no Claude Code process behind."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agent_rewind.api.v1 import session_pb2, session_service_pb2, session_service_pb2_grpc
from agent_rewind.testing.processes import cli_pids
from agent_rewind.testing.server_process import ServerProcess
from tests.integration.harness import error_info


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_sigterm_stops_serving_and_ends_every_cli_process(tmp_path: Path) -> None:
    port = _free_port()
    state = tmp_path / "state"
    config_dir = state / "claude"
    cli = Path(sys.executable).parent / "agent-rewind"
    proc = await asyncio.create_subprocess_exec(
        str(cli),
        "serve",
        "--listen",
        f"127.0.0.1:{port}",
        "--state-dir",
        str(state),
        "--model",
        "offline",
        "--log-format",
        "json",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            await asyncio.wait_for(channel.channel_ready(), 30)
            health = health_pb2_grpc.HealthStub(channel)
            status = await health.Check(
                health_pb2.HealthCheckRequest(service="agent_rewind.v1.SessionService")
            )
            assert status.status == health_pb2.HealthCheckResponse.SERVING
            stub = session_service_pb2_grpc.SessionServiceStub(channel)
            sessions = [
                await stub.CreateSession(session_service_pb2.CreateSessionRequest()) for _ in range(2)
            ]
            sid = sessions[0].session_id
            running = stub.Prompt(session_service_pb2.PromptRequest(session_id=sid, text="sleep 2\nsay end"))
            while (
                await stub.GetSession(session_service_pb2.GetSessionRequest(session_id=sid))
            ).state != session_pb2.SESSION_STATE_RUNNING:
                await asyncio.sleep(0.05)
            assert len(cli_pids(config_dir=config_dir)) == 2, "one CLI process per session"
            proc.send_signal(signal.SIGTERM)
            # Health turns NOT_SERVING at once, while the running turn has its grace period.
            deadline = time.monotonic() + 10
            while (
                await health.Check(health_pb2.HealthCheckRequest(service="agent_rewind.v1.SessionService"))
            ).status != health_pb2.HealthCheckResponse.NOT_SERVING:
                assert time.monotonic() < deadline, "health never turned NOT_SERVING"
                await asyncio.sleep(0.02)
            # New work is refused while draining.
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.CreateSession(session_service_pb2.CreateSessionRequest())
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert error_info(refused.value).reason == "SHUTTING_DOWN"
            # The running turn completes.
            events = [e async for e in running]
            assert events[-1].result.subtype == "success"
            assert events[-2].assistant_message.text == "end"
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        deadline = time.monotonic() + 5
        while cli_pids(config_dir=config_dir) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert cli_pids(config_dir=config_dir) == []
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        for pid in cli_pids(config_dir=config_dir):
            os.kill(pid, signal.SIGKILL)


async def test_sigterm_with_busy_agents_exits_soon_after_the_grace(tmp_path: Path) -> None:
    """Four live agents, every one mid-turn past the grace: their turns are stopped and their
    processes ended at once, not after the SDK's 5 s wait for a busy process to read the end of
    its input (and 5 more after SIGTERM). The pod gives the server its grace plus 10 s before a
    SIGKILL (deploy/base); it must be done well inside that."""
    grace = 1.0
    server = ServerProcess(tmp_path / "state", args=("--shutdown-grace", str(grace)))
    await server.start()
    assert server.sessions is not None
    sids = [
        (await server.sessions.CreateSession(session_service_pb2.CreateSessionRequest())).session_id
        for _ in range(4)
    ]
    turns = [
        server.sessions.Prompt(session_service_pb2.PromptRequest(session_id=sid, text="sleep 60\nsay end"))
        for sid in sids
    ]
    for sid in sids:
        while (
            await server.sessions.GetSession(session_service_pb2.GetSessionRequest(session_id=sid))
        ).state != session_pb2.SESSION_STATE_RUNNING:
            await asyncio.sleep(0.05)

    async def ending(turn: grpc.aio.UnaryStreamCall) -> grpc.StatusCode:
        # Read while the server stops: the status it sends arrives before the channel is
        # closed (a call still unread when the test's channel closes ends "locally cancelled").
        with pytest.raises(grpc.aio.AioRpcError) as err:
            _ = [e async for e in turn]
        return err.value.code()

    readers = [asyncio.create_task(ending(turn)) for turn in turns]
    started = time.monotonic()
    assert await server.stop() == 0
    took = time.monotonic() - started
    for code in await asyncio.gather(*readers):
        assert code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), code
    assert cli_pids(config_dir=server.config_dir) == []
    assert took < grace + 4.5, f"the stop took {took:.1f} s with a grace of {grace:g} s"
