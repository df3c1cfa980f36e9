"""Three replicas on loopback, one PostgreSQL database (pgserver), real Claude Code processes:
any replica answers any call, forwarding it to the replica that owns the session."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from agent_rewind.api.v1 import rewind_pb2, rewind_service_pb2, session_pb2, session_service_pb2
from agent_rewind.server import start
from tests.integration.harness import (
    BOTH,
    FILES,
    Client,
    bad_request,
    error_info,
    prompt_id,
    read,
    replicas,
    through,
)
from tests.integration.harness import (
    test_config as config_of,
)
from tests.pgserver_fixture import PostgresServer


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def database(postgres: PostgresServer) -> str:
    """A database of the test's own."""
    return postgres.url(postgres.create_database())


async def _events(c: Client, after: int | None, count: int) -> list[rewind_pb2.RewindEvent]:
    request = rewind_service_pb2.WatchRewindEventsRequest()
    if after is not None:
        request.after_cursor = after
    found: list[rewind_pb2.RewindEvent] = []
    async with asyncio.timeout(30):
        async for item in c.rewinds.WatchRewindEvents(request):
            if item.HasField("event"):
                found.append(item.event)
                if len(found) == count:
                    return found
    return found


async def test_every_call_for_a_session_works_through_a_replica_that_does_not_own_it(
    tmp_path: Path, database: str
) -> None:
    async with replicas(tmp_path, database) as (a, b, c):
        session = await a.create()
        sid, cwd = session.session_id, Path(session.cwd)
        assert session.replica == "replica-0"
        via = through(a, b)
        ids = [prompt_id(await via.prompt(sid, f"write a.txt v{i}")) for i in range(3)]
        assert read(cwd / "a.txt") == "v2\n", "the turns ran on the owner, in its workspace"
        got = await via.get(sid)
        assert (got.session_id, got.replica, got.last_message_id != "") == (sid, "replica-0", True)
        assert [p.message_id for p in await via.all_points(sid)] == ids
        preview = await via.dry_run(sid, ids[1], FILES)
        assert preview.files.can_rewind and read(cwd / "a.txt") == "v2\n"
        watching = asyncio.create_task(_events(c, None, 2))  # a watcher on the third replica
        await asyncio.sleep(0.5)
        rewound = await via.rewind(sid, ids[1], BOTH)
        assert rewound.files.can_rewind and rewound.conversation.rewound
        assert read(cwd / "a.txt") == "v0\n"
        assert [p.message_id for p in (await via.points(sid)).points] == ids[:1]
        undone = await via.rewinds.UndoRewind(
            rewind_service_pb2.UndoRewindRequest(session_id=sid, rewind_id=rewound.rewind_id)
        )
        assert undone.rewind_id and read(cwd / "a.txt") == "v2\n"
        seen = await watching
        assert [(e.session_id, e.rewind_id) for e in seen] == [
            (sid, rewound.rewind_id),
            (sid, undone.rewind_id),
        ]
        # The owner's refusals come back as they were made: status, reason, metadata.
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await via.rewind(sid, str(uuid.uuid4()), FILES)
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        assert error_info(refused.value).reason == "MESSAGE_NOT_FOUND"
        with pytest.raises(grpc.aio.AioRpcError) as malformed:
            await via.rewind(sid, "not-a-message", FILES)
        assert malformed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert [v.field for v in bad_request(malformed.value).field_violations] == ["message_id"]
        fork = await via.sessions.ForkSession(session_service_pb2.ForkSessionRequest(session_id=sid))
        assert fork.replica == "replica-0" and read(Path(fork.cwd) / "a.txt") == "v2\n"
        closed = await via.sessions.CloseSession(session_service_pb2.CloseSessionRequest(session_id=sid))
        assert closed.state == session_pb2.SESSION_STATE_CLOSED
        await via.sessions.DeleteSession(session_service_pb2.DeleteSessionRequest(session_id=sid))
        with pytest.raises(grpc.aio.AioRpcError) as gone:
            await via.get(sid)
        assert error_info(gone.value).reason == "SESSION_NOT_FOUND"
        assert a.running is not None and sid not in a.running.registry.workers


async def _list(c: Client, page_size: int = 0) -> list[str]:
    """Every session id ListSessions gives, page after page (asserting no page repeats one)."""
    ids: list[str] = []
    token = ""
    while True:
        page = await c.sessions.ListSessions(
            session_service_pb2.ListSessionsRequest(page_size=page_size, page_token=token)
        )
        assert page_size == 0 or len(page.sessions) <= page_size
        ids.extend(s.session_id for s in page.sessions)
        token = page.next_page_token
        if not token:
            assert len(ids) == len(set(ids)), "a session listed twice"
            return ids


