"""SessionService: create, read, prompt, interrupt and close sessions."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from google.protobuf import empty_pb2

from agent_rewind.api.v1 import session_pb2, session_service_pb2, session_service_pb2_grpc
from agent_rewind.errors import NotServed
from agent_rewind.rewind.engine import RewindEngine
from agent_rewind.rpc import convert, requests
from agent_rewind.rpc.auth import Authenticator, current
from agent_rewind.rpc.handlers import streaming, unary
from agent_rewind.rpc.requests import PageTokens, optional_uuid
from agent_rewind.sessions import commands
from agent_rewind.sessions.registry import NewSessionRequest, SessionRegistry, page_key
from agent_rewind.sessions.worker import SessionWorker


class SessionServicer(session_service_pb2_grpc.SessionServiceServicer):
    def __init__(
        self, registry: SessionRegistry, engine: RewindEngine, tokens: PageTokens, auth: Authenticator
    ) -> None:
        self._registry = registry
        self._engine = engine
        self._tokens = tokens
        self.auth = auth

    def _session(self, session_id: str) -> SessionWorker:
        """The caller's session (or any, for admin); SESSION_NOT_FOUND for anyone else's."""
        return self._registry.get(requests.session_id(session_id), current())

    @unary
    async def CreateSession(  # noqa: N802 - gRPC method name
        self, request: session_service_pb2.CreateSessionRequest, context: grpc.aio.ServicerContext
    ) -> session_pb2.Session:
        checkpointing = (
            request.enable_file_checkpointing if request.HasField("enable_file_checkpointing") else True
        )
        snapshots = (
            request.workspace_snapshots
            if request.HasField("workspace_snapshots")
            else self._registry.workspace_snapshots_default
        )
        worker = await self._registry.create(
            NewSessionRequest(
                cwd=request.cwd,
                session_id=optional_uuid("session_id", request.session_id) or "",
                options=convert.struct_to_dict(request.options),
                checkpointing=checkpointing,
                workspace_snapshots=snapshots,
                request_id=optional_uuid("request_id", request.request_id) or "",
                principal=current().name,
            )
        )
        await self._registry.start(worker)
        return await _session(worker)

    @unary
    async def GetSession(  # noqa: N802
        self, request: session_service_pb2.GetSessionRequest, context: grpc.aio.ServicerContext
    ) -> session_pb2.Session:
        worker = self._session(request.session_id)
        session = await _session(worker)
        session.snapshot_bytes = await worker.snapshot_bytes()
        return session

    @unary
    async def ListSessions(  # noqa: N802
        self, request: session_service_pb2.ListSessionsRequest, context: grpc.aio.ServicerContext
    ) -> session_service_pb2.ListSessionsResponse:
        size = requests.page_size(request.page_size, default=50)
        principal = current()
        scope = f"sessions:{'*' if principal.admin else principal.name}"  # a token is the caller's own
        position = self._tokens.position(request.page_token, scope)
        after = (str(position.get("t")), str(position.get("s"))) if position else None
        workers, more = self._registry.page(after, size, principal)
        token = ""
        if more:
            created, sid = page_key(workers[-1])
            token = self._tokens.issue(scope, {"t": created, "s": sid})
        return session_service_pb2.ListSessionsResponse(
            sessions=[await _session(w) for w in workers], next_page_token=token
        )

    @streaming
    async def Prompt(  # noqa: N802
        self, request: session_service_pb2.PromptRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[session_pb2.TurnEvent]:
        worker = self._session(request.session_id)
        text = requests.prompt_text(request.text)
        commands.check_prompt(text)
        request_id = optional_uuid("request_id", request.request_id) or ""
        if request.HasField("rewind"):
            raise NotServed("PromptRequest.rewind")
        turn = await worker.start_turn(text, request_id)
        async for event in turn.events():
            yield convert.turn_event(worker.session_id, event)

    @unary
    async def Interrupt(  # noqa: N802
        self, request: session_service_pb2.InterruptRequest, context: grpc.aio.ServicerContext
    ) -> session_pb2.Session:
        worker = self._session(request.session_id)
        await worker.interrupt()
        return await _session(worker)

    @unary
    async def CloseSession(  # noqa: N802
        self, request: session_service_pb2.CloseSessionRequest, context: grpc.aio.ServicerContext
    ) -> session_pb2.Session:
        worker = self._session(request.session_id)
        await worker.close(force=request.force)
        return await _session(worker)

    @unary
    async def ForkSession(  # noqa: N802
        self, request: session_service_pb2.ForkSessionRequest, context: grpc.aio.ServicerContext
    ) -> session_pb2.Session:
        raise NotServed("ForkSession")

    @unary
    async def DeleteSession(  # noqa: N802
        self, request: session_service_pb2.DeleteSessionRequest, context: grpc.aio.ServicerContext
    ) -> empty_pb2.Empty:
        raise NotServed("DeleteSession")


async def _session(worker: SessionWorker) -> session_pb2.Session:
    return convert.session(worker, await worker.view())
