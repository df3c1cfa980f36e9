"""Every RPC of the running server (a real process, the real CLI) fuzzed with hostile requests:
random fields of every type, ids that exist and ids that do not, raw bytes that are not a message
at all. Every call ends in a clean error with its ErrorInfo, or a right answer; never INTERNAL or
UNKNOWN; the server stays up. `make fuzz` runs at least 10,000 examples per property."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_rewind.api.v1 import (
    rewind_service_pb2,
    rewind_service_pb2_grpc,
    session_service_pb2,
    session_service_pb2_grpc,
)
from agent_rewind.testing.processes import cli_pids
from tests.hypothesis_profiles import FUZZING

# In `make test` each RPC gets a bounded number of examples; `make fuzz` runs the profile's 10,000.
PER_RPC = settings(max_examples=10_000 if FUZZING else 40)
CALL_TIMEOUT = 60


@dataclass
class Target:
    address: str
    channel: grpc.Channel
    sessions: session_service_pb2_grpc.SessionServiceStub
    rewinds: rewind_service_pb2_grpc.RewindServiceStub
    session_id: str
    point_ids: list[str]
    api_ids: list[str]
    calls: dict[str, int]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    state = tmp_path_factory.mktemp("fuzz") / "state"
    state.mkdir()
    log = state / "server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_REWIND_", "ANTHROPIC_"))}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "agent-rewind"), "serve", "--listen", "127.0.0.1:0",
             "--state-dir", str(state), "--model", "offline", "--log-format", "json", "--idle-timeout", "0",
             "--interrupt-timeout", "5"],
            stdout=out, stderr=out, env=env, start_new_session=True,
        )  # fmt: skip
    try:
        address = _serving(log, proc)
        channel = grpc.insecure_channel(address)
        sessions = session_service_pb2_grpc.SessionServiceStub(channel)
        rewinds = rewind_service_pb2_grpc.RewindServiceStub(channel)
        sid = sessions.CreateSession(session_service_pb2.CreateSessionRequest()).session_id
        point_ids, api_ids = [], []
        for text in ("write a.txt one", "edit a.txt one => two", "say three"):
            for event in sessions.Prompt(session_service_pb2.PromptRequest(session_id=sid, text=text)):
                if event.HasField("user_prompt") and not event.parent_tool_use_id:
                    point_ids.append(event.message_id)
                if event.HasField("assistant_message"):
                    api_ids.append(event.assistant_message.api_message_id)
        yield Target(address, channel, sessions, rewinds, sid, point_ids, api_ids, {})
        health = health_pb2_grpc.HealthStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest()).status == health_pb2.HealthCheckResponse.SERVING
        assert proc.poll() is None, "the server stayed up"
        channel.close()
        print(f"\nfuzzed calls per RPC: {json.dumps(dict(sorted(target_calls(channel).items())))}")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        for pid in cli_pids(config_dir=state / "claude"):
            os.kill(pid, signal.SIGKILL)


_CALLS: dict[str, int] = {}


def target_calls(_: object) -> dict[str, int]:
    return _CALLS


def _serving(log: Path, proc: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        for line in log.read_bytes().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("event") == "serving":
                return str(entry["address"])
        time.sleep(0.05)
    raise TimeoutError(log.read_text())


def _clean(rpc: str, call: Any) -> None:
    """Runs a call; any error must be a clean one: a status with its ErrorInfo, never INTERNAL."""
    _CALLS[rpc] = _CALLS.get(rpc, 0) + 1
    try:
        result = call()
        if hasattr(result, "__iter__") and not hasattr(result, "DESCRIPTOR"):
            for _ in result:
                pass
    except grpc.RpcError as err:
        code = err.code()  # type: ignore[attr-defined]
        assert code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), (rpc, err)
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return  # a long turn the fuzzer started; the server is checked alive at the end
        status = rpc_status.from_call(err)  # type: ignore[arg-type]
        assert status is not None, (rpc, code, err.details())  # type: ignore[attr-defined]
        infos = [d for d in status.details if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR)]
        assert infos, (rpc, code, err.details())  # type: ignore[attr-defined]


def _ids(target: Target, real: list[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from([*real, str(uuid.uuid4()), "", "msg_", "../../etc", "\x00", "a" * 5000]),
        st.text(max_size=80),
        st.uuids().map(str),
    )


JSON = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)
TEXT = st.one_of(
    st.text(max_size=300), st.sampled_from(["/cost", "/compact", " /clear", "say hi", "recall", "\x00"])
)


def _struct(value: dict[str, Any]) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(value)
    return out


@PER_RPC
@given(data=st.data())
def test_session_service_rpcs_answer_cleanly(target: Target, data: st.DataObject) -> None:
    sid = data.draw(_ids(target, [target.session_id]), "session_id")
    rpc = data.draw(
        st.sampled_from(
            [
                "CreateSession",
                "GetSession",
                "ListSessions",
                "Prompt",
                "Interrupt",
                "CloseSession",
                "ForkSession",
                "DeleteSession",
            ]
        )
    )
    s = target.sessions
    if rpc == "CreateSession":
        request = session_service_pb2.CreateSessionRequest(
            cwd=data.draw(st.one_of(st.text(max_size=60), st.sampled_from(["", ".", "..", "/", "/etc", "a/../../b"]))),
            session_id=data.draw(st.one_of(st.just(""), _ids(target, []))),
            options=_struct(data.draw(st.dictionaries(st.sampled_from(["model", "allowed_tools", "max_turns", "mcp_servers", "settings", "permission_mode", "thinking", "agents"]) | st.text(max_size=10), JSON, max_size=4))),
            request_id=data.draw(st.one_of(st.just(""), st.uuids().map(str), st.text(max_size=40))),
        )  # fmt: skip
        if data.draw(st.booleans()):
            request.workspace_snapshots = data.draw(st.booleans())
        _clean(rpc, lambda: s.CreateSession(request, timeout=CALL_TIMEOUT))
    elif rpc == "GetSession":
        _clean(
            rpc,
            lambda: s.GetSession(session_service_pb2.GetSessionRequest(session_id=sid), timeout=CALL_TIMEOUT),
        )
    elif rpc == "ListSessions":
        request = session_service_pb2.ListSessionsRequest(
            page_size=data.draw(st.integers(-(2**31), 2**31 - 1)), page_token=data.draw(st.text(max_size=100))
        )
        _clean(rpc, lambda: s.ListSessions(request, timeout=CALL_TIMEOUT))
    elif rpc == "Prompt":
        request = session_service_pb2.PromptRequest(
            session_id=sid,
            text=data.draw(TEXT),
            request_id=data.draw(st.one_of(st.just(""), st.uuids().map(str), st.text(max_size=20))),
        )
        _clean(rpc, lambda: s.Prompt(request, timeout=CALL_TIMEOUT))
    elif rpc == "Interrupt":
        _clean(
            rpc,
            lambda: s.Interrupt(session_service_pb2.InterruptRequest(session_id=sid), timeout=CALL_TIMEOUT),
        )
    elif rpc == "CloseSession":
        request = session_service_pb2.CloseSessionRequest(session_id=sid, force=data.draw(st.booleans()))
        _clean(rpc, lambda: s.CloseSession(request, timeout=CALL_TIMEOUT))
    elif rpc == "ForkSession":
        request = session_service_pb2.ForkSessionRequest(
            session_id=sid,
            message_id=data.draw(_ids(target, target.point_ids)),
            cwd=data.draw(st.text(max_size=30)),
        )
        _clean(rpc, lambda: s.ForkSession(request, timeout=CALL_TIMEOUT))
    else:
        # Deleting the fuzzed session itself would leave nothing to fuzz: only other ids.
        victim = sid if sid != target.session_id else str(uuid.uuid4())
        _clean(
            rpc,
            lambda: s.DeleteSession(
                session_service_pb2.DeleteSessionRequest(session_id=victim), timeout=CALL_TIMEOUT
            ),
        )


@PER_RPC
@given(data=st.data())
def test_rewind_service_rpcs_answer_cleanly(target: Target, data: st.DataObject) -> None:
    sid = data.draw(_ids(target, [target.session_id]), "session_id")
    r = target.rewinds
    rpc = data.draw(
        st.sampled_from(
            ["GetCapabilities", "ListRewindPoints", "DryRun", "Rewind", "UndoRewind", "WatchRewindEvents"]
        )
    )
    if rpc == "GetCapabilities":
        _clean(
            rpc, lambda: r.GetCapabilities(rewind_service_pb2.GetCapabilitiesRequest(), timeout=CALL_TIMEOUT)
        )
    elif rpc == "ListRewindPoints":
        request = rewind_service_pb2.ListRewindPointsRequest(
            session_id=sid,
            page_size=data.draw(st.integers(-(2**31), 2**31 - 1)),
            page_token=data.draw(st.text(max_size=100)),
        )
        _clean(rpc, lambda: r.ListRewindPoints(request, timeout=CALL_TIMEOUT))
    elif rpc in ("DryRun", "Rewind"):
        request = rewind_service_pb2.RewindRequest(
            session_id=sid,
            message_id=data.draw(_ids(target, target.point_ids + target.api_ids)),
            mode=data.draw(st.integers(-3, 7)),
            request_id=data.draw(st.one_of(st.just(""), st.uuids().map(str), st.text(max_size=20))),
            conflict_policy=data.draw(st.integers(-2, 6)),
            include_diff=data.draw(st.booleans()),
        )
        if data.draw(st.booleans()):
            request.expected_last_message_id = data.draw(_ids(target, target.point_ids))
        method = (
            r.DryRun if rpc == "DryRun" or data.draw(st.integers(0, 9)) > 0 else r.Rewind
        )  # rewinds now and then
        _clean(rpc, lambda: method(request, timeout=CALL_TIMEOUT))
    elif rpc == "UndoRewind":
        request = rewind_service_pb2.UndoRewindRequest(
            session_id=sid, rewind_id=data.draw(_ids(target, [])), validate_only=True
        )
        _clean(rpc, lambda: r.UndoRewind(request, timeout=CALL_TIMEOUT))
    else:
        request = rewind_service_pb2.WatchRewindEventsRequest(
            session_id=data.draw(st.one_of(st.just(""), _ids(target, [target.session_id])))
        )
        if data.draw(st.booleans()):
            request.after_cursor = data.draw(st.integers(0, 2**64 - 1))
        _clean(rpc, lambda: next(iter(r.WatchRewindEvents(request, timeout=2)), None))


METHODS = [
    ("/agent_rewind.v1.SessionService/" + m, m == "Prompt")
    for m in (
        "CreateSession",
        "GetSession",
        "ListSessions",
        "Prompt",
        "Interrupt",
        "CloseSession",
        "ForkSession",
        "DeleteSession",
    )
] + [
    ("/agent_rewind.v1.RewindService/" + m, m == "WatchRewindEvents")
    for m in ("GetCapabilities", "ListRewindPoints", "DryRun", "Rewind", "UndoRewind", "WatchRewindEvents")
]


@PER_RPC
@given(method=st.sampled_from(METHODS), payload=st.binary(max_size=300))
def test_bytes_that_are_no_valid_request_are_invalid_argument(
    target: Target, method: tuple[str, bool], payload: bytes
) -> None:
    name, streaming = method
    if name.endswith(("DeleteSession", "Rewind")):
        payload = b""  # a decodable payload could delete or rewind the fuzzed session; empty is refused
    call = target.channel.unary_stream(name) if streaming else target.channel.unary_unary(name)
    timeout = 2 if name.endswith("WatchRewindEvents") else CALL_TIMEOUT
    _clean(name.rsplit("/", 1)[1], lambda: call(payload, timeout=timeout))
