"""The client's streams over a grpc_testing channel: `watch` and `prompt` as users run them, with the
test sending each message when it chooses, cutting the stream midway with the status it chooses,
ending it early, and seeing on the server's end of the call the cancel of a Ctrl-C.

That a line is printed before the next message is even sent, and that a cancel reaches the call
itself (not a flag on a fake), are what a scripted real server cannot show.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from google.protobuf import timestamp_pb2
from google.rpc import code_pb2, status_pb2

from agent_rewind import cli
from agent_rewind.api.v1 import rewind_pb2, rewind_service_pb2, session_pb2
from agent_rewind.client import format_turn_event, format_watch_response
from tests.unit.client.wire import (
    AGENT_DIED,
    Background,
    Lines,
    fresh_channel,
    refusal,
    status_code,
    take,
    trailing,
    wait_cancelled,
    wire_client,
)

SID = "11111111-2222-3333-4444-555555555555"
TS = timestamp_pb2.Timestamp(seconds=1764457865)


def event(cursor: int) -> rewind_service_pb2.WatchRewindEventsResponse:
    return rewind_service_pb2.WatchRewindEventsResponse(
        event=rewind_pb2.RewindEvent(
            cursor=cursor,
            kind=rewind_pb2.REWIND_EVENT_KIND_REWOUND,
            session_id=SID,
            rewind_id=f"rewind-{cursor}",
            mode=rewind_pb2.REWIND_MODE_BOTH,
            occur_time=TS,
        )
    )


def caught_up(cursor: int) -> rewind_service_pb2.WatchRewindEventsResponse:
    return rewind_service_pb2.WatchRewindEventsResponse(caught_up=rewind_pb2.CaughtUp(cursor=cursor))


def line(response: rewind_service_pb2.WatchRewindEventsResponse) -> str:
    return format_watch_response(response)


def send_and_see(rpc: Any, out: Lines, *responses: Any) -> list[str]:
    """Sends each response only once the one before it is printed and flushed."""
    for response in responses:
        rpc.send_response(response)
        lines = out.wait_for(len(out.flushed) + 1)
    return lines


# --- watch -------------------------------------------------------------------------------------------

MIDWAY = [
    pytest.param(status_pb2.Status(code=code_pb2.UNAVAILABLE, message="connection reset"), id="reset"),
    pytest.param(
        status_pb2.Status(code=code_pb2.DEADLINE_EXCEEDED, message="Deadline Exceeded"), id="deadline"
    ),
    pytest.param(refusal(code_pb2.INTERNAL, "INTERNAL", "unexpected"), id="INTERNAL"),
    pytest.param(refusal(code_pb2.UNAVAILABLE, "SHUTTING_DOWN", "draining"), id="SHUTTING_DOWN"),
]


@pytest.mark.parametrize("status", MIDWAY)
def test_a_watch_failing_midway_keeps_its_lines_says_where_to_resume_and_does_not_reconnect(
    status: status_pb2.Status, cli_over: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    channel = fresh_channel()
    running, out = cli_over(channel, ["watch", SID, "--after", "0"])
    _, request, rpc = take(channel, "RewindService.WatchRewindEvents")
    assert (request.session_id, request.HasField("after_cursor"), request.after_cursor) == (SID, True, 0)
    printed = send_and_see(rpc, out, event(1), caught_up(1), event(2))
    assert printed == [line(event(1)), line(caught_up(1)), line(event(2))]
    rpc.terminate(trailing(status), status_code(status.code), status.message)
    assert running.result() == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("error: ")
    assert err[-1] == "hint: resume with --after 2 (the last cursor printed)"
    assert out.flushed == printed

    # The next watch the server sees is this one, not a reconnect of the failed one.
    mine = wire_client(channel).watch_events(after_cursor=999)
    _, request, rpc = take(channel, "RewindService.WatchRewindEvents")
    assert request.after_cursor == 999, "the CLI watched again on its own"
    mine.cancel()


def test_a_watch_too_slow_resumes_from_the_servers_last_cursor_not_the_last_printed(
    cli_over: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """SUBSCRIBER_TOO_SLOW says in its metadata the last cursor the server sent; the hint trusts
    that over the last one printed (the same here unless events were in flight)."""
    channel = fresh_channel()
    running, out = cli_over(channel, ["watch"])
    _, request, rpc = take(channel, "RewindService.WatchRewindEvents")
    assert not request.HasField("after_cursor")
    send_and_see(rpc, out, caught_up(4), event(5))
    status = refusal(code_pb2.RESOURCE_EXHAUSTED, "SUBSCRIBER_TOO_SLOW", "too slow", last_cursor="6")
    rpc.terminate(trailing(status), grpc.StatusCode.RESOURCE_EXHAUSTED, status.message)
    assert running.result() == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "error: RESOURCE_EXHAUSTED SUBSCRIBER_TOO_SLOW: too slow"
    assert err[-1] == "hint: resume with --after 6 (the last cursor sent): the events after it are replayed"


def test_a_watch_the_server_ends_early_exits_0_saying_where_to_resume(
    cli_over: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    channel = fresh_channel()
    running, out = cli_over(channel, ["watch", "--after", "2"])
    _, _, rpc = take(channel, "RewindService.WatchRewindEvents")
    send_and_see(rpc, out, event(3))
    rpc.terminate((), grpc.StatusCode.OK, "")
    assert running.result() == 0
    assert out.flushed == [line(event(3))]
    assert capsys.readouterr().err.splitlines() == ["the server ended the watch; resume with --after 3"]


def test_ctrl_c_in_a_watch_cancels_the_call_itself_and_says_where_to_resume(
    cli_over: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Ctrl-C while the second line prints (its write blocked on a full pipe, `watch | slow-reader`):
    the server's end of the call sees it CANCELLED, exit 130, and the cursor to resume after is the
    first event's, whose line is out, not the second's, whose line never was (resuming after it
    would skip that event). Without `stream.cancel()` in the CLI the call stays open and
    wait_cancelled fails."""
    channel = fresh_channel()
    running, out = cli_over(channel, ["watch", "--after", "0"], interrupt_at=2)
    _, _, rpc = take(channel, "RewindService.WatchRewindEvents")
    send_and_see(rpc, out, event(1))
    rpc.send_response(event(2))
    assert running.result() == cli.EXIT_INTERRUPTED
    wait_cancelled(rpc)
    assert out.flushed == [line(event(1))]
    assert capsys.readouterr().err.splitlines() == ["stopped watching; resume with --after 1"]


