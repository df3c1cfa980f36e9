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
