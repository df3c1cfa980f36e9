"""Forwarding (rpc/forwarding.py) between two real gRPC servers on loopback: a front replica whose
servicer owns nothing, and an owner that records what reached it. The front runs the real
handlers (rpc/handlers.py) and the real authenticator; the owner is a stand-in for the service."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import grpc
import pytest
from grpc_status import rpc_status
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from agent_rewind import metrics, tracing
from agent_rewind.access import LOCAL
from agent_rewind.api.v1 import session_pb2, session_service_pb2, session_service_pb2_grpc
from agent_rewind.errors import SessionNotFound
from agent_rewind.rpc import registration
from agent_rewind.rpc.auth import FORWARDED_BY, PRINCIPAL, REPLICA_SECRET, Authenticator
from agent_rewind.rpc.errors import to_status
from agent_rewind.rpc.forwarding import Forwarder
from agent_rewind.rpc.handlers import streaming, unary
from agent_rewind.server import SESSION_SERVICE
from agent_rewind.store.ledger import ReplicaRecord

SID = "0b7f3c1e-5a8d-4d6e-9f10-2a3b4c5d6e7f"
SECRET = "s3cret"


@dataclass
class _Owners:
    """Every session is the owner's; what the forwarder forgot is kept."""

    to: ReplicaRecord
    replica_id: str = "front"
    forgotten: list[str] = field(default_factory=list)
    addresses_forgotten: list[str] = field(default_factory=list)

    async def owner(self, session_id: str) -> ReplicaRecord:
        return self.to

    def forget(self, session_id: str) -> None:
        self.forgotten.append(session_id)

    async def forget_address(self, replica_id: str) -> None:
        self.addresses_forgotten.append(replica_id)


