"""The client over a `grpc_testing` channel: the test plays the server one step at a time.

`grpc_testing.channel` is a synchronous `grpc.Channel` whose calls wait until the test takes them
(`take_unary_unary`, `take_unary_stream`) and answers: a response, a status with any trailing
metadata, a stream cut at the message the test chooses. That is what a real server does not do on
demand. The client blocks in its call, so it runs in a background thread (`Background`) while the
test, in the test's thread, plays the server. See tests/README.md for what this channel cannot serve.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import grpc
import grpc_testing
from google.protobuf import any_pb2, duration_pb2, message
from google.rpc import code_pb2, error_details_pb2, status_pb2

from agent_rewind import cli
from agent_rewind.api.v1 import rewind_service_pb2, session_service_pb2
from agent_rewind.client import Client

REWINDS = rewind_service_pb2.DESCRIPTOR.services_by_name["RewindService"]
SESSIONS = session_service_pb2.DESCRIPTOR.services_by_name["SessionService"]
DOMAIN = "agent-rewind.v1"
DETAILS_KEY = "grpc-status-details-bin"
# Only a guard against a test that waits forever (a call the client never made); never a measure.
HANG = 30.0

T = TypeVar("T")


def method(name: str) -> Any:
    """The descriptor of `Service.Method` (e.g. `RewindService.Rewind`), as take_* wants it."""
    service, rpc = name.split(".")
    return {"RewindService": REWINDS, "SessionService": SESSIONS}[service].methods_by_name[rpc]


def fresh_channel() -> Any:
    return grpc_testing.channel([REWINDS, SESSIONS], grpc_testing.strict_real_time())


def wire_client(channel: Any) -> Client:
    """A Client whose calls go to `channel` (no token: see tests/README.md)."""
    return Client("wire.test:443", channel=channel)


class Background(Generic[T]):
    """`fn()` run in a daemon thread; `result()` returns what it returned or raises what it raised."""

    def __init__(self, fn: Callable[[], T]) -> None:
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], T]) -> None:
        try:
            self._value = fn()
        except BaseException as error:  # handed to the test's thread by result()
            self._error = error

    def result(self) -> T:
        self._thread.join(HANG)
        assert not self._thread.is_alive(), "the client is still waiting: did the test answer its call?"
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]

    def error(self) -> BaseException:
        """What `fn` raised (the test fails if it returned)."""
        try:
            value = self.result()
        except BaseException as error:
            return error
        raise AssertionError(f"the call returned {value!r} instead of failing")


def take(channel: Any, name: str) -> tuple[dict[str, str], Any, Any]:
    """The next call of `name` the client made: (its metadata, its request, the server's end of it).
    Unary or server-streaming, as the method is."""
    descriptor = method(name)
    take_call = channel.take_unary_stream if descriptor.server_streaming else channel.take_unary_unary
    taken = Background(lambda: take_call(descriptor))
    metadata, request, rpc = taken.result()
    return dict(metadata), request, rpc


def wait_cancelled(rpc: Any) -> None:
    """Returns once the client has cancelled the call `rpc` is the server's end of."""
    Background(rpc.cancelled).result()


def packed(detail: message.Message) -> any_pb2.Any:
    box = any_pb2.Any()
    box.Pack(detail)
    return box


def refusal(code: int, reason: str, message: str, **metadata: str) -> status_pb2.Status:
    """A status as the service's errors module builds it: code, message, one ErrorInfo."""
    info = error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN, metadata=metadata)
    return status_pb2.Status(code=code, message=message, details=[packed(info)])


# The service's answer when the Claude Code process died: UNAVAILABLE, AGENT_UNAVAILABLE, a RetryInfo.
AGENT_DIED = status_pb2.Status(
    code=code_pb2.UNAVAILABLE,
    message="the Claude Code process died",
    details=[
        packed(error_details_pb2.ErrorInfo(reason="AGENT_UNAVAILABLE", domain=DOMAIN)),
        packed(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=1))),
    ],
)


def trailing(status: status_pb2.Status) -> tuple[tuple[str, bytes], ...]:
    """Trailing metadata carrying `status` as the service sends it (grpc-status-details-bin)."""
    return ((DETAILS_KEY, status.SerializeToString()),)


def status_code(code: int) -> grpc.StatusCode:
    """`code_pb2.NOT_FOUND` -> `grpc.StatusCode.NOT_FOUND`."""
    return next(c for c in grpc.StatusCode if c.value[0] == code)


@dataclass
class Lines:
    """A stdout that remembers its flushed lines and lets the test wait for the n-th one: the proof
    that a line was out before the server sent the next message."""

    written: str = ""
    flushed: list[str] = field(default_factory=list)
    # Raised from the write of line number `interrupt_at` (1-based): a Ctrl-C while printing it.
    interrupt_at: int | None = None
    _lines: int = 0  # lines written, flushed or not
    _changed: threading.Condition = field(default_factory=threading.Condition)

    def write(self, text: str) -> int:
        with self._changed:
            self.written += text
            self._lines += text.count("\n")
            if self.interrupt_at is not None and self._lines >= self.interrupt_at:
                raise KeyboardInterrupt
        return len(text)

    def flush(self) -> None:
        with self._changed:
            done, _, self.written = self.written.rpartition("\n")
            if done:
                self.flushed.extend(done.split("\n"))
            self._changed.notify_all()

    def wait_for(self, count: int) -> list[str]:
        """The flushed lines, once there are at least `count` of them."""
        with self._changed:
            assert self._changed.wait_for(lambda: len(self.flushed) >= count, HANG), (
                f"waited for {count} flushed lines, have {self.flushed!r}"
            )
            return list(self.flushed)


def send_all(rpc: Any, responses: Iterable[message.Message]) -> None:
    for response in responses:
        rpc.send_response(response)


def cli_over(monkeypatch: Any) -> Callable[..., tuple[Background[int], Lines]]:
    """For a fixture: `run(channel, argv, interrupt_at=None)` -> (Background of main's exit code, its
    stdout): the `agent-rewind` command run as users run it, its client's calls going to `channel`."""

    def run(channel: Any, argv: list[str], interrupt_at: int | None = None) -> tuple[Background[int], Lines]:
        monkeypatch.setattr(cli, "Client", lambda server, **kw: Client(server, channel=channel, **kw))
        out = Lines(interrupt_at=interrupt_at)
        monkeypatch.setattr(sys, "stdout", out)
        return Background(lambda: cli.main(["--server", "wire.test:443", *argv])), out

    return run
