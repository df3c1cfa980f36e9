"""What every handler shares (rpc/handlers.py), through a real gRPC server on loopback: who the
call is admitted as and what its log context says, how each call is counted and timed, and at
which level a refusal is logged. The servicer is a stand-in; the handlers and the authenticator
are the real ones."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
import structlog
from structlog.testing import capture_logs

from agent_rewind import metrics
from agent_rewind.access import AccessFile, hash_token
from agent_rewind.api.v1 import session_pb2, session_service_pb2, session_service_pb2_grpc
from agent_rewind.errors import SessionNotFound, ShuttingDown
from agent_rewind.rpc import auth as rpc_auth
from agent_rewind.rpc import registration
from agent_rewind.rpc.auth import Authenticator
from agent_rewind.rpc.errors import abort
from agent_rewind.rpc.handlers import unary
from agent_rewind.server import SESSION_SERVICE

SID = "0b7f3c1e-5a8d-4d6e-9f10-2a3b4c5d6e7f"
TOKEN = "arw_alice-secret"


class _Here(session_service_pb2_grpc.SessionServiceServicer):
    """A servicer that answers every call itself: GetSession says who it was called as, with
    the log context it ran in; CloseSession ends its call with a status itself; Interrupt
    refuses with the domain error it is given."""

    service = SESSION_SERVICE.full_name
    forwarder = None

    def __init__(self) -> None:
        self.log_contexts: list[dict[str, Any]] = []
        self.refusal: Exception = SessionNotFound(SID)

    @unary
    async def GetSession(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        self.log_contexts.append(structlog.contextvars.get_contextvars())
        return session_pb2.Session(session_id=request.session_id, principal=rpc_auth.current().name)

    @unary
    async def CloseSession(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        await abort(context, SessionNotFound(request.session_id))
        raise AssertionError("abort raises")

    @unary
    async def Interrupt(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        raise self.refusal


class _Authenticated(_Here):
    def __init__(self, authenticator: Authenticator) -> None:
        super().__init__()
        self.auth = authenticator


Serve = Callable[[_Here], Awaitable[session_service_pb2_grpc.SessionServiceStub]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Serves a servicer on loopback; answers its stub."""
    servers: list[grpc.aio.Server] = []
    channels: list[grpc.aio.Channel] = []

    async def start(servicer: _Here) -> session_service_pb2_grpc.SessionServiceStub:
        server = grpc.aio.server()
        registration.add(server, SESSION_SERVICE, servicer)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        channels.append(channel)
        return session_service_pb2_grpc.SessionServiceStub(channel)

    try:
        yield start
    finally:
        for channel in channels:
            await channel.close()
        for server in servers:
            await server.stop(0)


def _access(tmp_path: Path) -> AccessFile:
    path = tmp_path / "access.json"
    path.write_text(
        json.dumps(
            {
                "principals": [
                    {"name": "alice", "permissions": ["sessions.read"], "token_sha256": [hash_token(TOKEN)]}
                ]
            }
        )
    )
    return AccessFile(path)


def _get(sid: str = SID) -> session_service_pb2.GetSessionRequest:
    return session_service_pb2.GetSessionRequest(session_id=sid)


async def test_a_servicer_without_an_authenticator_admits_every_call_as_the_local_principal(
    serve: Serve,
) -> None:
    servicer = _Here()
    stub = await serve(servicer)
    assert (await stub.GetSession(_get())).principal == "local"
    assert "principal" not in servicer.log_contexts[0]


async def test_an_authenticated_call_is_logged_with_its_principal_and_an_open_one_without(
    serve: Serve, tmp_path: Path
) -> None:
    """With an access file each log line of a call names who made it; without one every caller
    is the same local principal, and naming it would say nothing."""
    authenticated = _Authenticated(Authenticator(_access(tmp_path)))
    stub = await serve(authenticated)
    got = await stub.GetSession(_get(), metadata=(("authorization", f"Bearer {TOKEN}"),))
    assert got.principal == "alice"
    assert authenticated.log_contexts == [{"rpc": "GetSession", "session_id": SID, "principal": "alice"}]

    open_ = _Authenticated(Authenticator(None))
    stub = await serve(open_)
    assert (await stub.GetSession(_get())).principal == "local"
    assert open_.log_contexts == [{"rpc": "GetSession", "session_id": SID}]


def _sample(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


async def test_every_call_is_counted_under_its_status_code_and_timed(serve: Serve) -> None:
    """A call the servicer ended with a status of its own is counted under that status, not
    as UNKNOWN; the time recorded is the call's own, no more than the caller waited."""
    stub = await serve(_Here())
    counted = _sample("agent_rewind_rpcs_total", method="CloseSession", code="NOT_FOUND")
    unknown = _sample("agent_rewind_rpcs_total", method="CloseSession", code="UNKNOWN")
    timed = _sample("agent_rewind_rpc_duration_seconds_sum", method="CloseSession")
    started = time.perf_counter()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.CloseSession(session_service_pb2.CloseSessionRequest(session_id=SID))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    # The server counts the call once its status is on its way: the caller can hold the status a
    # moment before (a loaded machine showed it).
    async with asyncio.timeout(5):
        while _sample("agent_rewind_rpcs_total", method="CloseSession", code="NOT_FOUND") == counted:
            await asyncio.sleep(0.01)
    waited = time.perf_counter() - started
    assert _sample("agent_rewind_rpcs_total", method="CloseSession", code="NOT_FOUND") == counted + 1
    assert _sample("agent_rewind_rpcs_total", method="CloseSession", code="UNKNOWN") == unknown
    took = _sample("agent_rewind_rpc_duration_seconds_sum", method="CloseSession") - timed
    assert 0 < took <= waited


async def test_a_refused_call_is_logged_at_info_and_one_refused_for_a_stop_only_at_debug(
    serve: Serve,
) -> None:
    """A stop ends every call at once: one info line for each would drown the log."""
    servicer = _Here()
    stub = await serve(servicer)
    interrupt = session_service_pb2.InterruptRequest(session_id=SID)
    with capture_logs() as refused, pytest.raises(grpc.aio.AioRpcError):
        await stub.Interrupt(interrupt)
    servicer.refusal = ShuttingDown()
    with capture_logs() as stopping, pytest.raises(grpc.aio.AioRpcError):
        await stub.Interrupt(interrupt)
    levels = {
        "refused": [(e["log_level"], e["reason"]) for e in refused if e["event"] == "rpc refused"],
        "stopping": [(e["log_level"], e["reason"]) for e in stopping if e["event"] == "rpc refused"],
    }
    assert levels["refused"] == [("info", "SESSION_NOT_FOUND")]
    # At debug, which a logger filtering at info (as a server runs by default) drops.
    assert levels["stopping"] in ([], [("debug", "SHUTTING_DOWN")])
