"""`watch` without a server: its lines pinned character for character, the hints of a watch that
failed, and the WatchRewindEvents request the client sends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from google.protobuf import any_pb2, timestamp_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from agent_rewind.api.v1 import rewind_pb2, rewind_service_pb2
from agent_rewind.client import (
    Client,
    WatchStream,
    event_kind_name,
    format_caught_up,
    format_rewind_event,
    format_watch_response,
    render_status,
    to_json,
)

TS = timestamp_pb2.Timestamp(seconds=1764457865)  # 2025-11-29T23:11:05Z
SID = "11111111-2222-3333-4444-555555555555"
DOMAIN = "agent-rewind.v1"


def rewound(**fields: Any) -> rewind_pb2.RewindEvent:
    values: dict[str, Any] = {
        "cursor": 12,
        "kind": rewind_pb2.REWIND_EVENT_KIND_REWOUND,
        "session_id": SID,
        "rewind_id": "af243ac4-9920-4258-ab38-802d71f59d73",
        "message_id": "3c95eabe-c1fa-4ea8-afec-9a9bc607042c",
        "mode": rewind_pb2.REWIND_MODE_BOTH,
        "files": rewind_pb2.FilesRewindResult(
            can_rewind=True,
            requested=True,
            files_changed=["/w/notes.txt", "/w/extra.txt"],
            insertions=1,
            deletions=2,
        ),
        "messages_dropped": 10,
        "principal": "local",
        "occur_time": TS,
        "last_message_id": "fcacaab7-ac92-435d-86e4-2d6b2bb3067e",
        "conversation_changed": True,
    }
    values.update(fields)
    return rewind_pb2.RewindEvent(**values)


# --- lines --------------------------------------------------------------------------------------


def test_an_event_is_one_line_of_everything_a_reader_follows() -> None:
    assert format_rewind_event(rewound()) == (
        f"cursor 12 · 2025-11-29T23:11:05Z · REWOUND · session {SID} · "
        "rewind af243ac4-9920-4258-ab38-802d71f59d73 · mode both · "
        "message 3c95eabe-c1fa-4ea8-afec-9a9bc607042c · 2 files changed (+1 -2) · messages dropped: 10 · "
        "by local"
    )


def test_a_files_rewind_of_one_file_and_an_undo() -> None:
    files = rewind_pb2.FilesRewindResult(files_changed=["/w/a.txt"], insertions=0, deletions=1)
    line = format_rewind_event(rewound(mode=rewind_pb2.REWIND_MODE_FILES, files=files, messages_dropped=0))
    assert " · mode files · " in line and " · 1 file changed (+0 -1) · messages dropped: 0 · " in line
    undone = format_rewind_event(rewound(kind=rewind_pb2.REWIND_EVENT_KIND_UNDONE))
    assert undone.startswith("cursor 12 · 2025-11-29T23:11:05Z · UNDONE · session ")


def test_a_revert_narrowed_to_paths_says_its_scope_and_paths_after_the_mode() -> None:
    files = rewind_pb2.FilesRewindResult(files_changed=["src/a.py"], insertions=3, deletions=1)
    line = format_rewind_event(
        rewound(
            mode=rewind_pb2.REWIND_MODE_FILES,
            scope=rewind_pb2.REWIND_SCOPE_TURN,
            paths=["src", "docs/a b.md"],
            files=files,
            messages_dropped=0,
        )
    )
    assert " · mode files · scope turn · paths src, docs/a b.md · message 3c95eabe-" in line
    assert " · 1 file changed (+3 -1) · messages dropped: 0 · by local" in line


def test_a_rewind_since_the_point_says_no_scope_and_a_newer_scope_its_number() -> None:
    since = format_rewind_event(rewound(scope=rewind_pb2.REWIND_SCOPE_SINCE, paths=["a.txt"]))
    assert " · mode both · paths a.txt · message " in since and "scope" not in since
    assert format_rewind_event(rewound(scope=rewind_pb2.REWIND_SCOPE_SINCE)) == format_rewind_event(rewound())
    assert " · mode both · scope 7 · message " in format_rewind_event(rewound(scope=7))


def test_what_an_event_does_not_carry_is_a_dash() -> None:
    deleted = rewind_pb2.RewindEvent(
        cursor=3, kind=rewind_pb2.REWIND_EVENT_KIND_SESSION_DELETED, session_id=SID, occur_time=TS
    )
    # Its mode is unset: `-`, not `files` (which an unset mode means in a request).
    assert format_rewind_event(deleted) == (
        f"cursor 3 · 2025-11-29T23:11:05Z · SESSION_DELETED · session {SID} · rewind - · mode - · "
        "message - · 0 files changed (+0 -0) · messages dropped: 0 · by -"
    )
    assert format_rewind_event(rewind_pb2.RewindEvent()).startswith("cursor 0 · - · UNSPECIFIED · session -")


def test_event_kind_names() -> None:
    assert event_kind_name(rewind_pb2.REWIND_EVENT_KIND_REWOUND) == "REWOUND"
    assert event_kind_name(rewind_pb2.REWIND_EVENT_KIND_SESSION_DELETED) == "SESSION_DELETED"
    assert event_kind_name(99) == "KIND_99"  # type: ignore[arg-type]  # a newer server's kind


def test_caught_up_says_the_cursor_and_that_live_events_follow() -> None:
    assert format_caught_up(rewind_pb2.CaughtUp(cursor=12)) == "caught up at cursor 12; following live events"
    assert format_caught_up(rewind_pb2.CaughtUp()) == "caught up at cursor 0; following live events"


def test_a_response_prints_as_its_event_or_its_caught_up() -> None:
    response = rewind_service_pb2.WatchRewindEventsResponse
    assert format_watch_response(response(event=rewound())) == format_rewind_event(rewound())
    assert format_watch_response(response(caught_up=rewind_pb2.CaughtUp(cursor=4))) == (
        "caught up at cursor 4; following live events"
    )
    assert format_watch_response(response()) == "(a response this client does not know)"


def test_json_lines_are_one_compact_line_each() -> None:
    line = to_json(rewind_service_pb2.WatchRewindEventsResponse(event=rewound()), compact=True)
    assert "\n" not in line
    assert line.startswith('{"event": {"cursor": "12", ')


# --- hints of a failed watch ----------------------------------------------------------------------


def failed(code: int, reason: str, metadata: dict[str, str], message: str = "m") -> status_pb2.Status:
    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN, metadata=metadata))
    return status_pb2.Status(code=code, message=message, details=[detail])


def test_cursor_expired_says_to_resync_and_from_which_cursor_to_watch() -> None:
    lines = render_status(failed(code_pb2.OUT_OF_RANGE, "CURSOR_EXPIRED", {"oldest_cursor": "40"}))
    assert lines == [
        "error: OUT_OF_RANGE CURSOR_EXPIRED: m",
        "  oldest_cursor: 40",
        "hint: the events before cursor 40 are no longer kept and changes may have been missed: resync "
        "what you mirror (`agent-rewind points SESSION`), then watch again with --after 39 (or --after 0: "
        "from the oldest event kept)",
    ]
    # The last cursor printed changes nothing: the events after it are gone.
    assert (
        render_status(
            failed(code_pb2.OUT_OF_RANGE, "CURSOR_EXPIRED", {"oldest_cursor": "40"}), resume_after=7
        )[-1]
        == lines[-1]
    )


def test_cursor_expired_without_a_usable_oldest_cursor_says_after_0() -> None:
    for metadata in ({}, {"oldest_cursor": "soon"}, {"oldest_cursor": "-3"}):
        hint = render_status(failed(code_pb2.OUT_OF_RANGE, "CURSOR_EXPIRED", metadata))[-1]
        assert hint.endswith("then watch again with --after 0 (from the oldest event kept)"), hint


def test_subscriber_too_slow_says_to_resume_after_the_last_cursor_sent() -> None:
    status = failed(code_pb2.RESOURCE_EXHAUSTED, "SUBSCRIBER_TOO_SLOW", {"last_cursor": "8"})
    assert render_status(status, resume_after=6) == [
        "error: RESOURCE_EXHAUSTED SUBSCRIBER_TOO_SLOW: m",
        "  last_cursor: 8",
        "hint: resume with --after 8 (the last cursor sent): the events after it are replayed",
    ]
    bare = failed(code_pb2.RESOURCE_EXHAUSTED, "SUBSCRIBER_TOO_SLOW", {})
    assert render_status(bare, resume_after=6)[-1] == (
        "hint: resume with --after 6 (the last cursor sent): the events after it are replayed"
    )
    assert render_status(bare)[-1] == (
        "hint: read the events faster, and watch again with --after the last cursor received"
    )


def test_any_other_failure_of_a_watch_says_the_last_cursor_printed() -> None:
    shutting = failed(code_pb2.UNAVAILABLE, "SHUTTING_DOWN", {}, "the server is shutting down")
    assert render_status(shutting, resume_after=5) == [
        "error: UNAVAILABLE SHUTTING_DOWN: the server is shutting down",
        "hint: resume with --after 5 (the last cursor printed)",
    ]
    gone = status_pb2.Status(code=code_pb2.UNAVAILABLE, message="Socket closed")
    assert render_status(gone, server="h:1", resume_after=0)[1:] == [
        "hint: resume with --after 0 (the last cursor printed)"
    ]


def test_without_a_cursor_printed_other_errors_are_rendered_as_before() -> None:
    status = failed(code_pb2.NOT_FOUND, "SESSION_NOT_FOUND", {"session_id": "x"}, "session 'x' not found")
    assert render_status(status) == [
        "error: NOT_FOUND SESSION_NOT_FOUND: session 'x' not found",
        "  session_id: x",
        "hint: check the id; `ListSessions`",
    ]


# --- the request ----------------------------------------------------------------------------------


class FakeCall:
    def __init__(self, responses: list[Any]) -> None:
        self.responses = responses
        self.cancelled = False

    def __iter__(self) -> Iterator[Any]:
        return iter(self.responses)

    def cancel(self) -> None:
        self.cancelled = True


class FakeChannel:
    """Records each call's method and request; a streaming call answers with `responses`."""

    def __init__(self, responses: list[Any]) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.responses = responses
        self.last: FakeCall | None = None

    def _method(self, path: str, *args: Any, **kwargs: Any) -> Callable[..., Any]:
        def call(request: Any, **options: Any) -> FakeCall:
            self.calls.append((path, request))
            self.last = FakeCall(self.responses)
            return self.last

        return call

    unary_unary = unary_stream = stream_unary = stream_stream = _method

    def close(self) -> None:
        pass


def test_watch_events_sends_the_session_and_the_cursor_only_when_given() -> None:
    mark = rewind_service_pb2.WatchRewindEventsResponse(caught_up=rewind_pb2.CaughtUp(cursor=2))
    channel = FakeChannel([mark])
    with Client("127.0.0.1:1", channel=channel) as client:
        stream = client.watch_events()
        assert isinstance(stream, WatchStream)
        assert list(stream) == [mark]
        client.watch_events(SID, after_cursor=0)
        client.watch_events(after_cursor=12).cancel()
    paths = {path for path, _ in channel.calls}
    assert paths == {"/agent_rewind.v1.RewindService/WatchRewindEvents"}
    first, second, third = (request for _, request in channel.calls)
    assert first.session_id == "" and not first.HasField("after_cursor")
    assert second.session_id == SID and second.HasField("after_cursor") and second.after_cursor == 0
    assert third.after_cursor == 12
    assert channel.last is not None and channel.last.cancelled
