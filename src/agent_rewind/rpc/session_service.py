"""SessionService: create, read, prompt, interrupt and close sessions."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from google.protobuf import empty_pb2

from agent_rewind.api.v1 import session_pb2, session_service_pb2, session_service_pb2_grpc
from agent_rewind.errors import InvalidArgument, NotServed
from agent_rewind.rpc import convert
from agent_rewind.rpc.handlers import streaming, unary
from agent_rewind.sessions.registry import SessionRegistry, parse_uuid
from agent_rewind.sessions.worker import SessionWorker


class SessionServicer(session_service_pb2_grpc.SessionServiceServicer):
    def __init__(self, registry: SessionRegistry) -> None:
        self._registry = registry

    @unary
    async def CreateSession(  # noqa: N802 - gRPC method name
        self, request: session_service_pb2.CreateSessionRequest, context: grpc.aio.ServicerContext
    ) -> session_pb2.Session:
        checkpointing = (
            request.enable_file_checkpointing if request.HasField("enable_file_checkpointing") else True
        )
        worker = await self._registry.create(
            cwd=request.cwd,
            session_id=request.session_id,
            options=convert.struct_to_dict(request.options),
            checkpointing=checkpointing,
            request_id=request.request_id,
        )
        await self._registry.start(worker)
        return await _session(worker)

    @unary
    async def GetSession(  # noqa: N802
        self, request: session_service_pb2.GetSessionRequest, context: grpc.aio.ServicerContext
    ) -> session_pb2.Session:
        return await _session(self._registry.get(_required("session_id", request.session_id)))

    @unary
    async def ListSessions(  # noqa: N802
        self, request: session_service_pb2.ListSessionsRequest, context: grpc.aio.ServicerContext
    ) -> session_service_pb2.ListSessionsResponse:
        offset, size = convert.page_bounds(request.page_size, request.page_token, default=50)
        workers = self._registry.list()
        return session_service_pb2.ListSessionsResponse(
            sessions=[await _session(w) for w in workers[offset : offset + size]],
            next_page_token=convert.next_page_token(offset, size, len(workers)),
        )

    @streaming
    async def Prompt(  # noqa: N802
        self, request: session_service_pb2.PromptRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[session_pb2.TurnEvent]:
        worker = self._registry.get(_required("session_id", request.session_id))
        if not request.text.strip():
            raise InvalidArgument("text", "must not be empty")
        request_id = parse_uuid("request_id", request.request_id) if request.request_id else ""
        turn = await worker.start_turn(request.text, request_id)
        async for event in turn.events():
            yield convert.turn_event(worker.session_id, event)

    @unary
    async def Interrupt(  # noqa: N802
        self, request: session_service_pb2.InterruptRequest, context: grpc.aio.ServicerContext
    ) -> session_pb2.Session:
        worker = self._registry.get(_required("session_id", request.session_id))
        await worker.interrupt()
        return await _session(worker)

    @unary
    async def CloseSession(  # noqa: N802
        self, request: session_service_pb2.CloseSessionRequest, context: grpc.aio.ServicerContext
    ) -> session_pb2.Session:
        worker = self._registry.get(_required("session_id", request.session_id))
        worker.check_no_turn()
        await worker.close()
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


def _required(field: str, value: str) -> str:
    if not value:
        raise InvalidArgument(field, "is required")
    return value
