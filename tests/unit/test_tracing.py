"""tracing.py: off unless the OTEL_* variables ask for traces; what a span of ours records; a
span in a snapshot thread is its caller's child."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import StatusCode

from agent_rewind import tracing
from agent_rewind.components import StartError, open_tracing
from agent_rewind.config import Config
from agent_rewind.errors import WorkspaceOutsideRoot
from agent_rewind.snapshots import Limits
from agent_rewind.snapshots.taking import Snapshots


@pytest.fixture(autouse=True)
def no_otel(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No OTEL_* variable of the machine's, and no provider left behind."""
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    yield
    tracing.uninstall()


@pytest.fixture
def exported() -> InMemorySpanExporter:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracing.install(provider)
    return spans


def test_tracing_is_off_without_otel_variables() -> None:
    assert tracing.configure("r") is None
    assert not tracing.enabled()
    assert tracing.server_interceptors() == [] and tracing.client_interceptors() == []
    with tracing.span("rewind", session_id="s") as span:
        span.set(outcome="applied")
        assert span is tracing.UNTRACED, "one shared object that does nothing"
    assert not trace.get_current_span().is_recording()


@pytest.mark.parametrize(
    "variables",
    [
        {"OTEL_TRACES_EXPORTER": "none"},
        {"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_SDK_DISABLED": "TRUE"},
        {"OTEL_SERVICE_NAME": "mine"},  # naming the service asks for no traces
    ],
)
def test_tracing_stays_off_when_the_variables_say_so(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str]
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert tracing.configure("r") is None
    assert not tracing.enabled() and tracing.server_interceptors() == []


async def test_an_exporter_named_turns_tracing_on_with_the_sdks_own_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    configured = tracing.configure("replica-7")
    assert configured is not None and configured.exporters == ("console",)
    try:
        assert tracing.enabled() and len(tracing.server_interceptors()) == 1
        assert len(tracing.client_interceptors()) == 4
        assert configured.provider.sampler is ALWAYS_OFF
        resource = configured.provider.resource.attributes
        assert (resource["service.name"], resource["service.instance.id"]) == ("agent-rewind", "replica-7")
    finally:
        await configured.close()
    assert not tracing.enabled(), "closed: spans go nowhere"


async def test_an_otlp_endpoint_alone_turns_on_the_otlp_exporter_and_the_variables_name_the_service(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "rewinds")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.instance.id=pod-3,deployment.environment=test")
    configured = tracing.configure("replica-7")
    assert configured is not None and configured.exporters == ("otlp",)
    try:
        resource = configured.provider.resource.attributes
        assert (resource["service.name"], resource["service.instance.id"]) == ("rewinds", "pod-3")
        assert resource["deployment.environment"] == "test"
    finally:
        await configured.close()


@pytest.mark.parametrize(
    ("variables", "says"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "'zipkin' is not one of otlp, console, none"),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, "over gRPC only"),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"},
            "over gRPC only",
        ),
    ],
)
def test_an_exporter_this_server_does_not_have_is_a_usage_error_at_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, variables: dict[str, str], says: str
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(tracing.TracingConfigError, match=says):
        tracing.configure("r")
    with pytest.raises(StartError, match=says) as refused:
        open_tracing(contextlib.AsyncExitStack(), Config(state_dir=tmp_path).resolved())
    assert refused.value.usage
    assert not tracing.enabled()


def test_a_span_is_the_current_ones_child_and_holds_our_attributes_under_our_prefix(
    exported: InMemorySpanExporter,
) -> None:
    with tracing.span("rewind", session_id="s1", mode="both", skipped=None) as outer:
        with tracing.span("rewind.plan") as inner:
            inner.set(files_changed=2, complete=True)
        outer.set(outcome="applied")
    plan, rewind = exported.get_finished_spans()
    assert plan.parent is not None and plan.parent.span_id == rewind.context.span_id
    assert dict(rewind.attributes or {}) == {
        "agent_rewind.session_id": "s1",
        "agent_rewind.mode": "both",
        "agent_rewind.outcome": "applied",
    }
    assert dict(plan.attributes or {}) == {"agent_rewind.files_changed": 2, "agent_rewind.complete": True}


