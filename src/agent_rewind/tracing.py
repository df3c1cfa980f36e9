"""OpenTelemetry traces (docs/operations.md#tracing): off unless the standard `OTEL_*` variables
ask for them.

With tracing off (the default) there is no tracer provider, no interceptor on the gRPC server or
the forwarding channels, and `span()` hands back one shared object that does nothing: a span at
a call site costs a function call. With it on (`OTEL_TRACES_EXPORTER`, or an OTLP endpoint),
every RPC has the standard server span (opentelemetry-instrumentation-grpc), a forwarded call
its client span and the `traceparent` it carries to the owner, and the service's own work its
child spans (`span()`): a rewind's phases, a turn, a snapshot, a forward.

A leaf like metrics.py: any layer may open a span. What a span holds is ids, counts, outcomes
and reasons, never text a caller or the model wrote, nor a path (a prompt, a workspace, a file,
an error's message): call sites pass only those, and a span that fails records the contract's
reason (or the exception's type), not its message or stack. What the standard instrumentation
adds of an error (an exception event's message and stack, a status's message) is taken out before
a span is exported (`redacting`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

if TYPE_CHECKING:  # the SDK is imported only when tracing is on (configure)
    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

Attribute = str | bool | int | float

# What an attribute of ours is called: `agent_rewind.<key>`.
_PREFIX = "agent_rewind."
SERVICE_NAME = "agent-rewind"
# The gRPC status codes that make a server span an error (OpenTelemetry's RPC conventions:
# the others are the caller's doing, and leave the status unset).
_SERVER_ERRORS = frozenset(
    {"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS"}
)
# Not traced: probes, which would drown the traces (the health side port has no interceptor).
_UNTRACED_SERVICES = ("grpc.health.v1.Health",)


class TracingConfigError(ValueError):
    """The OTEL_* variables ask for something this server cannot do; the message says what."""


class Traced:
    """A span of the service's, and what call sites may put on it."""

    __slots__ = ("span",)

    def __init__(self, span: Span) -> None:
        self.span = span

    def set(self, **attributes: Attribute | None) -> None:
        """Sets `agent_rewind.<key>` for each attribute that is not None."""
        for key, value in attributes.items():
            if value is not None:
                self.span.set_attribute(_PREFIX + key, value)

    def error(self, reason: str) -> None:
        """Marks the span failed, with the contract's reason (errors.py) or an exception's type."""
        self.span.set_attribute("error.type", reason)
        self.span.set_attribute(_PREFIX + "error.reason", reason)
        self.span.set_status(Status(StatusCode.ERROR, reason))

    def fail(self, err: BaseException) -> None:
        self.error(reason_of(err))

    def end(self) -> None:
        self.span.end()


class _Untraced(Traced):
    """What every call site gets while tracing is off: one shared object that does nothing."""

    __slots__ = ()

    def __init__(self) -> None:
        pass

    def set(self, **attributes: Attribute | None) -> None:
        pass

    def error(self, reason: str) -> None:
        pass

    def fail(self, err: BaseException) -> None:
        pass

    def end(self) -> None:
        pass

    def __enter__(self) -> Traced:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


UNTRACED = _Untraced()

_provider: TracerProvider | None = None
_tracer: trace.Tracer | None = None


def enabled() -> bool:
    return _tracer is not None


def reason_of(err: BaseException) -> str:
    """What a failed span records: the contract's reason of a domain error, else the type's name
    (never the message, which may hold a path or a caller's text)."""
    reason = getattr(err, "reason", None)
    if isinstance(reason, str) and reason:
        return reason
    if isinstance(err, asyncio.CancelledError):
        return "CANCELLED"
    return type(err).__name__


def _attributes(given: dict[str, Attribute | None]) -> dict[str, Attribute]:
    return {_PREFIX + key: value for key, value in given.items() if value is not None}


def begin(name: str, **attributes: Attribute | None) -> Traced:
    """A child span of the current one, started but not made current (`current` makes it so for
    a stretch of code): for work whose end is not the end of a block, such as a stream."""
    tracer = _tracer
    if tracer is None:
        return UNTRACED
    return Traced(tracer.start_span(name, attributes=_attributes(attributes), record_exception=False))


@contextlib.contextmanager
def current(traced: Traced) -> Iterator[None]:
    """Makes `traced` the current span while the block runs (what it starts is its child)."""
    if traced is UNTRACED:
        yield
        return
    token = otel_context.attach(trace.set_span_in_context(traced.span))
    try:
        yield
    finally:
        otel_context.detach(token)


def span(name: str, **attributes: Attribute | None) -> contextlib.AbstractContextManager[Traced]:
    """A child span of the current one for the block, current inside it; failed with the reason
    of the exception that leaves it (`reason_of`)."""
    if _tracer is None:
        return UNTRACED
    return _span(begin(name, **attributes))


@contextlib.contextmanager
def _span(traced: Traced) -> Iterator[Traced]:
    try:
        with current(traced):
            yield traced
    except BaseException as err:
        traced.fail(err)
        raise
    finally:
        traced.end()


def rpc_outcome(code: str, code_value: int, reason: str | None) -> None:
    """Puts a call's outcome on its server span (the current one): its status code and the
    contract's reason. The standard interceptor sees only `abort`, and our errors are sent with
    `abort_with_status` (rpc/errors.py), so it would say OK."""
    if _tracer is None:
        return
    server = trace.get_current_span()
    if not server.is_recording():
        return
    server.set_attribute("rpc.grpc.status_code", code_value)
    if reason:
        server.set_attribute(_PREFIX + "error.reason", reason)
        server.set_attribute("error.type", reason)
    if code in _SERVER_ERRORS:
        server.set_status(Status(StatusCode.ERROR, reason or code))