def test_cancel_on_a_watch_stream_ends_the_call_and_its_iteration() -> None:
    """WatchStream.cancel() from another thread while the reader waits: the reader's iteration ends
    with CANCELLED and the server's end of the call is cancelled."""
    channel = fresh_channel()
    stream = wire_client(channel).watch_events(SID)
    _, _, rpc = take(channel, "RewindService.WatchRewindEvents")
    rpc.send_response(caught_up(0))
    seen: list[Any] = []

    def read() -> None:
        for response in stream:
            seen.append(response)

    reader = Background(read)
    stream.cancel()
    wait_cancelled(rpc)
    error = reader.error()
    assert isinstance(error, grpc.RpcError) and error.code() == grpc.StatusCode.CANCELLED
    assert seen in ([], [caught_up(0)])  # the one sent may or may not have been read before the cancel


# --- prompt ------------------------------------------------------------------------------------------


def prompt_events() -> list[session_pb2.TurnEvent]:
    return [
        session_pb2.TurnEvent(
            session_id=SID, message_id="u-1", user_prompt=session_pb2.UserPrompt(text="hi")
        ),
        session_pb2.TurnEvent(
            session_id=SID, message_id="msg_1", assistant_message=session_pb2.AssistantMessage(text="hello")
        ),
    ]


def turn_lines(events: list[session_pb2.TurnEvent]) -> list[str]:
    return [text for e in events for text in format_turn_event(e)]


def test_a_turn_failing_midway_keeps_what_was_printed_and_renders_the_agents_failure(
    cli_over: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    channel = fresh_channel()
    running, out = cli_over(channel, ["prompt", SID, "hi", "--request-id", "rq-1"])
    _, request, rpc = take(channel, "SessionService.Prompt")
    assert (request.session_id, request.text, request.request_id) == (SID, "hi", "rq-1")
    events = prompt_events()
    for e in events:
        rpc.send_response(e)
        out.wait_for(len(turn_lines(events[: events.index(e) + 1])))
    status = AGENT_DIED
    rpc.terminate(trailing(status), grpc.StatusCode.UNAVAILABLE, status.message)
    assert running.result() == 1
    assert out.flushed == turn_lines(events)
    assert capsys.readouterr().err.splitlines() == [
        "error: UNAVAILABLE AGENT_UNAVAILABLE: the Claude Code process died",
        "  retry after 1s",
        "hint: retry: the next call resumes the session in a new process; the unknown-tools case needs the "
        "operator (move the SDK pin back, or teach `sessions/tools.py` the tool)",
    ]


def test_a_turn_whose_stream_ends_without_a_result_is_an_error(
    cli_over: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    channel = fresh_channel()
    running, out = cli_over(channel, ["prompt", SID, "hi"])
    _, _, rpc = take(channel, "SessionService.Prompt")
    rpc.send_response(prompt_events()[0])
    rpc.terminate((), grpc.StatusCode.OK, "")
    assert running.result() == 1
    assert out.flushed == turn_lines(prompt_events()[:1])
    assert capsys.readouterr().err.splitlines() == ["error: the turn's stream ended without a result"]


def test_ctrl_c_in_a_turn_cancels_the_call_and_says_the_turn_runs_on(
    cli_over: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    channel = fresh_channel()
    events = prompt_events()
    first = turn_lines(events[:1])
    running, out = cli_over(channel, ["prompt", SID, "hi"], interrupt_at=len(first) + 1)
    _, _, rpc = take(channel, "SessionService.Prompt")
    rpc.send_response(events[0])
    out.wait_for(len(first))
    rpc.send_response(events[1])
    assert running.result() == cli.EXIT_INTERRUPTED
    wait_cancelled(rpc)
    assert out.flushed == first
    err = capsys.readouterr().err
    assert err.startswith("stopped listening; the turn runs on to its end on the server")
    assert f"session interrupt {SID}" in err