def test_a_span_that_fails_records_the_reason_never_the_message(exported: InMemorySpanExporter) -> None:
    err = WorkspaceOutsideRoot("/home/someone/secret-project", ["/srv"])
    assert "/home/someone/secret-project" in err.message
    with pytest.raises(WorkspaceOutsideRoot), tracing.span("rewind"):
        raise err
    with pytest.raises(KeyError), tracing.span("turn"):
        raise KeyError("/home/someone/secret-project/a.txt")
    refused, crashed = exported.get_finished_spans()
    assert refused.status.status_code == StatusCode.ERROR
    assert refused.status.description == "WORKSPACE_OUTSIDE_ROOT"
    assert (refused.attributes or {})["agent_rewind.error.reason"] == "WORKSPACE_OUTSIDE_ROOT"
    assert (crashed.attributes or {})["error.type"] == "KeyError"
    for span in (refused, crashed):
        assert not span.events, "no exception event: its message and stack are not for traces"
        assert "secret-project" not in repr((span.attributes, span.status.description))


async def test_a_span_in_a_snapshot_thread_is_its_callers_child(
    exported: InMemorySpanExporter, tmp_path: Path
) -> None:
    snapshots = Snapshots(tmp_path, ledger=None, limits=Limits())  # type: ignore[arg-type]
    try:

        def work() -> str:
            assert threading.current_thread().name.startswith("snapshot")
            with tracing.span("snapshot.take"):
                return "taken"

        with tracing.span("turn"):
            assert await snapshots.run(work) == "taken"
    finally:
        snapshots.close()
    taken, turn = exported.get_finished_spans()
    assert taken.parent is not None and taken.parent.span_id == turn.context.span_id


async def test_a_cancelled_span_says_cancelled(exported: InMemorySpanExporter) -> None:
    async def turn() -> None:
        with tracing.span("turn"):
            await asyncio.sleep(60)

    task = asyncio.create_task(turn())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (span,) = exported.get_finished_spans()
    assert (span.attributes or {})["error.type"] == "CANCELLED"


def test_what_the_standard_instrumentation_says_of_an_error_is_taken_out_before_export() -> None:
    """Its exception events quote the exception's message and stack, and its statuses the gRPC
    status's message: either may name a path. Exported: the type, and the reason or the code."""
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(tracing.redacting(SimpleSpanProcessor(spans)))
    tracer = provider.get_tracer("test")
    path = "/home/someone/secret-project"
    with tracer.start_as_current_span("server", record_exception=False) as server:
        server.record_exception(ValueError(f"cwd {path!r} resolves outside the roots"))
        server.set_attribute("agent_rewind.error.reason", "WORKSPACE_OUTSIDE_ROOT")
        server.set_status(trace.Status(StatusCode.ERROR, f"INVALID_ARGUMENT:cwd {path!r}"))
    with tracer.start_as_current_span("client") as client:
        client.set_attribute("rpc.grpc.status_code", 3)
        client.set_status(trace.Status(StatusCode.ERROR, f"AioRpcError: cwd {path!r}"))
    exported_server, exported_client = spans.get_finished_spans()
    assert [(e.name, dict(e.attributes or {})) for e in exported_server.events] == [
        ("exception", {"exception.type": "ValueError", "exception.escaped": "False"})
    ]
    assert exported_server.status.description == "WORKSPACE_OUTSIDE_ROOT"
    assert (exported_client.status.status_code, exported_client.status.description) == (
        StatusCode.ERROR,
        "INVALID_ARGUMENT",
    )
    for span in (exported_server, exported_client):
        assert path not in repr((span.attributes, span.events, span.status.description))
        assert span.parent is None and span.context is not None
