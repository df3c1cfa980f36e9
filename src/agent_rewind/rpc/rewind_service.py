"""RewindService: capabilities, rewind points, dry runs and rewinds."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import grpc

from agent_rewind import __version__
from agent_rewind.access import Principal
from agent_rewind.api.v1 import rewind_pb2, rewind_service_pb2, rewind_service_pb2_grpc
from agent_rewind.errors import InvalidArgument, SessionNotFound, SubscriberTooSlow
from agent_rewind.events import CaughtUp, EventHub
from agent_rewind.replicas import Elsewhere, Membership
from agent_rewind.rewind import paths as rewind_paths
from agent_rewind.rewind.calls import RewindRequest, UndoRequest
from agent_rewind.rewind.engine import RewindEngine
from agent_rewind.rewind.outcome import TURN, Mode
from agent_rewind.rpc import convert, requests
from agent_rewind.rpc.auth import Authenticator, current
from agent_rewind.rpc.caches import ServiceCaches, WatchStreams
from agent_rewind.rpc.errors import abort
from agent_rewind.rpc.forwarding import Forwarder
from agent_rewind.rpc.handlers import streaming, unary
from agent_rewind.rpc.requests import PageTokens, optional_uuid, required
from agent_rewind.sessions import adapter, points
from agent_rewind.sessions.registry import SessionRegistry
from agent_rewind.sessions.worker import SessionWorker
from agent_rewind.storage.retention import is_pruned
from agent_rewind.store.ledger import EventRecord, SessionRecord
from agent_rewind.transcript.entries import FILE_CHECKPOINT_WINDOW


async def _cut_off(
    context: grpc.aio.ServicerContext,
    events: AsyncGenerator[Any, None],
    task: asyncio.Task[Any],
    delivered: int | None,
) -> None:
    """Ends a watch that fell behind: the status follows what its transport already holds. The
    handler, likely waiting on that full transport, is closed so that it holds nothing more."""
    with contextlib.suppress(grpc.aio.AbortError, grpc.aio.UsageError, RuntimeError):
        await abort(context, SubscriberTooSlow(delivered or 0))
    try:
        # Suspended where it handed gRPC its last message: close it there.
        await events.aclose()
    except RuntimeError:
        # It is running (waiting on the log, say): cancel it where it waits.
        task.cancel()


class RewindServicer(rewind_service_pb2_grpc.RewindServiceServicer):
    service = rewind_service_pb2.DESCRIPTOR.services_by_name["RewindService"].full_name

    def __init__(
        self,
        registry: SessionRegistry,
        engine: RewindEngine,
        tokens: PageTokens,
        auth: Authenticator,
        backend: str,
        hub: EventHub,
        caches: ServiceCaches,
        max_live_sessions: int = 0,
        membership: Membership | None = None,
        forwarder: Forwarder | None = None,
        *,
        sandbox_hosts: tuple[str, ...] | None = None,
        landlock_abi: int = 0,
        max_watch_streams: int = 100,
    ) -> None:
        self.forwarder = forwarder
        # The hosts the command sandbox lets commands reach; None: no sandbox (--sandbox off).
        self._sandbox_hosts = sandbox_hosts
        self._landlock_abi = landlock_abi
        self._registry = registry
        self._membership = membership
        self._engine = engine
        self._hub = hub
        self._max_live_sessions = max_live_sessions
        # What calls share (the hub drops a deleted session's: rpc/caches.py).
        self._events = caches.events
        self._pages = caches.pages
        self._records = caches.records
        self._streams = WatchStreams(max_watch_streams)
        self._tokens = tokens
        self.auth = auth
        self._backend = backend

    @unary
    async def GetCapabilities(  # noqa: N802 - gRPC method name
        self, request: rewind_service_pb2.GetCapabilitiesRequest, context: grpc.aio.ServicerContext
    ) -> rewind_pb2.Capabilities:
        return rewind_pb2.Capabilities(
            modes=convert.MODES_SERVED,
            file_checkpoint_window=FILE_CHECKPOINT_WINDOW,
            dry_run=True,
            events=True,
            service_version=__version__,
            sdk_version=adapter.sdk_version(),
            cli_version=adapter.cli_version(),
            # Replicas whose lease was current at this replica's last heartbeat.
            replicas=self._membership.alive if self._membership is not None else 1,
            model_backend=self._backend,
            authentication=self.auth.enabled,
            max_live_sessions=self._max_live_sessions,
            workspace_snapshots=self._registry.workspace_snapshots_default,
            undo_rewind=True,
            fork_session=True,
            delete_session=True,
            prompt_rewind=True,
            sandbox=rewind_pb2.SandboxCapability(
                enabled=self._sandbox_hosts is not None,
                allowed_hosts=self._sandbox_hosts or (),
                cli_confinement="landlock" if self._landlock_abi else "",
                landlock_abi=self._landlock_abi,
            ),
        )

    @unary
    async def ListRewindPoints(  # type: ignore[override]  # noqa: N802 - bytes: see registration._encode
        self, request: rewind_service_pb2.ListRewindPointsRequest, context: grpc.aio.ServicerContext
    ) -> rewind_service_pb2.ListRewindPointsResponse | bytes:
        """Served from the session's points index in the ledger, by whichever replica the call
        reaches: the owner brings the index up to date first (sessions/points.py), any other
        replica reads it as the owner last wrote it, with no forwarded call."""
        principal = current()
        session_id = requests.session_id(request.session_id)
        size = requests.page_size(request.page_size, default=100)
        scope = f"points:{session_id}"
        position = self._tokens.position(request.page_token, scope)
        start = position.get("i") if position else 0
        if not isinstance(start, int) or start < 0:
            raise InvalidArgument("page_token", "is not a token this service issued for this list")
        try:
            worker: SessionWorker | None = self._registry.get(session_id, principal)
        except SessionNotFound:
            if self.forwarder is None:
                raise
            worker = None  # another replica's, or no one's
        ledger = self._registry.ledger
        if worker is not None:
            head = await worker.points.current_head()
            checkpointing = worker.record.checkpointing
            pruned_before = await worker.retention.pruned_before()
        else:
            record = await self._stored(session_id, principal)
            found_head = await ledger.points_head(session_id)
            if found_head is None:
                # Deleted (its index went with it), or an index its owner has not written yet (a
                # session from before the index): the owner answers, and writes it.
                self._records.forget(session_id)
                await self._registry.stored(session_id, principal)
                assert self.forwarder is not None
                owner = await self.forwarder.owners.owner(session_id)
                if owner is None:
                    raise SessionNotFound(session_id)
                raise Elsewhere(owner)
            head = found_head
            checkpointing = record.checkpointing
            usage = await ledger.usage(session_id)  # as the owner's retention marked it
            pruned_before = usage.files_pruned_before if usage is not None else None
        page = self._pages.points(session_id, start, size, head)
        if page is None:
            found = await points.page(ledger, session_id, start, size)
            if found is None:  # deleted meanwhile
                raise SessionNotFound(session_id)
            head, page = found
            self._pages.put(session_id, start, size, head, page)
        # The page's own points only: what a page reads does not grow with the session.
        refs = [p.message_id for p in page]
        if worker is not None:
            snapshots = await worker.snapshot_availability(refs)
        else:
            snapshots = await self._registry.stored_snapshot_availability(record, refs)
        key = (
            checkpointing,
            head.holds_newest,
            tuple(snapshots.get(p.message_id) for p in page),
            pruned_before,
        )
        encoded = self._pages.encoded(session_id, start, size, key)
        if encoded is None:
            more = start + size < head.count
            encoded = rewind_service_pb2.ListRewindPointsResponse(
                points=[
                    convert.rewind_point(
                        p,
                        checkpointing,
                        head.holds_newest,
                        snapshots.get(p.message_id),
                        files_pruned=is_pruned(p.create_time, pruned_before),
                    )
                    for p in page
                ],
                next_page_token=self._tokens.issue(scope, {"i": start + size}) if more else "",
                last_message_id=head.last_message_id,
            ).SerializeToString()
            self._pages.keep_encoded(session_id, start, size, key, encoded)
        return encoded

    async def _stored(self, session_id: str, principal: Principal) -> SessionRecord:
        """A session another replica owns, as the ledger recorded it at its creation;
        SESSION_NOT_FOUND to a principal that may not see it."""
        return await self._records.get(session_id, principal, self._registry.stored)

    def _request(self, request: rewind_service_pb2.RewindRequest) -> RewindRequest:
        mode = convert.mode(request.mode)
        scope = convert.scope(request.scope)
        if scope == TURN and mode is not Mode.FILES:
            raise InvalidArgument(
                "scope", "REWIND_SCOPE_TURN reverts one turn's files; it goes with REWIND_MODE_FILES only"
            )
        if request.paths and not mode.files:
            raise InvalidArgument("paths", "paths narrow the files half; a conversation rewind has none")
        return RewindRequest(
            session_id=requests.session_id(request.session_id),
            message_id=required("message_id", request.message_id),
            mode=mode,
            expected_last_message_id=(
                request.expected_last_message_id if request.HasField("expected_last_message_id") else None
            ),
            request_id=optional_uuid("request_id", request.request_id),
            principal=current().name,
            conflict_policy=convert.conflict_policy(request.conflict_policy),
            # Previews only: a Rewind ignores it, so one request can serve both calls.
            include_diff=request.include_diff,
            paths=rewind_paths.normalized(list(request.paths)),
            scope=scope,
        )

    @unary
    async def DryRun(  # noqa: N802
        self, request: rewind_service_pb2.RewindRequest, context: grpc.aio.ServicerContext
    ) -> rewind_pb2.RewindResult:
        req = self._request(request)
        worker = self._registry.get(req.session_id, current())
        return convert.rewind_result(await self._engine.dry_run(worker, req))

    @unary
    async def Rewind(  # noqa: N802
        self, request: rewind_service_pb2.RewindRequest, context: grpc.aio.ServicerContext
    ) -> rewind_pb2.RewindResult:
        req = self._request(request)
        worker = self._registry.get(req.session_id, current())
        return convert.rewind_result(await self._engine.rewind(worker, req))

    @streaming
    async def WatchRewindEvents(  # type: ignore[override]  # noqa: N802 - bytes: see registration._encode
        self, request: rewind_service_pb2.WatchRewindEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[rewind_service_pb2.WatchRewindEventsResponse | bytes]:
        principal = current()
        session_id = None
        if request.session_id:
            # Any replica serves the watch, from the log: the session may be another's.
            session_id = await self._registry.visible(requests.session_id(request.session_id), principal)
        after = request.after_cursor if request.HasField("after_cursor") else None

        def visible(event: EventRecord) -> bool:
            # The session's owner (and admins) may see its events, whoever made them.
            return principal.owns(str(event.data.get("owner", event.principal)))

        # The newest cursor whose message gRPC has taken (a write that is still waiting on a
        # full transport does not count): a watcher cut off resumes after it, missing nothing.
        delivered = after
        task = asyncio.current_task()

        def too_slow() -> None:
            assert task is not None
            asyncio.get_running_loop().create_task(_cut_off(context, events, task, delivered))

        with self._streams.held(principal.name):
            events = self._hub.watch(after, session_id, visible, on_too_slow=too_slow)
            async for item in events:
                if isinstance(item, CaughtUp):
                    if delivered is None:
                        delivered = item.cursor  # no cursor given: nothing before this one is owed
                    yield rewind_service_pb2.WatchRewindEventsResponse(
                        caught_up=rewind_pb2.CaughtUp(cursor=item.cursor)
                    )
                    delivered = max(delivered, item.cursor)
                else:
                    yield self._events.response(item)
                    delivered = item.cursor

    @unary
    async def UndoRewind(  # noqa: N802
        self, request: rewind_service_pb2.UndoRewindRequest, context: grpc.aio.ServicerContext
    ) -> rewind_pb2.RewindResult:
        req = UndoRequest(
            session_id=requests.session_id(request.session_id),
            rewind_id=requests.uuid_field("rewind_id", request.rewind_id),
            request_id=optional_uuid("request_id", request.request_id),
            conflict_policy=convert.conflict_policy(request.conflict_policy),
            validate_only=request.validate_only,
            principal=current().name,
        )
        worker = self._registry.get(req.session_id, current())
        return convert.rewind_result(await self._engine.undo(worker, req))
