"""RewindService: capabilities, rewind points, dry runs and rewinds."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from agent_rewind import __version__
from agent_rewind.api.v1 import rewind_pb2, rewind_service_pb2, rewind_service_pb2_grpc
from agent_rewind.errors import NotServed
from agent_rewind.rewind.engine import RewindEngine, RewindRequest
from agent_rewind.rewind.points import FILE_CHECKPOINT_WINDOW
from agent_rewind.rpc import convert
from agent_rewind.rpc.errors import abort
from agent_rewind.rpc.handlers import unary
from agent_rewind.rpc.session_service import _required
from agent_rewind.sessions import adapter
from agent_rewind.sessions.registry import SessionRegistry, parse_uuid


class RewindServicer(rewind_service_pb2_grpc.RewindServiceServicer):
    def __init__(self, registry: SessionRegistry, engine: RewindEngine) -> None:
        self._registry = registry
        self._engine = engine

    @unary
    async def GetCapabilities(  # noqa: N802 - gRPC method name
        self, request: rewind_service_pb2.GetCapabilitiesRequest, context: grpc.aio.ServicerContext
    ) -> rewind_pb2.Capabilities:
        return rewind_pb2.Capabilities(
            modes=convert.MODES_SERVED,
            file_checkpoint_window=FILE_CHECKPOINT_WINDOW,
            dry_run=True,
            events=False,
            service_version=__version__,
            sdk_version=adapter.sdk_version(),
            cli_version=adapter.cli_version(),
        )

    @unary
    async def ListRewindPoints(  # noqa: N802
        self, request: rewind_service_pb2.ListRewindPointsRequest, context: grpc.aio.ServicerContext
    ) -> rewind_service_pb2.ListRewindPointsResponse:
        worker = self._registry.get(_required("session_id", request.session_id))
        offset, size = convert.page_bounds(request.page_size, request.page_token, default=100)
        view = await worker.view()
        points = view.points[offset : offset + size]
        return rewind_service_pb2.ListRewindPointsResponse(
            points=[convert.rewind_point(p, worker.record.checkpointing) for p in points],
            next_page_token=convert.next_page_token(offset, size, len(view.points)),
            last_message_id=view.last_message_id,
        )

    def _request(self, request: rewind_service_pb2.RewindRequest) -> RewindRequest:
        return RewindRequest(
            session_id=_required("session_id", request.session_id),
            message_id=_required("message_id", request.message_id),
            mode=convert.mode(request.mode),
            expected_last_message_id=(
                request.expected_last_message_id if request.HasField("expected_last_message_id") else None
            ),
            request_id=parse_uuid("request_id", request.request_id) if request.request_id else None,
        )

    @unary
    async def DryRun(  # noqa: N802
        self, request: rewind_service_pb2.RewindRequest, context: grpc.aio.ServicerContext
    ) -> rewind_pb2.RewindResult:
        req = self._request(request)
        worker = self._registry.get(req.session_id)
        return convert.rewind_result(await self._engine.dry_run(worker, req))

    @unary
    async def Rewind(  # noqa: N802
        self, request: rewind_service_pb2.RewindRequest, context: grpc.aio.ServicerContext
    ) -> rewind_pb2.RewindResult:
        req = self._request(request)
        worker = self._registry.get(req.session_id)
        return convert.rewind_result(await self._engine.rewind(worker, req))

    async def WatchRewindEvents(  # noqa: N802
        self, request: rewind_service_pb2.WatchRewindEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[rewind_service_pb2.WatchRewindEventsResponse]:
        # Events are not served yet: GetCapabilities says events=false.
        await abort(context, NotServed("WatchRewindEvents"))
        yield rewind_service_pb2.WatchRewindEventsResponse()  # pragma: no cover - an async generator

    @unary
    async def UndoRewind(  # noqa: N802
        self, request: rewind_service_pb2.UndoRewindRequest, context: grpc.aio.ServicerContext
    ) -> rewind_pb2.RewindResult:
        raise NotServed("UndoRewind")