class _Front(session_service_pb2_grpc.SessionServiceServicer):
    """A replica that owns no session: the real handlers forward every routed call."""

    service = SESSION_SERVICE.full_name

    def __init__(self, forwarder: Forwarder) -> None:
        self.forwarder = forwarder
        self.auth = Authenticator(None, replica_secret=SECRET)

    @unary
    async def GetSession(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        raise AssertionError("answered here: it should have been forwarded")

    @streaming
    async def Prompt(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:  # noqa: N802
        raise AssertionError("answered here: it should have been forwarded")
        yield

    @unary
    async def CloseSession(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        raise AssertionError("answered here: it should have been forwarded (the owner serves no such call)")


@dataclass
class _Owner:
    """What reached the owner: each call's metadata and remaining time, and how streams ended."""

    calls: list[tuple[dict[str, str], float | None]] = field(default_factory=list)
    # Each call's metadata as it came, every value of a repeated key.
    raw: list[list[tuple[str, str | bytes]]] = field(default_factory=list)
    stream_ended: asyncio.Event = field(default_factory=asyncio.Event)
    stream_cancelled: bool = False
    fail_with: Exception | None = None

    def _record(self, context: grpc.aio.ServicerContext) -> None:
        self.raw.append([(k, v) for k, v in context.invocation_metadata() or ()])
        metadata = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
        self.calls.append((metadata, context.time_remaining()))

    async def get(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self._record(context)
        if isinstance(self.fail_with, SessionNotFound):
            await context.abort_with_status(rpc_status.to_status(to_status(self.fail_with)))
        asked = session_service_pb2.GetSessionRequest.FromString(request)
        return session_pb2.Session(session_id=asked.session_id, replica="owner").SerializeToString()

    async def prompt(self, request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        self._record(context)
        try:
            for i in range(1000):
                yield session_pb2.TurnEvent(session_id=SID, message_id=f"part {i}").SerializeToString()
                await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            self.stream_cancelled = True
            raise
        finally:
            self.stream_ended.set()


def _identity(data: bytes) -> bytes:
    return data


@pytest.fixture
async def pair() -> AsyncIterator[tuple[grpc.aio.Channel, _Owner, _Owners]]:
    async with _pair() as made:
        yield made


@contextlib.asynccontextmanager
async def _pair() -> AsyncIterator[tuple[grpc.aio.Channel, _Owner, _Owners]]:
    """The front and the owner; traced (the front's server and forwarder) when tracing is on."""
    owner = _Owner()
    back = grpc.aio.server()
    back.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                SESSION_SERVICE.full_name,
                {
                    "GetSession": grpc.unary_unary_rpc_method_handler(
                        owner.get, request_deserializer=_identity, response_serializer=_identity
                    ),
                    "Prompt": grpc.unary_stream_rpc_method_handler(
                        owner.prompt, request_deserializer=_identity, response_serializer=_identity
                    ),
                },
            ),
        )
    )
    back_port = back.add_insecure_port("127.0.0.1:0")
    await back.start()
    to = ReplicaRecord("owner", f"127.0.0.1:{back_port}", 1, datetime.now(UTC), True)
    owners = _Owners(to)
    forwarder = Forwarder(owners, SECRET, interceptors=tracing.client_interceptors())  # type: ignore[arg-type]
    front = grpc.aio.server(interceptors=tracing.server_interceptors())
    registration.add(front, SESSION_SERVICE, _Front(forwarder))
    front_port = front.add_insecure_port("127.0.0.1:0")
    await front.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{front_port}")
    try:
        yield channel, owner, owners
    finally:
        await channel.close()
        await forwarder.close()
        await front.stop(0)
        await back.stop(0)


async def test_a_unary_call_reaches_the_owner_with_principal_secret_and_deadline(
    pair: tuple[grpc.aio.Channel, _Owner, _Owners],
) -> None:
    channel, owner, _ = pair
    stub = session_service_pb2_grpc.SessionServiceStub(channel)
    got = await stub.GetSession(
        session_service_pb2.GetSessionRequest(session_id=SID),
        timeout=7,
        metadata=(("traceparent", "00-abc-def-01"), ("authorization", "Bearer mine")),
    )
    assert (got.session_id, got.replica) == (SID, "owner")
    ((metadata, remaining),) = owner.calls
    assert (metadata[FORWARDED_BY], metadata[PRINCIPAL], metadata[REPLICA_SECRET]) == (
        "front",
        LOCAL.name,
        SECRET,
    )
    # gRPC carries a deadline on the wire rounded up to its timeout units: a few ms over 7 s.
    assert remaining is not None and 5 < remaining <= 7.1, "what remains of the caller's deadline"
    assert metadata["traceparent"] == "00-abc-def-01", "the caller's own metadata goes along"
    assert "authorization" not in metadata, "its credentials do not"


async def test_a_forwarded_call_is_counted_and_timed_by_its_method(
    pair: tuple[grpc.aio.Channel, _Owner, _Owners],
) -> None:
    """The time recorded is the forwarded call's own: no more than the caller waited."""
    channel, _, _ = pair
    stub = session_service_pb2_grpc.SessionServiceStub(channel)
    counted = _sample("agent_rewind_forwarded_rpcs_total", method="GetSession")
    timed = _sample("agent_rewind_forwarded_rpc_duration_seconds_sum", method="GetSession")
    started = time.perf_counter()
    await stub.GetSession(session_service_pb2.GetSessionRequest(session_id=SID))
    waited = time.perf_counter() - started
    assert _sample("agent_rewind_forwarded_rpcs_total", method="GetSession") == counted + 1
    took = _sample("agent_rewind_forwarded_rpc_duration_seconds_sum", method="GetSession") - timed
    assert 0 < took <= waited


def _sample(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


async def test_a_status_the_owners_transport_gave_comes_back_as_it_said_it(
    pair: tuple[grpc.aio.Channel, _Owner, _Owners],
) -> None:
    """An owner that does not serve the call (an older version, say) answers UNIMPLEMENTED from
    gRPC itself, with no details of the contract: the caller gets that status and its message,
    as the owner would have told it."""
    channel, _, owners = pair
    request = session_service_pb2.CloseSessionRequest(session_id=SID)
    async with grpc.aio.insecure_channel(owners.to.address) as direct:
        with pytest.raises(grpc.aio.AioRpcError) as said:
            await session_service_pb2_grpc.SessionServiceStub(direct).CloseSession(request)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await session_service_pb2_grpc.SessionServiceStub(channel).CloseSession(request)
    assert said.value.code() == grpc.StatusCode.UNIMPLEMENTED and said.value.details()
    assert (err.value.code(), err.value.details()) == (said.value.code(), said.value.details())
    assert owners.forgotten == [SID], "its owner is asked again next time"


async def test_the_owners_error_comes_back_whole_and_its_owner_is_asked_again_next_time(
    pair: tuple[grpc.aio.Channel, _Owner, _Owners],
) -> None:
    channel, owner, owners = pair
    owner.fail_with = SessionNotFound(SID)
    stub = session_service_pb2_grpc.SessionServiceStub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.GetSession(session_service_pb2.GetSessionRequest(session_id=SID))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    status = rpc_status.from_call(err.value)  # type: ignore[arg-type]
    assert status is not None and "SESSION_NOT_FOUND" in str(status.details[0].value)
    assert owners.forgotten == [SID]


async def test_an_owner_that_cannot_be_reached_is_replica_unavailable_naming_it(
    pair: tuple[grpc.aio.Channel, _Owner, _Owners],
) -> None:
    channel, _, owners = pair
    owners.to = ReplicaRecord("gone", "127.0.0.1:1", 1, datetime.now(UTC), True)  # nothing listens
    stub = session_service_pb2_grpc.SessionServiceStub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.GetSession(session_service_pb2.GetSessionRequest(session_id=SID))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    status = rpc_status.from_call(err.value)  # type: ignore[arg-type]
    assert status is not None
    text = str(status.details[0].value)
    assert "REPLICA_UNAVAILABLE" in text and "gone" in text
    assert owners.addresses_forgotten == ["gone"], "the directory is read again for the next call"


async def test_a_caller_that_hangs_up_on_a_stream_cancels_the_forwarded_one(
    pair: tuple[grpc.aio.Channel, _Owner, _Owners],
) -> None:
    channel, owner, _ = pair
    stub = session_service_pb2_grpc.SessionServiceStub(channel)
    call = stub.Prompt(session_service_pb2.PromptRequest(session_id=SID, text="hi"))
    seen = [await call.read() for _ in range(3)]
    assert [e.message_id for e in seen] == ["part 0", "part 1", "part 2"]
    call.cancel()
    await asyncio.wait_for(owner.stream_ended.wait(), 10)
    assert owner.stream_cancelled, "the owner's stream was cancelled, not left running"


async def test_a_forwarded_call_without_the_replica_secret_is_unauthenticated(
    pair: tuple[grpc.aio.Channel, _Owner, _Owners],
) -> None:
    channel, owner, _ = pair
    stub = session_service_pb2_grpc.SessionServiceStub(channel)
    for secret in ("", "guess"):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.GetSession(
                session_service_pb2.GetSessionRequest(session_id=SID),
                metadata=((FORWARDED_BY, "mallory"), (PRINCIPAL, "admin"), (REPLICA_SECRET, secret)),
            )
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert owner.calls == [], "nothing was forwarded"


async def test_a_forwarded_stream_reaches_the_owner_with_what_remains_of_the_callers_deadline(
    pair: tuple[grpc.aio.Channel, _Owner, _Owners],
) -> None:
    channel, owner, _ = pair
    stub = session_service_pb2_grpc.SessionServiceStub(channel)
    call = stub.Prompt(session_service_pb2.PromptRequest(session_id=SID, text="hi"), timeout=7)
    assert (await call.read()).message_id == "part 0"
    call.cancel()
    ((metadata, remaining),) = owner.calls
    assert metadata[PRINCIPAL] == LOCAL.name
    # gRPC carries a deadline on the wire rounded up to its timeout units: a few ms over 7 s.
    assert remaining is not None and 5 < remaining <= 7.1, "the stream's deadline went along"


async def test_a_call_that_was_forwarded_already_is_never_forwarded_again(
    pair: tuple[grpc.aio.Channel, _Owner, _Owners],
) -> None:
    """A replica that does not hold the session a forwarded call is for refuses it: forwarding it
    on could go round in circles between replicas that disagree on the owner."""
    channel, owner, _ = pair
    stub = session_service_pb2_grpc.SessionServiceStub(channel)
    hop = ((FORWARDED_BY, "another-replica"), (PRINCIPAL, LOCAL.name), (REPLICA_SECRET, SECRET))
    with pytest.raises(grpc.aio.AioRpcError) as unary_err:
        await stub.GetSession(session_service_pb2.GetSessionRequest(session_id=SID), metadata=hop)
    call = stub.Prompt(session_service_pb2.PromptRequest(session_id=SID, text="hi"), metadata=hop)
    with pytest.raises(grpc.aio.AioRpcError) as stream_err:
        await call.read()
    for err in (unary_err.value, stream_err.value):
        assert err.code() == grpc.StatusCode.UNAVAILABLE
        assert _reason(err) == "REPLICA_UNAVAILABLE"
    assert owner.calls == [], "nothing was forwarded on"


def _reason(err: grpc.aio.AioRpcError) -> str:
    from google.rpc import error_details_pb2

    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    assert status is not None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return str(info.reason)
    raise AssertionError("no ErrorInfo")


async def test_a_replica_without_a_secret_accepts_no_forwarded_call_whatever_it_carries() -> None:
    """A server without a database has no replica secret: a call naming a forwarding replica is
    refused, with no secret, an empty one or any other (before, no secret let it name any
    principal)."""
    auth = Authenticator(None, replica_secret="")
    front = grpc.aio.server()

    class _Alone(session_service_pb2_grpc.SessionServiceServicer):
        service = SESSION_SERVICE.full_name
        forwarder = None

        def __init__(self) -> None:
            self.auth = auth

        @unary
        async def GetSession(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
            return session_pb2.Session(session_id=request.session_id, principal="answered")

    registration.add(front, SESSION_SERVICE, _Alone())
    port = front.add_insecure_port("127.0.0.1:0")
    await front.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        stub = session_service_pb2_grpc.SessionServiceStub(channel)
        for extra in ((), ((REPLICA_SECRET, ""),), ((REPLICA_SECRET, "anything"),)):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.GetSession(
                    session_service_pb2.GetSessionRequest(session_id=SID),
                    metadata=((FORWARDED_BY, "mallory"), (PRINCIPAL, "admin"), *extra),
                )
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, extra
        # Without the header the same call is answered: the refusal is the header's.
        got = await stub.GetSession(session_service_pb2.GetSessionRequest(session_id=SID))
        assert got.principal == "answered"
    finally:
        await channel.close()
        await front.stop(0)


# With tracing on (tracing.py): the front's server span, the forward's span and its client span,
# and the trace context the owner gets.


@pytest.fixture
async def traced() -> AsyncIterator[tuple[grpc.aio.Channel, _Owner, _Owners, InMemorySpanExporter]]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracing.install(provider)
    try:
        async with _pair() as (channel, owner, owners):
            yield channel, owner, owners, spans
    finally:
        tracing.uninstall()


def _named(spans: InMemorySpanExporter, name: str) -> ReadableSpan:
    (found,) = [s for s in spans.get_finished_spans() if s.name == name]
    return found


async def _front(spans: InMemorySpanExporter) -> list[ReadableSpan]:
    """The front's server spans, once ended: the server ends its span after the answer is on its
    way, so the caller can hold the answer a moment before the span is exported."""
    async with asyncio.timeout(5):
        while not (found := [s for s in spans.get_finished_spans() if s.kind == SpanKind.SERVER]):
            await asyncio.sleep(0.01)
    return found


CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_PARENT = "b7ad6b7169203331"


async def test_the_owner_gets_one_traceparent_the_forwards_own_never_what_the_caller_sent(
    traced: tuple[grpc.aio.Channel, _Owner, _Owners, InMemorySpanExporter],
) -> None:
    channel, owner, _, spans = traced
    stub = session_service_pb2_grpc.SessionServiceStub(channel)
    # A tracestate and a baggage the propagator cannot read: it writes none, and the caller's
    # must not slip through in its place.
    smuggled = ("tracestate", "=not a tracestate="), ("baggage", "%%% not baggage")
    await stub.GetSession(
        session_service_pb2.GetSessionRequest(session_id=SID),
        metadata=(
            ("traceparent", f"00-{'f' * 32}-{'e' * 16}-01"),
            ("traceparent", f"00-{CALLER_TRACE}-{CALLER_PARENT}-01"),  # gRPC keeps the last
            *smuggled,
            ("x-request-origin", "web"),
        ),
    )
    (raw,) = owner.raw
    parents = [v for k, v in raw if k == "traceparent"]
    assert len(parents) == 1
    assert not [k for k, _ in raw if k in ("tracestate", "baggage")], raw
    sent = [s for s in spans.get_finished_spans() if s.kind == SpanKind.CLIENT]
    assert len(sent) == 1
    client = sent[0]
    assert parents[0] == f"00-{CALLER_TRACE}-{client.context.span_id:016x}-01", "the forward's client span"
    assert ("x-request-origin", "web") in raw, "the caller's other metadata still goes along"
    front = await _front(spans)
    forward = _named(spans, "forward")
    assert len(front) == 1 and front[0].parent is not None
    assert f"{front[0].parent.span_id:016x}" == CALLER_PARENT, "the caller's span is the front's parent"
    assert forward.parent is not None and forward.parent.span_id == front[0].context.span_id
    assert client.parent is not None and client.parent.span_id == forward.context.span_id
    assert dict(forward.attributes or {}) == {
        "agent_rewind.rpc_method": "GetSession",
        "agent_rewind.owner": "owner",
        "agent_rewind.session_id": SID,
    }


async def test_the_owners_refusal_is_on_the_fronts_spans_by_its_reason(
    traced: tuple[grpc.aio.Channel, _Owner, _Owners, InMemorySpanExporter],
) -> None:
    channel, owner, _, spans = traced
    owner.fail_with = SessionNotFound(SID)
    stub = session_service_pb2_grpc.SessionServiceStub(channel)
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.GetSession(session_service_pb2.GetSessionRequest(session_id=SID))
    (front,) = await _front(spans)
    forward = _named(spans, "forward")
    assert (front.attributes or {})["rpc.grpc.status_code"] == grpc.StatusCode.NOT_FOUND.value[0]
    assert (front.attributes or {})["agent_rewind.error.reason"] == "SESSION_NOT_FOUND"
    assert (forward.attributes or {})["agent_rewind.error.reason"] == "SESSION_NOT_FOUND"
    assert (forward.attributes or {})["agent_rewind.grpc_status"] == "NOT_FOUND"


async def test_an_unreachable_owner_fails_the_fronts_server_span_as_replica_unavailable(
    traced: tuple[grpc.aio.Channel, _Owner, _Owners, InMemorySpanExporter],
) -> None:
    channel, _, owners, spans = traced
    owners.to = ReplicaRecord("gone", "127.0.0.1:1", 1, datetime.now(UTC), True)  # nothing listens
    with pytest.raises(grpc.aio.AioRpcError):
        await session_service_pb2_grpc.SessionServiceStub(channel).GetSession(
            session_service_pb2.GetSessionRequest(session_id=SID)
        )
    (front,) = await _front(spans)
    assert (front.attributes or {})["agent_rewind.error.reason"] == "REPLICA_UNAVAILABLE"
    assert front.status.description == "REPLICA_UNAVAILABLE", "a server fault: the span is an error"


async def test_a_caller_that_hangs_up_on_a_traced_stream_cancels_the_forwarded_one_and_ends_its_span(
    traced: tuple[grpc.aio.Channel, _Owner, _Owners, InMemorySpanExporter],
) -> None:
    channel, owner, _, spans = traced
    stub = session_service_pb2_grpc.SessionServiceStub(channel)
    call = stub.Prompt(session_service_pb2.PromptRequest(session_id=SID, text="hi"))
    seen = [await call.read() for _ in range(3)]
    assert [e.message_id for e in seen] == ["part 0", "part 1", "part 2"]
    call.cancel()
    await asyncio.wait_for(owner.stream_ended.wait(), 10)
    assert owner.stream_cancelled, "the owner's stream was cancelled, not left running"
    async with asyncio.timeout(10):
        while not [s for s in spans.get_finished_spans() if s.name == "forward"]:
            await asyncio.sleep(0.01)
    forward = _named(spans, "forward")
    assert (forward.attributes or {})["agent_rewind.error.reason"] == "CANCELLED"
    (raw,) = owner.raw
    assert len([k for k, _ in raw if k == "traceparent"]) == 1
