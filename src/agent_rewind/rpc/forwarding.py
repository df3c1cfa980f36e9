"""Calls for a session another replica owns, forwarded to that replica (API.md, "Many replicas").

Any replica accepts any call; one for a session it does not hold goes to the session's owner
(`replicas.Owners`) as the same request, unary or streaming, with:
- the caller's principal, authenticated here, and the deployment's replica secret (rpc/auth.py),
  over TLS when the replicas serve TLS (presenting this replica's certificate, for mTLS); not
  the caller's own credentials;
- the caller's other metadata, as it came; with tracing on, the trace context (`traceparent`,
  `tracestate`, `baggage`) is not the caller's but the forward's own client span's (tracing.py),
  written once by the standard client interceptor: a caller's duplicate or malformed header never
  reaches the owner;
- the caller's deadline, what remains of it;
- the caller's cancellation: a caller that hangs up cancels the forwarded call.

The owner's answer comes back as it is: its messages as bytes, never decoded here, and its
error status with its details. An owner that cannot be reached is REPLICA_UNAVAILABLE, naming
it. A forwarded call is never forwarded again: a replica that receives one for a session it does
not hold answers REPLICA_UNAVAILABLE (the session's owner changed meanwhile; the caller retries).
"""

from __future__ import annotations

import collections
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc

from agent_rewind import metrics, tracing
from agent_rewind.errors import ReplicaUnavailable
from agent_rewind.replicas import Owners
from agent_rewind.rpc.auth import FORWARDED_BY, PRINCIPAL, REPLICA_SECRET, current
from agent_rewind.rpc.errors import reason_in
from agent_rewind.store.ledger import ReplicaRecord

# The trailer that holds a status's details (google.rpc.Status): passed back as it came.
_DETAILS = "grpc-status-details-bin"
# The caller's metadata that is not passed on: its credentials, and what gRPC sets itself.
_NOT_CARRIED = frozenset({"authorization", "user-agent", "content-type", "te"})
# What the trace context propagator writes: with tracing on, the forward's own, not the caller's.
_TRACE_CONTEXT = frozenset({"traceparent", "tracestate", "baggage"})


def _carried(context: grpc.aio.ServicerContext, *, traced: bool) -> tuple[tuple[str, str | bytes], ...]:
    return tuple(
        (key, value)
        for key, value in context.invocation_metadata() or ()
        if key not in _NOT_CARRIED
        and not key.startswith(("grpc-", ":", "agent-rewind-"))
        and not (traced and key in _TRACE_CONTEXT)
    )


class _Status(collections.namedtuple("_Status", ("code", "details", "trailing_metadata")), grpc.Status):  # type: ignore[misc]
    """The owner's status, to abort the caller's call with."""


class Relayed(Exception):
    """The owner's error status, which becomes the caller's as it is (rpc/handlers.py)."""

    def __init__(self, status: grpc.Status) -> None:
        super().__init__(f"{status.code.name}: {status.details}")
        self.status = status
        self.reason = reason_in(status)  # the owner's, for the traces (tracing.reason_of)


def _identity(data: bytes) -> bytes:
    return data


def _serialize(message: Any) -> bytes:
    encoded: bytes = message.SerializeToString()
    return encoded


