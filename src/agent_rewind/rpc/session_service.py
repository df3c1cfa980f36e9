"""SessionService: create, read, prompt, interrupt, close and delete sessions."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC

import grpc
from google.protobuf import empty_pb2

from agent_rewind import workspace_paths
from agent_rewind.access import Permission
from agent_rewind.api.v1 import session_pb2, session_service_pb2, session_service_pb2_grpc
from agent_rewind.rewind.calls import RewindRequest
from agent_rewind.rewind.engine import RewindEngine
from agent_rewind.rpc import convert, requests
from agent_rewind.rpc.auth import Authenticator, current, forwarded_by
from agent_rewind.rpc.forwarding import Forwarder
from agent_rewind.rpc.handlers import streaming, unary
from agent_rewind.rpc.requests import PageTokens, optional_uuid, required
from agent_rewind.sessions import commands
from agent_rewind.sessions.registry import NewSessionRequest, SessionRegistry, page_key
from agent_rewind.sessions.turn_events import RewoundEvent, TurnEvent
from agent_rewind.sessions.turns import Prelude
from agent_rewind.sessions.worker import SessionWorker


class SessionServicer(session_service_pb2_grpc.SessionServiceServicer):
    service = session_service_pb2.DESCRIPTOR.services_by_name["SessionService"].full_name

    def __init__(
        self,
        registry: SessionRegistry,
        engine: RewindEngine,
        tokens: PageTokens,
        auth: Authenticator,
        forwarder: Forwarder | None = None,
        *,
        offline: bool = False,
    ) -> None:
        """`offline`: the agents talk to the built-in scripted model, which nobody pays for (a
        turn's cost is 0, not what the CLI would charge for the tokens it counted)."""
        self._registry = registry
        self._engine = engine
        self._tokens = tokens
        self.auth = auth
        self.forwarder = forwarder
        self._priced = not offline

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
            # Checkpointing off is the caller's last word on file tracking (API.md, Round 3):
            # only an explicit workspace_snapshots gives such a session snapshots.
            else self._registry.workspace_snapshots_default and checkpointing
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
                workspace_home=_workspace_home(),
            ),
            place=not forwarded_by(),  # (a call placed here by another replica stays here)
        )
        await self._registry.start(worker)
        return await _session(worker)

    @unary
    async def GetSession(  # noqa: N802
        self, request: session_service_pb2.GetSessionRequest, context: grpc.aio.ServicerContext
    ) -> session_pb2.Session:
        worker = self._session(request.session_id)
        return await _session(worker)

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
        sessions = [(page_key(w), await _session(w)) for w in workers]
        if self.forwarder is not None and not forwarded_by():
            # Every replica lists the sessions it owns, from the same position: the page is the
            # newest `size` of them all. (A replica that is down is not asked: its sessions are
            # listed again once it is back; see docs/scaling.md.)
            others = await self.forwarder.owners.others()
            if others:
                path = f"/{self.service}/ListSessions"
                pages = await asyncio.gather(
                    *(self.forwarder.unary(path, request, context, other) for other in others),
                    return_exceptions=True,
                )
                for page in pages:
                    if isinstance(page, BaseException):
                        raise page  # the first replica that could not list: the caller retries
                    response = session_service_pb2.ListSessionsResponse.FromString(page)
                    more = more or bool(response.next_page_token)
                    sessions.extend((_page_key(s), s) for s in response.sessions)
                sessions.sort(key=lambda pair: pair[0], reverse=True)
                more = more or len(sessions) > size
                sessions = sessions[:size]
        token = ""
        if more:
            created, sid = sessions[-1][0]
            token = self._tokens.issue(scope, {"t": created, "s": sid})
        return session_service_pb2.ListSessionsResponse(
            sessions=[s for _, s in sessions], next_page_token=token
        )

    @streaming
    async def Prompt(  # noqa: N802
        self, request: session_service_pb2.PromptRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[session_pb2.TurnEvent]:
        worker = self._session(request.session_id)
        text = requests.prompt_text(request.text)
        commands.check_prompt(text)
        request_id = optional_uuid("request_id", request.request_id) or ""
        prelude: Prelude | None = None
        key: str | None = None
        if request.HasField("rewind"):
            current().require(Permission.REWIND)
            rewind = self._prompt_rewind(worker, request.rewind)
            key = rewind.fingerprint()

            async def prelude() -> TurnEvent | None:
                return RewoundEvent(await self._engine.rewind_before_prompt(worker, rewind))

        turn = await worker.start_turn(text, request_id, prelude=prelude, prelude_key=key)
        async for event in turn.events():
            yield convert.turn_event(worker.session_id, event, priced=self._priced)

    @staticmethod
    def _prompt_rewind(worker: SessionWorker, rewind: session_service_pb2.PromptRewind) -> RewindRequest:
        return RewindRequest(
            session_id=worker.session_id,
            message_id=required("rewind.message_id", rewind.message_id),
            mode=convert.mode(rewind.mode),
            expected_last_message_id=(
                rewind.expected_last_message_id if rewind.HasField("expected_last_message_id") else None
            ),
            principal=current().name,
            conflict_policy=convert.conflict_policy(rewind.conflict_policy),
        )

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
        source = self._session(request.session_id)
        worker = await self._registry.fork(
            source,
            request.message_id,
            NewSessionRequest(
                cwd=request.cwd,
                session_id=optional_uuid("new_session_id", request.new_session_id) or "",
                options={},  # the source's
                checkpointing=True,  # the source's
                workspace_snapshots=True,  # the source's
                request_id=optional_uuid("request_id", request.request_id) or "",
                principal=current().name,
                workspace_home=_workspace_home(),
                fresh_workspace=True,
            ),
        )
        return await _session(worker)

    @unary
    async def DeleteSession(  # noqa: N802
        self, request: session_service_pb2.DeleteSessionRequest, context: grpc.aio.ServicerContext
    ) -> empty_pb2.Empty:
        # Erasure for good (docs/sessions.md); the owner or an admin only: to anyone else the
        # session does not exist. A retry with the same request_id answers Empty again.
        await self._registry.delete(
            requests.session_id(request.session_id),
            principal=current(),
            request_id=optional_uuid("request_id", request.request_id) or "",
            delete_workspace=request.delete_workspace,
        )
        return empty_pb2.Empty()


def _page_key(session: session_pb2.Session) -> tuple[str, str]:
    """`registry.page_key` of a session another replica listed."""
    created = session.create_time.ToDatetime(tzinfo=UTC).isoformat(timespec="microseconds")
    return created, session.session_id


async def _session(worker: SessionWorker) -> session_pb2.Session:
    """The session as every RPC answers it, with what its snapshots hold on disk."""
    # The visible conversation's size and newest message from the points index: no whole read
    # of the transcript after a start.
    head = await worker.points.current_head()
    session = convert.session(worker, head.last_message_id, head.count)
    session.snapshot_bytes = await worker.snapshot_bytes()
    usage = await worker.storage()
    if usage is not None:
        session.storage.workspace_bytes, session.storage.history_bytes = usage
    return session


def _workspace_home() -> str | None:
    """Where the caller's workspaces lie in each root: a directory of its own, unless it is an
    admin (the only caller of a server without authentication is one)."""
    principal = current()
    return None if principal.admin else workspace_paths.principal_dir(principal.name)
