"""What every handler shares: per-call log context, the error boundary, and forwarding a call
to the replica that owns its session (rpc/forwarding.py)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypeVar

import grpc
import structlog

from agent_rewind import metrics, tracing
from agent_rewind.errors import AgentRewindError, InvalidArgument, ReplicaUnavailable
from agent_rewind.replicas import Elsewhere
from agent_rewind.rpc import auth as rpc_auth
from agent_rewind.rpc.auth import Authenticator
from agent_rewind.rpc.errors import STATUS_BY_REASON, abort, abort_internal
from agent_rewind.rpc.forwarding import Forwarder, Relayed
from agent_rewind.rpc.registration import Undecodable

log = structlog.get_logger(__name__)

Req = TypeVar("Req")
Resp = TypeVar("Resp")
S = TypeVar("S")


def _bind(rpc: str, request: Any) -> None:
    structlog.contextvars.clear_contextvars()
    context: dict[str, str] = {"rpc": rpc}
    for name in ("session_id", "request_id"):
        value = getattr(request, name, "")
        if value:
            context[name] = value
    structlog.contextvars.bind_contextvars(**context)


@contextlib.asynccontextmanager
async def _error_boundary(context: grpc.aio.ServicerContext, method: str) -> AsyncIterator[None]:
    """Domain errors become their status; anything unexpected becomes INTERNAL, logged here.
    Every call is counted by its status code and timed (rpc metrics)."""
    code = grpc.StatusCode.OK
    reason: str | None = None
    started = time.perf_counter()
    counted = False

    def count() -> None:
        # Before a status is sent, not after: a caller that has its answer finds the call counted.
        nonlocal counted
        if not counted:
            counted = True
            tracing.rpc_outcome(code.name, code.value[0], reason)
            metrics.RPCS.labels(method, code.name).inc()
            metrics.RPC_SECONDS.labels(method).observe(time.perf_counter() - started)

    try:
        yield
    except Relayed as relayed:  # the status of the replica the call was forwarded to
        code, reason = relayed.status.code, relayed.reason
        count()
        await context.abort_with_status(relayed.status)
    except AgentRewindError as err:
        code, reason = STATUS_BY_REASON.get(err.reason, grpc.StatusCode.INTERNAL), err.reason
        # A stop ends every watch at once: one line for each would drown the log.
        level = logging.DEBUG if err.reason == "SHUTTING_DOWN" else logging.INFO
        log.log(level, "rpc refused", reason=err.reason, error=err.message)
        count()
        await abort(context, err)
    except grpc.aio.AbortError:
        code = context.code() or grpc.StatusCode.UNKNOWN
        raise
    except (asyncio.CancelledError, GeneratorExit):
        code = grpc.StatusCode.CANCELLED  # the caller hung up (or a watch was cut off)
        raise
    except Exception:
        code, reason = grpc.StatusCode.INTERNAL, "INTERNAL"
        log.exception("rpc failed unexpectedly")
        count()
        await abort_internal(context)
    finally:
        count()


class Servicer(Protocol):
    """What the handlers need of a servicer: how it authenticates callers, the service's full
    name, and (with replicas) the forwarder."""

    auth: Authenticator
    service: str
    forwarder: Forwarder | None


# RPCs about one session (its `session_id`): answered by the replica that owns it. The others
# are answered where they arrive: CreateSession (placed by --placement), ListSessions (each
# replica asked for its own), GetCapabilities, WatchRewindEvents (every replica reads the log),
# ListRewindPoints (every replica reads the session's points index in the ledger; a session
# without one yet is forwarded by the servicer, raising Elsewhere).
ROUTED = frozenset(
    {
        "GetSession",
        "Prompt",
        "Interrupt",
        "CloseSession",
        "ForkSession",
        "DeleteSession",
        "DryRun",
        "Rewind",
        "UndoRewind",
    }
)


async def _owner(servicer: Any, rpc: str, request: Any) -> Any:
    """The replica to forward this call to, or None to answer it here."""
    forwarder: Forwarder | None = getattr(servicer, "forwarder", None)
    session_id = getattr(request, "session_id", "")
    if forwarder is None or rpc not in ROUTED or not session_id:
        return None
    return await forwarder.owners.owner(session_id)


def _hop(replica: Any) -> Any:
    """A call forwarded here goes no further: its session's owner changed meanwhile."""
    if rpc_auth.forwarded_by():
        raise ReplicaUnavailable(
            replica.replica_id, "the call was forwarded to a replica that no longer owns the session"
        )
    structlog.contextvars.bind_contextvars(forwarded_to=replica.replica_id)
    return replica


def _decoded(request: Any) -> None:
    if isinstance(request, Undecodable):
        raise InvalidArgument("request", f"is not a valid {request.type_name} message: {request.error}")


def _admit(servicer: Any, rpc: str, context: grpc.aio.ServicerContext) -> None:
    """Authenticates the call and checks its permission (rpc/auth.py); a servicer without an
    authenticator (a unit test's) admits every call as the local principal."""
    auth: Authenticator | None = getattr(servicer, "auth", None)
    principal = auth.admit(rpc, context) if auth is not None else None
    if principal is not None and auth is not None and auth.enabled:
        structlog.contextvars.bind_contextvars(principal=principal.name)


def unary(
    fn: Callable[[S, Req, grpc.aio.ServicerContext], Awaitable[Resp]],
) -> Callable[[S, Req, grpc.aio.ServicerContext], Awaitable[Resp]]:
    @functools.wraps(fn)
    async def wrapper(self: S, request: Req, context: grpc.aio.ServicerContext) -> Resp:
        name = fn.__name__
        _bind(name, request)
        async with _error_boundary(context, name):
            _admit(self, name, context)
            _decoded(request)
            try:
                owner = await _owner(self, name, request)
                if owner is None:
                    return await fn(self, request, context)
            except Elsewhere as elsewhere:
                owner = elsewhere.replica
            forwarder: Forwarder = self.forwarder  # type: ignore[attr-defined]
            path = f"/{self.service}/{name}"  # type: ignore[attr-defined]
            forwarded: Resp = await forwarder.unary(  # type: ignore[assignment]  # bytes: registration._encode
                path, request, context, _hop(owner), getattr(request, "session_id", "")
            )
            return forwarded
        raise AssertionError("unreachable: the boundary aborts")

    return wrapper


def streaming(
    fn: Callable[[S, Req, grpc.aio.ServicerContext], AsyncIterator[Resp]],
) -> Callable[[S, Req, grpc.aio.ServicerContext], AsyncIterator[Resp]]:
    @functools.wraps(fn)
    async def wrapper(self: S, request: Req, context: grpc.aio.ServicerContext) -> AsyncIterator[Resp]:
        name = fn.__name__
        _bind(name, request)
        async with _error_boundary(context, name):
            _admit(self, name, context)
            _decoded(request)
            owner = await _owner(self, name, request)
            if owner is None:
                async for item in fn(self, request, context):
                    yield item
                return
            forwarder: Forwarder = self.forwarder  # type: ignore[attr-defined]
            path = f"/{self.service}/{name}"  # type: ignore[attr-defined]
            async for message in forwarder.stream(
                path, request, context, _hop(owner), getattr(request, "session_id", "")
            ):
                yield message  # type: ignore[misc]  # bytes: registration._encode

    return wrapper
