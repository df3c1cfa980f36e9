"""Behaviours a mutation audit of round 2 found no test would notice breaking (issue "Tests that
see"), through the real server. Each test names its audit item; each was seen to fail with the
bug put in (docs/reliability.md, "Mutation testing")."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import grpc
import pytest

from agent_rewind.api.v1 import rewind_service_pb2, session_pb2, session_service_pb2
from agent_rewind.testing.server_process import ServerProcess
from tests.integration.harness import (
    BOTH,
    CONVERSATION,
    FILES,
    error_info,
    prompt_id,
    read,
    replicas,
    through,
)
from tests.integration.test_auth import _access, _as
from tests.pgserver_fixture import PostgresServer

ALL = ["sessions.read", "sessions.write", "rewind", "rewind.preview", "events.read"]


@pytest.fixture
def database(postgres: PostgresServer) -> str:
    return postgres.url(postgres.create_database())


async def test_4_a_watch_of_another_principals_session_through_a_non_owner_is_session_not_found(
    tmp_path: Path, database: str
) -> None:
    access = _access(tmp_path / "access.json", {"alice": ALL, "bob": ALL}, {"alice": "arw_a", "bob": "arw_b"})
    async with replicas(tmp_path / "state", database, count=2, access_file=access) as (a, b):
        session = await _as(a, "arw_a").create()
        bob_through_b = _as(b, "arw_b")
        stream = bob_through_b.rewinds.WatchRewindEvents(
            rewind_service_pb2.WatchRewindEventsRequest(session_id=session.session_id)
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stream.read()
        assert error_info(err.value).reason == "SESSION_NOT_FOUND", "its existence does not show"
        # The owner, through the same replica, may.
        mine = _as(b, "arw_a").rewinds.WatchRewindEvents(
            rewind_service_pb2.WatchRewindEventsRequest(session_id=session.session_id)
        )
        assert (await mine.read()).HasField("caught_up")
        mine.cancel()


async def test_6_a_page_token_of_one_principal_is_refused_from_another(tmp_path: Path) -> None:
    access = _access(tmp_path / "access.json", {"alice": ALL, "bob": ALL}, {"alice": "arw_a", "bob": "arw_b"})
    from tests.integration.harness import serve

    async with serve(tmp_path / "state", access_file=access) as c:
        alice, bob = _as(c, "arw_a"), _as(c, "arw_b")
        for _ in range(2):
            await alice.create()
            await bob.create()
        page = await alice.sessions.ListSessions(session_service_pb2.ListSessionsRequest(page_size=1))
        assert page.next_page_token
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await bob.sessions.ListSessions(
                session_service_pb2.ListSessionsRequest(page_size=1, page_token=page.next_page_token)
            )
        assert error_info(err.value).reason == "INVALID_ARGUMENT"
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        more = await alice.sessions.ListSessions(
            session_service_pb2.ListSessionsRequest(page_size=1, page_token=page.next_page_token)
        )
        assert len(more.sessions) == 1, "the token still serves the principal it was issued to"


async def test_7_a_rewind_request_id_reused_with_another_mode_or_policy_is_refused(tmp_path: Path) -> None:
    from tests.integration.harness import serve

    async with serve(tmp_path, workspace_snapshots=True) as c:
        session = await c.create()
        sid = session.session_id
        await c.prompt(sid, "write a.txt one")
        second = prompt_id(await c.prompt(sid, "write a.txt two"))
        await c.prompt(sid, "write a.txt three")
        rid = str(uuid.uuid4())
        first = await c.rewind(sid, second, FILES, request_id=rid)
        assert read(Path(session.cwd) / "a.txt") == "one\n"
        assert await c.rewind(sid, second, FILES, request_id=rid) == first, "the same call: the first result"
        for changed in ({"mode": CONVERSATION}, {"mode": BOTH}, {"conflict_policy": 3}):
            request = rewind_service_pb2.RewindRequest(
                session_id=sid, message_id=second, mode=FILES, request_id=rid
            )
            for name, value in changed.items():
                setattr(request, name, value)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.rewinds.Rewind(request)
            assert error_info(err.value).reason == "REQUEST_ID_REUSED", changed
        assert [p.message_id for p in (await c.points(sid)).points][1] == second, "nothing else applied"


async def test_10_interrupt_through_a_replica_that_does_not_own_the_session_stops_the_turn(
    tmp_path: Path, database: str
) -> None:
    async with replicas(tmp_path, database, count=2) as (a, b):
        session = await a.create()
        sid = session.session_id
        call = a.sessions.Prompt(session_service_pb2.PromptRequest(session_id=sid, text="sleep 30\nsay late"))
        await call.read()  # the prompt is in: the turn runs on a
        await through(a, b).sessions.Interrupt(session_service_pb2.InterruptRequest(session_id=sid))
        events = []
        while (event := await call.read()) is not grpc.aio.EOF:
            events.append(event)
        assert events[-1].result.interrupted, "the owner's turn stopped, long before its 30 s"
        assert (await a.get(sid)).state == session_pb2.SESSION_STATE_IDLE


@pytest.mark.parametrize("fault", ["delete.recorded", "rewind.intent_recorded"])
async def test_11_12_a_takeover_finishes_what_the_dead_replica_left_half_done(
    tmp_path: Path, database: str, fault: str
) -> None:
    """11: a DeleteSession committed whose files are not erased yet; 12: a rewind whose intent is
    recorded but not applied. The replica dies right there (SIGKILL at the fault point, on shared
    storage); the replica that takes its sessions over finishes each before it serves them."""
    shared = tmp_path / "shared"
    common = [
        "--database-url",
        database,
        "--shared-storage",
        "--replica-lease",
        "3",
        "--state-dir",
        str(shared),
    ]
    dying = ServerProcess(tmp_path / "dying", args=[*common, "--replica-id", "dying"])
    living = ServerProcess(tmp_path / "living", args=[*common, "--replica-id", "living"])
    try:
        await dying.start(fault=fault, fault_scope="group")
        await living.start()
        assert dying.sessions is not None and dying.rewinds is not None
        session = await dying.sessions.CreateSession(session_service_pb2.CreateSessionRequest())
        sid, cwd = session.session_id, Path(session.cwd)
        ids = []
        for text in ("write a.txt one", "write a.txt two"):
            events = [
                e
                async for e in dying.sessions.Prompt(
                    session_service_pb2.PromptRequest(session_id=sid, text=text)
                )
            ]
            ids.append(prompt_id(events))
        with pytest.raises(grpc.aio.AioRpcError):  # the replica dies at the fault point
            if fault == "delete.recorded":
                await dying.sessions.DeleteSession(
                    session_service_pb2.DeleteSessionRequest(session_id=sid, delete_workspace=True)
                )
            else:
                await dying.rewinds.Rewind(
                    rewind_service_pb2.RewindRequest(session_id=sid, message_id=ids[1], mode=FILES)
                )
        assert dying.proc is not None
        await dying.proc.wait()
        assert living.sessions is not None
        deadline = asyncio.get_running_loop().time() + 60
        while True:  # the living replica takes over once the dead one's lease has run out
            try:
                got = await living.sessions.GetSession(session_service_pb2.GetSessionRequest(session_id=sid))
            except grpc.aio.AioRpcError as err:
                reason = error_info(err).reason
                if fault == "delete.recorded" and reason == "SESSION_NOT_FOUND" and not cwd.exists():
                    break  # 11: deleted, and its files erased by the replica that took over
                assert reason in ("REPLICA_UNAVAILABLE", "SESSION_NOT_FOUND"), reason
            else:
                if fault == "rewind.intent_recorded" and got.replica == "living":
                    assert read(cwd / "a.txt") == "one\n", "12: the rewind was finished, files and all"
                    break
            assert asyncio.get_running_loop().time() < deadline, "never taken over and finished"
            await asyncio.sleep(0.5)
        if fault == "delete.recorded":
            assert not list((shared / "claude" / "projects").glob(f"*/{sid}*"))
        else:
            assert living.rewinds is not None
            points = await living.rewinds.ListRewindPoints(
                rewind_service_pb2.ListRewindPointsRequest(session_id=sid)
            )
            assert [p.message_id for p in points.points] == ids, "a files rewind keeps the conversation"
    finally:
        await living.close()
        await dying.close()
