"""A small synchronous client, shared by the CLI and the demo.

By default the channel is plain (insecure) gRPC, which suits a server on loopback. With `tls` it is
a TLS channel; with `token` every call carries `authorization: Bearer <token>`.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any

import grpc
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agent_rewind.api.v1 import (
    rewind_pb2,
    rewind_service_pb2,
    rewind_service_pb2_grpc,
    session_pb2,
    session_service_pb2,
    session_service_pb2_grpc,
)

from ._credentials import BearerToken, Tls

DEFAULT_SERVER = "127.0.0.1:50051"
SERVER_ENV = "AGENT_REWIND_SERVER"


def resolve_server(flag: str | None, env: Mapping[str, str] | None = None) -> str:
    """`--server`, else $AGENT_REWIND_SERVER, else 127.0.0.1:50051."""
    environ = os.environ if env is None else env
    return flag or environ.get(SERVER_ENV) or DEFAULT_SERVER


def is_loopback(server: str) -> bool:
    """Whether HOST:PORT names this machine's loopback interface."""
    if server.startswith("["):
        host = server[1:].split("]", 1)[0]
    elif server.count(":") == 1:
        host = server.rsplit(":", 1)[0]
    else:
        host = server
    return host in ("localhost", "::1") or host.startswith("127.")


def _options(server: str) -> list[tuple[str, Any]]:
    # gRPC honours $http_proxy; a proxy cannot reach this machine's loopback, so never use one for it.
    return [("grpc.enable_http_proxy", 0)] if is_loopback(server) else []