def server_interceptors() -> list[Any]:
    """The standard gRPC aio server interceptor (every RPC's server span, the caller's
    `traceparent` taken as its parent), or none while tracing is off."""
    if _provider is None:
        return []
    from opentelemetry.instrumentation.grpc import aio_server_interceptor, filters

    untraced = filters.negate(filters.any_of(*(filters.service_name(s) for s in _UNTRACED_SERVICES)))
    return [aio_server_interceptor(tracer_provider=_provider, filter_=untraced)]  # type: ignore[no-untyped-call]


def client_interceptors() -> list[Any]:
    """The standard gRPC aio client interceptors (a client span per call, its context injected
    as `traceparent`), or none while tracing is off."""
    if _provider is None:
        return []
    from opentelemetry.instrumentation.grpc import aio_client_interceptors

    return list(aio_client_interceptors(tracer_provider=_provider))  # type: ignore[no-untyped-call]


def install(provider: TracerProvider) -> None:
    """Makes `provider` the one this process's spans go to (tests install one of their own)."""
    global _provider, _tracer
    _provider = provider
    _tracer = provider.get_tracer("agent_rewind")


def uninstall() -> None:
    global _provider, _tracer
    _provider = None
    _tracer = None


@dataclass(frozen=True)
class Tracing:
    """The tracer provider the OTEL_* variables configured, and its exporters' names."""

    provider: TracerProvider
    exporters: tuple[str, ...]

    async def close(self) -> None:
        """Exports what is left (bounded by the exporters' timeouts), in a thread."""
        if _provider is self.provider:
            uninstall()
        await asyncio.to_thread(self.provider.shutdown)


# What an event keeps of its attributes (the standard instrumentation's exception events: their
# message and stack may quote an error's message, which may name a path or hold a caller's text).
_EVENT_KEPT = frozenset({"exception.type", "exception.escaped"})


def redacting(inner: SpanProcessor) -> SpanProcessor:
    """`inner`, given each finished span with what the standard instrumentation may put in it of
    an error's text taken out: events keep only an exception's type, and a status's description
    is the contract's reason (or the gRPC code's name), never the status's message."""
    from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor

    def redacted(span: ReadableSpan) -> ReadableSpan:
        attributes = span.attributes or {}
        events = [
            Event(e.name, {k: v for k, v in (e.attributes or {}).items() if k in _EVENT_KEPT}, e.timestamp)
            for e in span.events
        ]
        status = span.status
        if status.description:
            said = attributes.get(_PREFIX + "error.reason") or _code_name(
                attributes.get("rpc.grpc.status_code")
            )
            status = Status(status.status_code, str(said) if said else None)
        return ReadableSpan(
            name=span.name,
            context=span.context,
            parent=span.parent,
            resource=span.resource,
            attributes=attributes,
            events=events,
            links=span.links,
            kind=span.kind,
            status=status,
            start_time=span.start_time,
            end_time=span.end_time,
            instrumentation_scope=span.instrumentation_scope,
        )

    class Redacting(SpanProcessor):
        def on_start(self, span: Any, parent_context: Any = None) -> None:
            inner.on_start(span, parent_context)

        def on_end(self, span: ReadableSpan) -> None:
            inner.on_end(redacted(span))

        def shutdown(self) -> None:
            inner.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return inner.force_flush(timeout_millis)

    return Redacting()


def _code_name(value: object) -> str:
    for code in grpc.StatusCode:
        if code.value[0] == value:
            return str(code.name)
    return ""


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def _exporter_names() -> list[str]:
    given = os.environ.get("OTEL_TRACES_EXPORTER", "")
    names = [n.strip().lower() for n in given.split(",") if n.strip()]
    if not given.strip() and (
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    ):
        names = ["otlp"]  # an endpoint given is tracing asked for (the exporter's default is otlp)
    return [n for n in names if n != "none"]


def _exporter(name: str) -> SpanExporter:
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    if name == "console":
        return ConsoleSpanExporter(service_name=SERVICE_NAME)
    if name != "otlp":
        raise TracingConfigError(f"OTEL_TRACES_EXPORTER: {name!r} is not one of otlp, console, none")
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "grpc"
    )
    if protocol.strip().lower() != "grpc":
        raise TracingConfigError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL: {protocol!r}: this server exports OTLP over gRPC only (grpc)"
        )
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()  # its endpoint, headers, TLS and timeout from OTEL_EXPORTER_OTLP_*


def configure(replica_id: str) -> Tracing | None:
    """The tracer provider the OTEL_* variables ask for, installed; None (tracing off) unless
    OTEL_TRACES_EXPORTER names an exporter or an OTLP endpoint is set, or with OTEL_SDK_DISABLED.
    The sampler (OTEL_TRACES_SAMPLER, _ARG), the batching (OTEL_BSP_*), the resource
    (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES) are the SDK's, read from the same variables;
    the service is `agent-rewind` and the instance the replica's id unless they say otherwise."""
    if _true(os.environ.get("OTEL_SDK_DISABLED")):
        return None
    names = _exporter_names()
    if not names:
        return None
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    exporters = [_exporter(name) for name in names]
    # Ours (the SDK's would be a random instance id), then what the variables say over them.
    ours = Resource.create({"service.name": SERVICE_NAME, "service.instance.id": replica_id})
    provider = TracerProvider(resource=ours.merge(OTELResourceDetector().detect()))
    for exporter in exporters:
        provider.add_span_processor(redacting(BatchSpanProcessor(exporter)))
    install(provider)
    return Tracing(provider, tuple(names))
