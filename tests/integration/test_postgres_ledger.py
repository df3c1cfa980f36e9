"""The service on a PostgreSQL ledger (--database-url): a real server, real Claude Code processes,
a real PostgreSQL (pgserver). Sessions, rewinds, snapshots and events live in the database and
survive a restart. (Several replicas on one database: test_replicas.py.)"""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agent_rewind.api.v1 import rewind_pb2, session_service_pb2
from agent_rewind.errors import ReplicaUnavailable
from tests.integration.harness import BOTH, FILES, error_info, prompt_id, read, serve
from tests.pgserver_fixture import PostgresServer


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def database(postgres: PostgresServer) -> str:
    return postgres.url(postgres.create_database())


async def test_the_service_runs_on_postgresql_and_keeps_everything_across_a_restart(
    tmp_path: Path, database: str
) -> None:
    async with serve(tmp_path, database_url=database, workspace_snapshots=True) as c:
        assert not (tmp_path / "ledger.sqlite3").exists(), "no SQLite ledger beside it"
        session = await c.create()
        sid, cwd = session.session_id, Path(session.cwd)
        ids = [prompt_id(await c.prompt(sid, f"write a.txt v{i}")) for i in range(3)]
        rewound = await c.rewind(sid, ids[1], BOTH)
        assert rewound.files.source == rewind_pb2.FILES_SOURCE_SNAPSHOT and rewound.conversation.rewound
    async with serve(tmp_path, database_url=database, workspace_snapshots=True) as c:
        assert [p.message_id for p in (await c.points(sid)).points] == ids[:1]
        assert await c.recall(sid) == ["write a.txt v0", "recall"]
        events = await c.events(sid)
        assert [e.rewind_id for e in events] == [rewound.rewind_id]
        assert read(cwd / "a.txt") == "v0\n"
        again = await c.rewind(sid, ids[0], FILES)
        assert again.files.can_rewind and read(cwd / "a.txt") is None


async def test_a_replica_registers_with_a_lease_owns_what_it_creates_and_retires_at_shutdown(
    tmp_path: Path, database: str
) -> None:
    from agent_rewind.api.v1 import rewind_service_pb2
    from agent_rewind.store.postgres import PostgresLedger

    async def directory() -> list[tuple[str, str, int, bool]]:
        ledger = await PostgresLedger.open(database)
        try:
            found = await ledger.replicas()  # (the other test's server retired its own entry)
            return [(r.replica_id, r.address, r.epoch, r.alive) for r in found if r.replica_id == "pod-0"]
        finally:
            await ledger.close()

    async with serve(
        tmp_path, database_url=database, replica_id="pod-0", advertise_address="pod-0.agents:50051"
    ) as c:
        assert await directory() == [("pod-0", "pod-0.agents:50051", 1, True)]
        caps = await c.rewinds.GetCapabilities(rewind_service_pb2.GetCapabilitiesRequest())
        assert caps.replicas == 1
        session = await c.create()
        assert session.replica == "pod-0"
        assert c.running is not None and c.running.membership is not None
        pid = c.running.registry.workers[session.session_id].client_pid
        assert pid is not None and _alive(pid), "a live agent"
        # Another process registers as pod-0 (a replica restarted while this one still runs):
        # this one's next renewal is refused, and it knows it is fenced off.
        ledger = await PostgresLedger.open(database)
        try:
            await ledger.register_replica("pod-0", "elsewhere:50051", 30)
        finally:
            await ledger.close()
        assert not await c.running.membership.renew()
        assert c.running.membership.fenced
        # Fenced off: it stops taking calls, ends its agents and lets go of its sessions (they
        # may run elsewhere now), and whatever would write is refused, writing nothing.
        health = await health_pb2_grpc.HealthStub(c.channel).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert pid is not None and not _alive(pid), "its agent ended"
        assert not c.running.registry.workers
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await c.create()
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert error_info(refused.value).reason == "SHUTTING_DOWN", "retry on another replica"
        with pytest.raises(ReplicaUnavailable):
            await c.running.ledger.touch_session(session.session_id)
    # A fenced replica leaves the newer incarnation's lease alone.
    assert await directory() == [("pod-0", "elsewhere:50051", 2, True)]
    async with serve(tmp_path, database_url=database, replica_id="pod-0", advertise_address="pod-0:1") as c:
        assert (
            await c.sessions.GetSession(session_service_pb2.GetSessionRequest(session_id=session.session_id))
        ).replica == "pod-0"
        assert await directory() == [("pod-0", "pod-0:1", 3, True)]
    assert await directory() == [("pod-0", "pod-0:1", 3, False)]  # retired at a clean shutdown
    # Another replica (a pod renamed, say) does not own pod-0's sessions: they wait for pod-0,
    # whose lease ended at its clean shutdown.
    async with serve(tmp_path / "pod-9", database_url=database, replica_id="pod-9") as c:
        with pytest.raises(grpc.aio.AioRpcError) as waiting:
            await c.sessions.GetSession(session_service_pb2.GetSessionRequest(session_id=session.session_id))
        assert waiting.value.code() == grpc.StatusCode.UNAVAILABLE
        info = error_info(waiting.value)
        assert (info.reason, dict(info.metadata)) == ("REPLICA_UNAVAILABLE", {"replica": "pod-0"})