class Client:
    """Typed calls on SessionService and RewindService. Failed calls raise grpc.RpcError.

    `token`: a bearer token sent as `authorization: Bearer <token>` on every call, streaming ones
    included. `tls`: use a TLS channel, trusting `tls.ca` (else the system's roots) and, for mutual
    TLS, presenting `tls.cert_chain` and `tls.key`. Neither: a plain channel, for a loopback server.
    `channel` replaces the channel the client would open (the token is still added to its calls).

    Use as a context manager, or call `close()`, to release the channel.
    """

    def __init__(
        self, server: str, *, token: str | None = None, tls: Tls | None = None, channel: Any = None
    ) -> None:
        self.server = server
        self.tls = tls is not None
        # ValueError for an empty or malformed token, before a channel is opened.
        bearer = BearerToken(token) if token is not None else None
        if channel is None:
            channel = (
                grpc.secure_channel(server, tls.channel_credentials(), _options(server))
                if tls is not None
                else grpc.insecure_channel(server, _options(server))
            )
        self._channel: Any = channel
        if bearer is not None:
            channel = grpc.intercept_channel(channel, bearer)
        self._sessions: session_service_pb2_grpc.SessionServiceStub = (
            session_service_pb2_grpc.SessionServiceStub(channel)
        )
        self._rewinds: rewind_service_pb2_grpc.RewindServiceStub = rewind_service_pb2_grpc.RewindServiceStub(
            channel
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def wait_until_serving(self, timeout: float, *, waiting: Callable[[], None] | None = None) -> bool:
        """Waits until the server answers its health check SERVING (it is up and has finished
        starting), at most `timeout` seconds; False if it did not. `waiting` is called once, if
        the server is not serving at the first try."""
        health = health_pb2_grpc.HealthStub(self._channel)
        deadline = time.monotonic() + timeout
        told = False
        while True:
            left = deadline - time.monotonic()
            try:
                answer = health.Check(
                    health_pb2.HealthCheckRequest(), timeout=max(0.1, min(left, 2.0)), wait_for_ready=True
                )
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    return True
            except grpc.RpcError:
                pass
            if time.monotonic() >= deadline:
                return False
            if not told and waiting is not None:
                waiting()
                told = True
            time.sleep(0.2)

    # --- SessionService ---------------------------------------------------------------------------

    def create_session(
        self,
        *,
        cwd: str = "",
        session_id: str = "",
        options: struct_pb2.Struct | None = None,
        file_checkpointing: bool | None = None,
        workspace_snapshots: bool | None = None,
        request_id: str = "",
    ) -> session_pb2.Session:
        request = session_service_pb2.CreateSessionRequest(
            cwd=cwd, session_id=session_id, options=options, request_id=request_id
        )
        if file_checkpointing is not None:
            request.enable_file_checkpointing = file_checkpointing
        if workspace_snapshots is not None:
            request.workspace_snapshots = workspace_snapshots
        session: session_pb2.Session = self._sessions.CreateSession(request)
        return session

    def get_session(self, session_id: str) -> session_pb2.Session:
        session: session_pb2.Session = self._sessions.GetSession(
            session_service_pb2.GetSessionRequest(session_id=session_id)
        )
        return session

    def list_sessions(
        self, *, page_size: int = 0, page_token: str = ""
    ) -> session_service_pb2.ListSessionsResponse:
        response: session_service_pb2.ListSessionsResponse = self._sessions.ListSessions(
            session_service_pb2.ListSessionsRequest(page_size=page_size, page_token=page_token)
        )
        return response

    def list_all_sessions(self, *, page_size: int = 0) -> session_service_pb2.ListSessionsResponse:
        """Every page, merged into one response with no next_page_token."""
        merged = session_service_pb2.ListSessionsResponse()
        token = ""
        while True:
            page = self.list_sessions(page_size=page_size, page_token=token)
            merged.sessions.extend(page.sessions)
            token = page.next_page_token
            if not token:
                return merged

    def prompt(
        self,
        session_id: str,
        text: str,
        *,
        request_id: str = "",
        rewind: session_service_pb2.PromptRewind | None = None,
    ) -> PromptStream:
        """Starts a turn. Iterate the result for its TurnEvents as they arrive; `cancel()` stops listening
        (the turn itself runs on to its end on the server). With `rewind`, the session is rewound
        first, in the same step (edit a prompt): the stream opens with the rewind's result, and a
        refused rewind ends it with its status, nothing run."""
        request = session_service_pb2.PromptRequest(
            session_id=session_id, text=text, request_id=request_id or str(uuid.uuid4())
        )
        if rewind is not None:
            request.rewind.CopyFrom(rewind)
        return PromptStream(self._sessions.Prompt(request))

    def fork_session(
        self,
        session_id: str,
        message_id: str = "",
        *,
        new_session_id: str = "",
        cwd: str = "",
        request_id: str = "",
    ) -> session_pb2.Session:
        """ForkSession: a new session whose conversation and files are the source's just before
        `message_id` (empty: as they are now). The source is untouched."""
        session: session_pb2.Session = self._sessions.ForkSession(
            session_service_pb2.ForkSessionRequest(
                session_id=session_id,
                message_id=message_id,
                new_session_id=new_session_id,
                cwd=cwd,
                request_id=request_id or str(uuid.uuid4()),
            )
        )
        return session

    def interrupt(self, session_id: str) -> session_pb2.Session:
        session: session_pb2.Session = self._sessions.Interrupt(
            session_service_pb2.InterruptRequest(session_id=session_id)
        )
        return session

    def close_session(self, session_id: str) -> session_pb2.Session:
        session: session_pb2.Session = self._sessions.CloseSession(
            session_service_pb2.CloseSessionRequest(session_id=session_id)
        )
        return session

    def delete_session(
        self, session_id: str, *, delete_workspace: bool = False, request_id: str = ""
    ) -> None:
        """DeleteSession: erases the session for good (its transcript with every hidden branch, the
        subagent transcripts, the CLI's file backups, the workspace snapshots, the ledger's copies of
        its text; the workspace too with `delete_workspace`). From then on it is SESSION_NOT_FOUND.
        A fresh request id is sent when none is given: a retry of this call with the same id
        answers as the first did."""
        self._sessions.DeleteSession(
            session_service_pb2.DeleteSessionRequest(
                session_id=session_id,
                request_id=request_id or str(uuid.uuid4()),
                delete_workspace=delete_workspace,
            )
        )

    # --- RewindService ----------------------------------------------------------------------------

    def capabilities(self) -> rewind_pb2.Capabilities:
        caps: rewind_pb2.Capabilities = self._rewinds.GetCapabilities(
            rewind_service_pb2.GetCapabilitiesRequest()
        )
        return caps

    def list_points(
        self, session_id: str, *, page_size: int = 0, page_token: str = ""
    ) -> rewind_service_pb2.ListRewindPointsResponse:
        response: rewind_service_pb2.ListRewindPointsResponse = self._rewinds.ListRewindPoints(
            rewind_service_pb2.ListRewindPointsRequest(
                session_id=session_id, page_size=page_size, page_token=page_token
            )
        )
        return response

    def list_all_points(
        self, session_id: str, *, page_size: int = 0
    ) -> rewind_service_pb2.ListRewindPointsResponse:
        """Every page, merged; last_message_id is the last page's."""
        merged = rewind_service_pb2.ListRewindPointsResponse()
        token = ""
        while True:
            page = self.list_points(session_id, page_size=page_size, page_token=token)
            merged.points.extend(page.points)
            merged.last_message_id = page.last_message_id
            token = page.next_page_token
            if not token:
                return merged

    def rewind(
        self,
        session_id: str,
        message_id: str,
        mode: rewind_pb2.RewindMode.ValueType,
        *,
        dry_run: bool = False,
        expected_last_message_id: str | None = None,
        request_id: str = "",
        conflict_policy: rewind_pb2.ConflictPolicy.ValueType = rewind_pb2.CONFLICT_POLICY_UNSPECIFIED,
        include_diff: bool = False,
        paths: Sequence[str] = (),
        scope: rewind_pb2.RewindScope.ValueType = rewind_pb2.REWIND_SCOPE_UNSPECIFIED,
    ) -> rewind_pb2.RewindResult:
        """DryRun (applies nothing) or Rewind.

        `conflict_policy`: what the files half does with a path also changed outside the agent, or
        for a revert with a file changed since the turn (unspecified: refuse). `include_diff`: a
        DryRun also returns each path's unified diff (a Rewind ignores it). `paths`: the
        workspace-relative files and directories the files half is narrowed to (empty: every path).
        `scope`: REWIND_SCOPE_TURN reverts only what the turn at `message_id` changed (files mode
        only); unspecified: everything since the point."""
        request = rewind_service_pb2.RewindRequest(
            session_id=session_id,
            message_id=message_id,
            mode=mode,
            request_id=request_id,
            conflict_policy=conflict_policy,
            include_diff=include_diff,
            paths=list(paths),
            scope=scope,
        )
        if expected_last_message_id is not None:
            request.expected_last_message_id = expected_last_message_id
        method = self._rewinds.DryRun if dry_run else self._rewinds.Rewind
        result: rewind_pb2.RewindResult = method(request)
        return result

    def undo(
        self,
        session_id: str,
        rewind_id: str,
        *,
        validate_only: bool = False,
        request_id: str = "",
        conflict_policy: rewind_pb2.ConflictPolicy.ValueType = rewind_pb2.CONFLICT_POLICY_UNSPECIFIED,
    ) -> rewind_pb2.RewindResult:
        """UndoRewind: files and conversation back as they were just before the session's latest
        rewind (while no turn ran after it). `validate_only` previews it."""
        result: rewind_pb2.RewindResult = self._rewinds.UndoRewind(
            rewind_service_pb2.UndoRewindRequest(
                session_id=session_id,
                rewind_id=rewind_id,
                request_id=request_id,
                conflict_policy=conflict_policy,
                validate_only=validate_only,
            )
        )
        return result

    def latest_rewind_id(self, session_id: str) -> str | None:
        """The id of the session's latest rewind, undone or not, from its events replayed from the
        oldest kept (WatchRewindEvents: the `events.read` permission); None when none of them is one.

        The contract has no other way to ask (UndoRewind wants the id); a rewind whose event the
        server's retention dropped is not found."""
        stream = self.watch_events(session_id, after_cursor=0)
        latest: str | None = None
        try:
            for response in stream:
                if response.WhichOneof("response") == "caught_up":
                    break  # the replay is whole; what follows is live
                if response.event.kind == rewind_pb2.REWIND_EVENT_KIND_REWOUND:
                    latest = response.event.rewind_id
        finally:
            stream.cancel()
        return latest

    def watch_events(self, session_id: str = "", *, after_cursor: int | None = None) -> WatchStream:
        """Opens a WatchRewindEvents stream: the events of `session_id` (empty: every session the
        caller may see). `after_cursor` None: only new events (caught_up comes at once); 0: replay from
        the oldest retained event; N: replay the events after cursor N. Then one caught_up, then live
        events, until the stream fails (the iteration raises grpc.RpcError) or `cancel()` is called."""
        request = rewind_service_pb2.WatchRewindEventsRequest(session_id=session_id)
        if after_cursor is not None:
            request.after_cursor = after_cursor
        return WatchStream(self._rewinds.WatchRewindEvents(request))


class PromptStream:
    """The TurnEvents of one Prompt call, in the order the server sends them."""

    def __init__(self, call: Any) -> None:
        self._call = call

    def __iter__(self) -> Iterator[session_pb2.TurnEvent]:
        for event in self._call:
            typed: session_pb2.TurnEvent = event
            yield typed

    def cancel(self) -> None:
        self._call.cancel()


class WatchStream:
    """The responses of one WatchRewindEvents call, each an event or the one caught_up, as they arrive."""

    def __init__(self, call: Any) -> None:
        self._call = call

    def __iter__(self) -> Iterator[rewind_service_pb2.WatchRewindEventsResponse]:
        for response in self._call:
            typed: rewind_service_pb2.WatchRewindEventsResponse = response
            yield typed

    def cancel(self) -> None:
        self._call.cancel()