class Forwarder:
    """Channels to the other replicas, one per address, and the forwarding of calls on them."""

    def __init__(
        self,
        owners: Owners,
        secret: str,
        credentials: grpc.ChannelCredentials | None = None,
        options: tuple[tuple[str, Any], ...] = (),
        interceptors: list[Any] | None = None,
    ) -> None:
        """`interceptors`: the channels' (tracing.client_interceptors: a client span per call,
        and the trace context it sends)."""
        self.owners = owners
        self._secret = secret
        self._credentials = credentials
        self._options = options
        self._interceptors = list(interceptors or ())
        self._channels: dict[str, grpc.aio.Channel] = {}
        # (address, path, streaming) -> the method's callable on that replica's channel, made once.
        self._methods: dict[tuple[str, str, bool], Any] = {}

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            if self._credentials is not None:
                channel = grpc.aio.secure_channel(
                    address, self._credentials, options=self._options, interceptors=self._interceptors
                )
            else:
                channel = grpc.aio.insecure_channel(
                    address, options=self._options, interceptors=self._interceptors
                )
            self._channels[address] = channel
        return channel

    def _method(self, address: str, path: str, *, streaming: bool) -> Any:
        key = (address, path, streaming)
        method = self._methods.get(key)
        if method is None:
            channel = self._channel(address)
            make = channel.unary_stream if streaming else channel.unary_unary
            method = make(path, request_serializer=_serialize, response_deserializer=_identity)
            self._methods[key] = method
        return method

    def _metadata(self, context: grpc.aio.ServicerContext) -> tuple[tuple[str, str | bytes], ...]:
        return (
            *_carried(context, traced=bool(self._interceptors)),
            (FORWARDED_BY, self.owners.replica_id),
            (PRINCIPAL, current().name),
            (REPLICA_SECRET, self._secret),
        )

    async def unary(
        self,
        path: str,
        request: Any,
        context: grpc.aio.ServicerContext,
        to: ReplicaRecord,
        session_id: str = "",
    ) -> bytes:
        """The owner's answer to `request` (its bytes), or its status on `context`."""
        with tracing.span("forward", **_traced(path, to, session_id)) as span:
            call = self._method(to.address, path, streaming=False)(
                request, timeout=context.time_remaining(), metadata=self._metadata(context)
            )
            started = time.perf_counter()
            try:
                response: bytes = await call  # cancelled with the caller's call
                return response
            except grpc.aio.AioRpcError as err:
                span.set(grpc_status=err.code().name)
                raise await self._failure(err, to, session_id) from None
            finally:
                _count(path, started)

    async def stream(
        self,
        path: str,
        request: Any,
        context: grpc.aio.ServicerContext,
        to: ReplicaRecord,
        session_id: str = "",
    ) -> AsyncIterator[bytes]:
        """The owner's messages for `request`, as they come; then its status on `context`."""
        # Current only while the call is made (its client span is the forward's child): a
        # generator's context is its consumer's between messages.
        span = tracing.begin("forward", **_traced(path, to, session_id))
        with tracing.current(span):
            call = self._method(to.address, path, streaming=True)(
                request, timeout=context.time_remaining(), metadata=self._metadata(context)
            )
        started = time.perf_counter()
        try:
            async for message in call:
                yield message
        except grpc.aio.AioRpcError as err:
            span.set(grpc_status=err.code().name)
            failure = await self._failure(err, to, session_id)
            span.fail(failure)
            raise failure from None
        except BaseException as err:
            span.fail(err)
            raise
        finally:
            call.cancel()  # the caller hung up, or the stream ended: nothing stays open there
            _count(path, started)
            span.end()

    async def _failure(self, err: grpc.aio.AioRpcError, to: ReplicaRecord, session_id: str) -> Exception:
        """What the caller is told of a forwarded call that failed."""
        if session_id:
            self.owners.forget(session_id)  # asked of the ledger again next time
        details = tuple((k, v) for k, v in (err.trailing_metadata() or ()) if k == _DETAILS)
        if details:  # the owner answered (any error of the contract): as it said it
            return Relayed(_Status(err.code(), err.details() or "", details))
        if err.code() == grpc.StatusCode.UNAVAILABLE:
            await self.owners.forget_address(to.replica_id)
            return ReplicaUnavailable(to.replica_id, f"it cannot be reached at {to.address}: {err.details()}")
        # The caller's deadline passed, or the transport said something of its own: as it is.
        return Relayed(_Status(err.code(), err.details() or "", ()))

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        self._methods.clear()


def _traced(path: str, to: ReplicaRecord, session_id: str) -> dict[str, str | None]:
    """A forward's span attributes: the method, the owner, the session if any (ids only)."""
    return {"rpc_method": path.rsplit("/", 1)[-1], "owner": to.replica_id, "session_id": session_id or None}


def _count(path: str, started: float) -> None:
    method = path.rsplit("/", 1)[-1]
    metrics.FORWARDED_RPCS.labels(method).inc()
    metrics.FORWARDED_RPC_SECONDS.labels(method).observe(time.perf_counter() - started)
