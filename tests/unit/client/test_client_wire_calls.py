"""Unary calls of the client over a grpc_testing channel: what it retries (nothing), the request ids
that make a caller's own retry safe, a deadline that expired, and the decoding of every error the
contract names, of malformed details and of a reason it does not know.

The test plays the server (wire.py): it answers each call with exactly the status and trailing
metadata it wants, which a real server gives only when it is driven into that state.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from google.protobuf import empty_pb2, struct_pb2
from google.rpc import code_pb2, status_pb2

from agent_rewind.api.v1 import rewind_pb2, session_pb2, session_service_pb2
from agent_rewind.client import Client, error_info, render_rpc_error, status_from_error
from tests.contract import error_table
from tests.unit.client.wire import (
    AGENT_DIED,
    DOMAIN,
    Background,
    fresh_channel,
    packed,
    refusal,
    status_code,
    take,
    trailing,
    wire_client,
)

if TYPE_CHECKING:
    from tests.unit.client.conftest import Serve

SID = "11111111-2222-3333-4444-555555555555"
MSG = "3c95eabe-c1fa-4ea8-afec-9a9bc607042c"
YEAR = 365 * 24 * 3600.0


def fail(rpc: Any, status: status_pb2.Status) -> None:
    """The server's end of a unary call answers with `status`, as the service's errors module does."""
    rpc.terminate(None, trailing(status), status_code(status.code), status.message)


def rewind_of(client: Client, request_id: str) -> Background[rewind_pb2.RewindResult]:
    return Background(lambda: client.rewind(SID, MSG, rewind_pb2.REWIND_MODE_BOTH, request_id=request_id))


# --- retries ---------------------------------------------------------------------------------------

# Every status a call can end with that someone might call transient, with the details the service
# sends with it: the client hands each to its caller at the first answer.
TRANSIENT = [
    pytest.param(
        status_pb2.Status(code=code_pb2.UNAVAILABLE, message="connection refused"), id="UNAVAILABLE"
    ),
    pytest.param(AGENT_DIED, id="AGENT_UNAVAILABLE+RetryInfo"),
    pytest.param(refusal(code_pb2.UNAVAILABLE, "SHUTTING_DOWN", "draining"), id="SHUTTING_DOWN"),
    pytest.param(
        refusal(code_pb2.UNAVAILABLE, "REPLICA_UNAVAILABLE", "owner down", replica="r2"),
        id="REPLICA_UNAVAILABLE",
    ),
    pytest.param(
        refusal(code_pb2.RESOURCE_EXHAUSTED, "LIVE_SESSIONS_EXHAUSTED", "full", max_live_sessions="4"),
        id="LIVE_SESSIONS_EXHAUSTED",
    ),
    pytest.param(refusal(code_pb2.ABORTED, "REWIND_CONFLICT", "stale", last_message_id=MSG), id="ABORTED"),
    pytest.param(
        status_pb2.Status(code=code_pb2.DEADLINE_EXCEEDED, message="Deadline Exceeded"), id="DEADLINE"
    ),
    pytest.param(refusal(code_pb2.INTERNAL, "INTERNAL", "unexpected"), id="INTERNAL"),
]


@pytest.mark.parametrize("status", TRANSIENT)
def test_the_client_retries_no_status_and_raises_it_at_the_first_answer(status: status_pb2.Status) -> None:
    """A Rewind that failed with a retryable status is not sent again by the client: the next Rewind
    the server sees is the caller's next one. (Retrying is the caller's call, with its request id.)"""
    channel = fresh_channel()
    client = wire_client(channel)
    first = rewind_of(client, "first")
    _, request, rpc = take(channel, "RewindService.Rewind")
    assert request.request_id == "first"
    fail(rpc, status)
    error = first.error()
    assert isinstance(error, grpc.RpcError)
    assert error.code() == status_code(status.code)

    second = rewind_of(client, "second")
    _, request, rpc = take(channel, "RewindService.Rewind")
    assert request.request_id == "second", "the client sent the failed Rewind again"
    rpc.terminate(rewind_pb2.RewindResult(rewind_id="r2"), (), grpc.StatusCode.OK, "")
    assert second.result().rewind_id == "r2"


def test_a_failed_page_fails_the_whole_listing_and_fetches_no_further_page() -> None:
    """list_all_sessions over pages: page 1 arrives, page 2 fails UNAVAILABLE. The call raises (no
    half listing handed back as if complete) and does not ask for page 2 again."""
    channel = fresh_channel()
    client = wire_client(channel)
    listing = Background(lambda: client.list_all_sessions(page_size=1))
    _, request, rpc = take(channel, "SessionService.ListSessions")
    assert (request.page_size, request.page_token) == (1, "")
    page = session_service_pb2.ListSessionsResponse(
        sessions=[session_pb2.Session(session_id="s1")], next_page_token="p2"
    )
    rpc.terminate(page, (), grpc.StatusCode.OK, "")
    _, request, rpc = take(channel, "SessionService.ListSessions")
    assert (request.page_size, request.page_token) == (1, "p2")
    fail(rpc, status_pb2.Status(code=code_pb2.UNAVAILABLE, message="connection reset"))
    error = listing.error()
    assert isinstance(error, grpc.RpcError) and error.code() == grpc.StatusCode.UNAVAILABLE

    marker = Background(lambda: client.list_sessions(page_token="marker"))
    _, request, rpc = take(channel, "SessionService.ListSessions")
    assert request.page_token == "marker", "the client asked for a page again after it failed"
    rpc.terminate(session_service_pb2.ListSessionsResponse(), (), grpc.StatusCode.OK, "")
    marker.result()


# --- the request ids that make a caller's retry safe -------------------------------------------------

# (RPC, a call that gives no request id, a call that gives "given-id") for each call that makes one.
MINTED = [
    pytest.param(
        "SessionService.Prompt",
        lambda c: list(c.prompt(SID, "hi")),
        lambda c: list(c.prompt(SID, "hi", request_id="given-id")),
        id="Prompt",
    ),
    pytest.param(
        "SessionService.ForkSession",
        lambda c: c.fork_session(SID),
        lambda c: c.fork_session(SID, request_id="given-id"),
        id="ForkSession",
    ),
    pytest.param(
        "SessionService.DeleteSession",
        lambda c: c.delete_session(SID),
        lambda c: c.delete_session(SID, request_id="given-id"),
        id="DeleteSession",
    ),
]


def _answer_ok(rpc: Any, name: str) -> None:
    if name == "SessionService.Prompt":
        rpc.terminate((), grpc.StatusCode.OK, "")
    elif name == "SessionService.DeleteSession":
        rpc.terminate(empty_pb2.Empty(), (), grpc.StatusCode.OK, "")
    else:
        rpc.terminate(session_pb2.Session(session_id="s2"), (), grpc.StatusCode.OK, "")


@pytest.mark.parametrize(("name", "bare", "given"), MINTED)
def test_calls_that_change_state_carry_a_fresh_request_id_or_the_one_given(
    name: str, bare: Any, given: Any
) -> None:
    """Without an id each call mints a new UUID (never an empty one, which the server could not
    deduplicate); the id a caller gives is sent as is, on every retry of it."""
    channel = fresh_channel()
    client = wire_client(channel)
    seen = []
    for call in (bare, bare, given, given):
        running = Background(lambda call=call: call(client))
        _, request, rpc = take(channel, name)
        seen.append(request.request_id)
        _answer_ok(rpc, name)
        running.result()
    minted_a, minted_b, given_a, given_b = seen
    assert uuid.UUID(minted_a) and uuid.UUID(minted_b) and minted_a != minted_b
    assert given_a == given_b == "given-id"


def test_rewind_and_undo_send_the_request_id_given_and_none_of_their_own() -> None:
    """The contract makes RewindRequest.request_id optional: the client sends what the caller (the
    CLI's --request-id) gave, and mints none, so a retry is deduplicated only with an id given."""
    channel = fresh_channel()
    client = wire_client(channel)
    calls = [
        ("RewindService.Rewind", lambda: client.rewind(SID, MSG, rewind_pb2.REWIND_MODE_FILES)),
        (
            "RewindService.Rewind",
            lambda: client.rewind(SID, MSG, rewind_pb2.REWIND_MODE_FILES, request_id="r"),
        ),
        ("RewindService.UndoRewind", lambda: client.undo(SID, "rw1")),
        ("RewindService.UndoRewind", lambda: client.undo(SID, "rw1", request_id="u")),
    ]
    seen = []
    for name, call in calls:
        running = Background(call)
        _, request, rpc = take(channel, name)
        seen.append(request.request_id)
        rpc.terminate(rewind_pb2.RewindResult(), (), grpc.StatusCode.OK, "")
        running.result()
    assert seen == ["", "r", "", "u"]


# --- deadlines ----------------------------------------------------------------------------------------


def test_api_calls_carry_no_deadline(serve: Serve) -> None:
    """The client sets no deadline on the API's calls (a Rewind waits for its files; a Prompt and a
    watch stream for as long as they run). grpc_testing drops a call's timeout, so this one is seen by
    a real in-process server: on its side, time_remaining() is gRPC's "infinite" (about 9.2e18 seconds). An added `timeout=` fails it."""
    address, recorder = serve()
    with Client(address) as client:
        client.capabilities()
        client.list_sessions()
        client.rewind(SID, MSG, rewind_pb2.REWIND_MODE_FILES)
        list(client.prompt(SID, "hi"))
    assert [c.method for c in recorder.calls] == ["GetCapabilities", "ListSessions", "Rewind", "Prompt"]
    # A year is far more than any deadline a client would set.
    assert all(c.time_remaining is not None and c.time_remaining > YEAR for c in recorder.calls), [
        c.time_remaining for c in recorder.calls
    ]


def test_a_deadline_that_expired_is_one_error_line_and_exit_1(
    cli_over: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """DEADLINE_EXCEEDED (a deadline a proxy or the server's own bound set) comes back as the
    status, with no details: the CLI says so on one line, prints nothing on stdout, exits 1."""
    channel = fresh_channel()
    running, out = cli_over(channel, ["rewind", SID, MSG, "--mode", "both"])
    _, request, rpc = take(channel, "RewindService.Rewind")
    assert (request.session_id, request.message_id) == (SID, MSG)
    rpc.terminate(None, (), grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
    assert running.result() == 1
    assert out.flushed == [] and out.written == ""
    assert capsys.readouterr().err.splitlines() == ["error: DEADLINE_EXCEEDED: Deadline Exceeded"]


# --- error decoding --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("reason", "status"), sorted(error_table().items()))
def test_every_reason_of_the_contract_is_decoded_from_the_wire(
    reason: str, status: str, cli_over: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each row of API.md's Errors table, sent as the service sends it (a google.rpc.Status with an
    ErrorInfo in grpc-status-details-bin): the raised error's code is the row's status, the decoded
    ErrorInfo its reason, domain and metadata, and the CLI's line names both."""
    code = code_pb2.Code.Value(status)
    sent = refusal(code, reason, "the service's message", some_key="some value")
    channel = fresh_channel()
    client = wire_client(channel)
    call = Background(lambda: client.get_session(SID))
    _, _, rpc = take(channel, "SessionService.GetSession")
    fail(rpc, sent)
    error = call.error()
    assert isinstance(error, grpc.RpcError) and error.code() == status_code(code)
    decoded = status_from_error(error)
    info = error_info(decoded)
    assert decoded.code == code and decoded.message == "the service's message"
    assert info is not None
    assert (info.reason, info.domain, dict(info.metadata)) == (reason, DOMAIN, {"some_key": "some value"})

    running, _ = cli_over(channel, ["session", "show", SID])
    _, _, rpc = take(channel, "SessionService.GetSession")
    fail(rpc, sent)
    assert running.result() == 1
    lines = capsys.readouterr().err.splitlines()
    if status in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
        said = "" if reason == status else f" {reason}"
        assert lines[0].startswith(f"error: {status}{said}: the service's message; ")
    else:
        assert lines[0] == f"error: {status} {reason}: the service's message"
        assert "  some_key: some value" in lines


def _get_session_fails_with(trailing_metadata: Any, code: grpc.StatusCode, details: str) -> grpc.RpcError:
    channel = fresh_channel()
    client = wire_client(channel)
    call = Background(lambda: client.get_session(SID))
    _, _, rpc = take(channel, "SessionService.GetSession")
    rpc.terminate(None, trailing_metadata, code, details)
    error = call.error()
    assert isinstance(error, grpc.RpcError)
    return error


@pytest.mark.parametrize(
    "details_bin",
    [
        pytest.param(b"\xff\xfe not a Status", id="undecodable bytes"),
        pytest.param(b"", id="empty"),
        pytest.param(status_pb2.Status(code=code_pb2.NOT_FOUND).SerializeToString()[:1], id="truncated"),
    ],
)
def test_malformed_details_fall_back_to_the_calls_code_and_message(details_bin: bytes) -> None:
    error = _get_session_fails_with(
        (("grpc-status-details-bin", details_bin),), grpc.StatusCode.NOT_FOUND, "no such session"
    )
    decoded = status_from_error(error)
    assert (decoded.code, decoded.message, error_info(decoded)) == (
        code_pb2.NOT_FOUND,
        "no such session",
        None,
    )
    assert render_rpc_error(error) == ["error: NOT_FOUND: no such session"]


def test_details_without_an_error_info_show_the_status_alone() -> None:
    """A Status whose only detail is of a type the client does not know (a struct here)."""
    sent = status_pb2.Status(
        code=code_pb2.FAILED_PRECONDITION, message="odd", details=[packed(struct_pb2.Struct())]
    )
    error = _get_session_fails_with(trailing(sent), grpc.StatusCode.FAILED_PRECONDITION, "odd")
    assert error_info(status_from_error(error)) is None
    assert render_rpc_error(error) == ["error: FAILED_PRECONDITION: odd"]


def test_no_details_at_all_is_the_code_and_message() -> None:
    error = _get_session_fails_with((), grpc.StatusCode.INTERNAL, "boom")
    assert render_rpc_error(error) == ["error: INTERNAL: boom"]


def test_an_unknown_reason_is_shown_as_it_came_with_its_metadata_and_no_hint() -> None:
    """A reason a newer server added: said verbatim, its metadata listed, no guessed hint."""
    sent = refusal(code_pb2.FAILED_PRECONDITION, "SOMETHING_NEW", "a newer refusal", b_key="2", a_key="1")
    error = _get_session_fails_with(trailing(sent), grpc.StatusCode.FAILED_PRECONDITION, sent.message)
    assert render_rpc_error(error) == [
        "error: FAILED_PRECONDITION SOMETHING_NEW: a newer refusal",
        "  a_key: 1",
        "  b_key: 2",
    ]


def test_an_unavailable_service_is_told_apart_from_an_unreachable_one() -> None:
    """UNAVAILABLE with AGENT_UNAVAILABLE is the service's answer (its reason and retry delay shown);
    UNAVAILABLE without an ErrorInfo is the channel's own: one line, "cannot reach"."""
    agent = AGENT_DIED
    error = _get_session_fails_with(trailing(agent), grpc.StatusCode.UNAVAILABLE, agent.message)
    assert render_rpc_error(error, server="wire.test:443") == [
        "error: UNAVAILABLE AGENT_UNAVAILABLE: the Claude Code process died",
        "  retry after 1s",
        "hint: retry: the next call resumes the session in a new process; the unknown-tools case needs the "
        "operator (move the SDK pin back, or teach `sessions/tools.py` the tool)",
    ]
    error = _get_session_fails_with((), grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")
    (line,) = render_rpc_error(error, server="wire.test:443")
    assert line.startswith(
        "error: cannot reach agent-rewind at wire.test:443 (failed to connect to all addresses)"
    )
