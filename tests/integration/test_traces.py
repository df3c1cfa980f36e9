"""Traces across two replicas (server processes on one PostgreSQL database, real Claude Code
processes), exported over OTLP to a real receiver in the test: a Rewind sent to the replica
that does not own the session is one trace, from the caller's client span through both
replicas to the rewind's phases, and no span says what a prompt said or where a workspace is."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from opentelemetry.instrumentation.grpc import aio_client_interceptors
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from agent_rewind.api.v1 import (
    rewind_service_pb2,
    rewind_service_pb2_grpc,
    session_service_pb2,
    session_service_pb2_grpc,
)
from agent_rewind.testing.server_process import ServerProcess
from tests.integration.harness import BOTH, client_of, error_info, prompt_id, read
from tests.integration.otlp_receiver import CLIENT, INTERNAL, SERVER, OtlpReceiver, ReceivedSpan
from tests.pgserver_fixture import PostgresServer

REWIND = "/agent_rewind.v1.RewindService/Rewind"
PHASES = ["rewind.plan", "rewind.intent", "rewind.files", "rewind.completion", "rewind.conversation"]


@pytest.fixture
def database(postgres: PostgresServer) -> str:
    return postgres.url(postgres.create_database())


@pytest.fixture
async def receiver() -> AsyncIterator[OtlpReceiver]:
    found = await OtlpReceiver.start()
    try:
        yield found
    finally:
        await found.stop()


def _replica(tmp_path: Path, database: str, i: int, receiver: OtlpReceiver) -> ServerProcess:
    env = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        # Nothing is exported before the stop: what arrives is what the stop's flush sent.
        "OTEL_BSP_SCHEDULE_DELAY": "600000",
        "OTEL_BSP_MAX_QUEUE_SIZE": "100000",
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "100000",
    }
    args = ["--database-url", database, "--replica-id", f"replica-{i}"]
    return ServerProcess(tmp_path / f"replica-{i}", args=args, env=env)


def _one(spans: list[ReceivedSpan], **where: object) -> ReceivedSpan:
    found = [s for s in spans if all(getattr(s, k) == v for k, v in where.items())]
    assert len(found) == 1, f"{where}: {[(s.name, s.replica) for s in found]}"
    return found[0]


def _children(spans: list[ReceivedSpan], parent: ReceivedSpan) -> list[ReceivedSpan]:
    return [s for s in spans if s.parent_id == parent.span_id]


async def test_a_forwarded_rewind_is_one_trace_from_the_caller_through_both_replicas_to_its_phases(
    tmp_path: Path, database: str, receiver: OtlpReceiver
) -> None:
    owner, other = (_replica(tmp_path, database, i, receiver) for i in range(2))
    secret = f"prompt-text-{uuid.uuid4().hex}"  # a line the scripted model ignores
    caller_spans = InMemorySpanExporter()
    caller = TracerProvider()
    caller.add_span_processor(SimpleSpanProcessor(caller_spans))
    try:
        await owner.start()
        await other.start()
        direct = client_of(owner)
        session = await direct.create()
        sid, cwd = session.session_id, Path(session.cwd)
        ids = [prompt_id(await direct.prompt(sid, f"write a.txt v{i}\n{secret}")) for i in range(2)]
        assert read(cwd / "a.txt") == "v1\n"
        # The caller traces its call (the standard client interceptor): the other replica gets
        # its traceparent.
        async with grpc.aio.insecure_channel(
            other.address, interceptors=aio_client_interceptors(tracer_provider=caller)
        ) as channel:
            rewinds = rewind_service_pb2_grpc.RewindServiceStub(channel)
            rewound = await rewinds.Rewind(
                rewind_service_pb2.RewindRequest(session_id=sid, message_id=ids[1], mode=BOTH)
            )
            assert rewound.conversation.rewound and read(cwd / "a.txt") == "v0\n"
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await rewinds.Rewind(
                    rewind_service_pb2.RewindRequest(session_id=sid, message_id=str(uuid.uuid4()), mode=BOTH)
                )
            assert error_info(refused.value).reason == "MESSAGE_NOT_FOUND"
            # A refusal whose message names a path (the owner's, relayed through the other).
            outside = str(tmp_path / "outside-every-root")
            with pytest.raises(grpc.aio.AioRpcError) as outside_roots:
                await session_service_pb2_grpc.SessionServiceStub(channel).ForkSession(
                    session_service_pb2.ForkSessionRequest(session_id=sid, cwd=outside)
                )
            assert error_info(outside_roots.value).reason == "WORKSPACE_OUTSIDE_ROOT"
            assert outside in outside_roots.value.details(), "the caller is told; the traces are not"
        assert await other.stop() == 0 and await owner.stop() == 0  # each flushes its spans
    finally:
        await other.close()
        await owner.close()

    made, failed, _ = sorted(
        (s for s in caller_spans.get_finished_spans() if s.kind == SpanKind.CLIENT),
        key=lambda s: s.start_time or 0,
    )
    trace_id = f"{made.context.trace_id:032x}"
    spans = [s for s in receiver.spans if s.trace_id == trace_id]
    # client call -> the other replica's server span -> its forward -> the forward's client span
    # -> the owner's server span -> the rewind -> its phases.
    front = _one(spans, kind=SERVER, replica="replica-1")
    assert (front.name, front.parent_id) == (REWIND, f"{made.context.span_id:016x}")
    forward = _one(_children(spans, front), name="forward")
    assert (forward.kind, forward.replica) == (INTERNAL, "replica-1")
    assert forward.attributes["agent_rewind.owner"] == "replica-0"
    assert forward.attributes["agent_rewind.session_id"] == sid
    sent = _one(_children(spans, forward), kind=CLIENT)
    assert (sent.name, sent.replica) == (REWIND, "replica-1")
    back = _one(_children(spans, sent), kind=SERVER)
    assert (back.name, back.replica) == (REWIND, "replica-0")
    assert back.attributes["rpc.grpc.status_code"] == 0
    rewind = _one(_children(spans, back), name="rewind")
    assert rewind.attributes["agent_rewind.outcome"] == "applied"
    assert rewind.attributes["agent_rewind.rewind_id"] == rewound.rewind_id
    assert rewind.attributes["agent_rewind.mode"] == "both"
    phases = sorted(_children(spans, rewind), key=lambda s: PHASES.index(s.name) if s.name in PHASES else -1)
    assert [p.name for p in phases] == PHASES
    assert all(p.replica == "replica-0" for p in phases)
    plan = phases[0]
    assert plan.attributes["agent_rewind.files_changed"] == len(rewound.files.files_changed) == 1
    assert plan.attributes["agent_rewind.messages_dropped"] == rewound.conversation.messages_dropped > 0
    # The snapshot the plan took ran in a snapshot thread, and is the plan's child all the same.
    taken = _one(_children(spans, plan), name="snapshot.take")
    assert taken.attributes["agent_rewind.complete"] is True

    # The refused one: its reason on every span that failed, on both replicas.
    refused_spans = [s for s in receiver.spans if s.trace_id == f"{failed.context.trace_id:032x}"]
    servers = [s for s in refused_spans if s.kind == SERVER]
    assert sorted(s.replica for s in servers) == ["replica-0", "replica-1"]
    for span in servers:
        assert span.attributes["agent_rewind.error.reason"] == "MESSAGE_NOT_FOUND", span.replica
        assert span.attributes["rpc.grpc.status_code"] == grpc.StatusCode.NOT_FOUND.value[0]
    assert _one(refused_spans, name="rewind").attributes["agent_rewind.outcome"] == "refused"

    # The turns were traced too (through the owner alone), each with its snapshots.
    turns = [s for s in receiver.spans if s.name == "turn"]
    assert sorted(t.attributes["agent_rewind.prompt_id"] for t in turns) == sorted(ids)
    for turn in turns:
        assert len([s for s in _children(receiver.spans, turn) if s.name == "snapshot.take"]) == 2
    # No span, on either replica, holds a prompt's text or a path of the test's (workspace,
    # state dirs, the refused fork's): not in names, attributes, events, statuses or resources.
    forks = [s for s in receiver.spans if s.name.endswith("/ForkSession")]
    assert len(forks) == 3, "both server spans and the forward's client span"
    assert all(s.attributes.get("agent_rewind.error.reason") for s in forks if s.kind == SERVER)
    for span in receiver.spans:
        assert secret not in span.text(), span.name
        assert str(tmp_path) not in span.text() and str(cwd) not in span.text(), span.name