async def test_any_replica_lists_every_session_of_the_deployment_newest_first_in_pages(
    tmp_path: Path, database: str
) -> None:
    async with replicas(tmp_path, database) as clients:
        made = []
        for i in range(7):  # made on each replica in turn
            made.append((await clients[i % 3].create()).session_id)
        newest_first = list(reversed(made))
        for c in clients:
            assert await _list(c) == newest_first
            assert await _list(c, page_size=2) == newest_first, "pages across replicas"
        caps = await clients[1].rewinds.GetCapabilities(rewind_service_pb2.GetCapabilitiesRequest())
        assert caps.replicas == 3


async def test_least_loaded_placement_puts_a_new_session_on_the_replica_owning_fewest(
    tmp_path: Path, database: str
) -> None:
    async with replicas(tmp_path, database, placement="least-loaded") as (a, b, c):
        first = await a.create()
        assert first.replica == "replica-0", "a tie stays where the call arrived"
        placed = [(await a.create()).replica for _ in range(2)]
        assert sorted(placed) == ["replica-1", "replica-2"], "each went to a replica owning none"
        for session in await asyncio.gather(*(b.get(s) for s in [first.session_id])):
            assert session.replica == "replica-0"
        # The placed sessions run on their replicas (their workspaces are on those disks).
        others = [s for s in await _sessions(a) if s.replica != "replica-0"]
        for session in others:
            owner = {"replica-1": b, "replica-2": c}[session.replica]
            assert owner.running is not None and session.session_id in owner.running.registry.workers
            await a.prompt(session.session_id, "write placed.txt yes")
            assert read(Path(session.cwd) / "placed.txt") == "yes\n"


async def _sessions(c: Client) -> list[session_pb2.Session]:
    return list((await c.sessions.ListSessions(session_service_pb2.ListSessionsRequest())).sessions)


async def test_a_retried_create_or_delete_through_another_replica_answers_as_the_first_did(
    tmp_path: Path, database: str
) -> None:
    async with replicas(tmp_path, database) as (a, b, _):
        request_id = str(uuid.uuid4())
        first = await a.create(request_id=request_id)
        again = await b.create(request_id=request_id)
        assert (again.session_id, again.replica) == (first.session_id, "replica-0")
        assert b.running is not None and not b.running.registry.workers, "nothing made on the retry's replica"
        delete = session_service_pb2.DeleteSessionRequest(
            session_id=first.session_id, request_id=str(uuid.uuid4()), delete_workspace=True
        )
        await a.sessions.DeleteSession(delete)
        await b.sessions.DeleteSession(delete)  # answered Empty again, by the owner
        assert not Path(first.cwd).exists()


async def test_a_watch_of_one_session_is_served_by_a_replica_that_does_not_own_it(
    tmp_path: Path, database: str
) -> None:
    async with replicas(tmp_path, database) as (a, b, _):
        session = await a.create()
        sid = session.session_id
        ids = [prompt_id(await a.prompt(sid, f"write a.txt v{i}")) for i in range(2)]
        request = rewind_service_pb2.WatchRewindEventsRequest(session_id=sid)
        stream = b.rewinds.WatchRewindEvents(request)
        first = await stream.read()
        assert first.HasField("caught_up")
        rewound = await a.rewind(sid, ids[0], FILES)
        event = await asyncio.wait_for(stream.read(), 10)
        assert (event.event.session_id, event.event.rewind_id) == (sid, rewound.rewind_id)
        stream.cancel()
        unknown = b.rewinds.WatchRewindEvents(
            rewind_service_pb2.WatchRewindEventsRequest(session_id=str(uuid.uuid4()))
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await unknown.read()
        assert error_info(err.value).reason == "SESSION_NOT_FOUND"


async def test_an_owner_that_stopped_is_replica_unavailable_and_its_sessions_return_with_it(
    tmp_path: Path, database: str
) -> None:
    async with replicas(tmp_path, database) as (a, b, c):
        session = await a.create()
        sid = session.session_id
        ids = [prompt_id(await b.prompt(sid, f"write a.txt v{i}")) for i in range(2)]
        rewound = await b.rewind(sid, ids[0], FILES)
        assert a.running is not None
        await a.running.stop(grace=2)  # a clean stop ends its lease at once
        for other in (b, c):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await other.get(sid)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            info = error_info(err.value)
            assert (info.reason, dict(info.metadata)) == ("REPLICA_UNAVAILABLE", {"replica": "replica-0"})
        back = await start(config_of(tmp_path, database_url=database, replica_id="replica-0"))
        try:
            # At its new address, found in the directory on the next call.
            assert (await b.get(sid)).replica == "replica-0"
            assert [p.message_id for p in await b.all_points(sid)] == ids
            assert [e.rewind_id for e in await c.events(sid)] == [rewound.rewind_id]
            await b.prompt(sid, "write b.txt after")
            assert read(Path(session.cwd) / "b.txt") == "after\n"
        finally:
            await back.stop(grace=2)
