"""Three replicas on loopback, one PostgreSQL database (pgserver), real Claude Code processes:
any replica answers any call, forwarding it to the replica that owns the session."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agent_rewind.api.v1 import (
    rewind_pb2,
    rewind_service_pb2,
    session_pb2,
    session_service_pb2,
    session_service_pb2_grpc,
)
from agent_rewind.rpc.auth import FORWARDED_BY, PRINCIPAL, REPLICA_SECRET
from agent_rewind.server import start
from agent_rewind.testing.server_process import ServerProcess
from tests.integration.harness import (
    BOTH,
    FILES,
    Client,
    bad_request,
    client_of,
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


def _replica_process(tmp_path: Path, database: str, i: int, *extra: str) -> ServerProcess:
    """Replica `i` as a server process of its own (its log in its own directory)."""
    args = ["--database-url", database, "--replica-id", f"replica-{i}", *extra]
    return ServerProcess(tmp_path / f"replica-{i}", args=args)


async def _owner_and_other(
    owner: ServerProcess, other: ServerProcess
) -> tuple[Client, Client, session_pb2.Session, list[str], rewind_pb2.RewindResult]:
    """Starts both; a session on `owner` with two turns and a files rewind, made through `other`."""
    await owner.start()
    await other.start()
    a, b = client_of(owner), client_of(other)
    session = await a.create()
    ids = [prompt_id(await b.prompt(session.session_id, f"write a.txt v{i}")) for i in range(2)]
    rewound = await b.rewind(session.session_id, ids[0], FILES)
    return a, b, session, ids, rewound


async def _until(call: Any, within: float = 30.0) -> Any:
    """`call()` once the owner answers again: a replica that came back at a new address (a new
    port, on loopback) is found in the directory after the first call that missed it."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        try:
            return await call()
        except grpc.aio.AioRpcError as err:
            if (
                error_info(err).reason != "REPLICA_UNAVAILABLE"
                or asyncio.get_running_loop().time() > deadline
            ):
                raise
            await asyncio.sleep(0.2)


async def test_an_owner_killed_mid_turn_is_replica_unavailable_then_back_with_nothing_lost(
    tmp_path: Path, database: str
) -> None:
    owner, other = (_replica_process(tmp_path, database, i) for i in range(2))
    try:
        _, b, session, ids, rewound = await _owner_and_other(owner, other)
        sid = session.session_id
        listed = await b.all_points(sid)
        turn = b.sessions.Prompt(
            session_service_pb2.PromptRequest(session_id=sid, text="sleep 60\nwrite late.txt never")
        )
        assert (await turn.read()).HasField("user_prompt"), "the turn runs on the owner"
        owner.kill()  # SIGKILL, with its CLI processes
        with pytest.raises(grpc.aio.AioRpcError) as cut:
            while await turn.read() != grpc.aio.EOF:
                pass
        assert cut.value.code() == grpc.StatusCode.UNAVAILABLE
        info = error_info(cut.value)
        assert (info.reason, dict(info.metadata)) == ("REPLICA_UNAVAILABLE", {"replica": "replica-0"})
        # The points are the ledger's: a replica answers them with the owner down (as the owner
        # last recorded them: the turn it was killed in had not been).
        assert await b.all_points(sid) == listed
        for call in (b.get(sid), b.rewind(sid, ids[1], FILES)):
            with pytest.raises(grpc.aio.AioRpcError) as down:
                await call
            info = error_info(down.value)
            assert (info.reason, dict(info.metadata)) == ("REPLICA_UNAVAILABLE", {"replica": "replica-0"})
        await owner.start()
        back = await _until(lambda: b.get(sid))
        assert back.replica == "replica-0" and back.state != session_pb2.SESSION_STATE_RUNNING
        assert [p.message_id for p in await b.all_points(sid)][:2] == ids
        assert [e.rewind_id for e in await b.events(sid)] == [rewound.rewind_id], "no event lost"
        assert read(Path(session.cwd) / "late.txt") is None, "the cut turn is not run again"
        again = await b.rewind(sid, ids[1], FILES)
        assert again.files.can_rewind and read(Path(session.cwd) / "a.txt") == "v0\n"  # before ids[1]
        assert [e.rewind_id for e in await b.events(sid)] == [rewound.rewind_id, again.rewind_id]
    finally:
        await other.close()
        await owner.close()


async def test_replicas_forward_over_mutual_tls_with_the_callers_principal_not_their_own(
    tmp_path: Path, database: str
) -> None:
    from tests.integration.test_auth import ALL, _access, _cert, _key_pem, _pem

    ca = _cert("test ca", None, ca=True)
    server = _cert("localhost", ca, host=True)  # every replica's: it names localhost
    people = {name: _cert(f"{name}.svc", ca) for name in ("alice", "bob")}
    for name, content in {
        "ca.pem": _pem(ca[0]),
        "server.pem": _pem(server[0]),
        "server.key": _key_pem(server[1]),
    }.items():
        (tmp_path / name).write_bytes(content)
    access = _access(
        tmp_path / "access.json", {"alice": ALL, "bob": ALL}, {}, {n: f"{n}.svc" for n in people}
    )
    async with replicas(
        tmp_path / "state",
        database,
        count=2,
        access_file=access,
        tls_cert=tmp_path / "server.pem",
        tls_key=tmp_path / "server.key",
        tls_client_ca=tmp_path / "ca.pem",
        advertise_address="localhost:0",  # the name the certificate gives (its port: the bound one)
    ) as (a, b):

        def stubs(replica: Client, who: str) -> tuple[Any, grpc.aio.Channel]:
            assert replica.running is not None
            cert, key = people[who]
            credentials = grpc.ssl_channel_credentials(_pem(ca[0]), _key_pem(key), _pem(cert))
            channel = grpc.aio.secure_channel(f"localhost:{replica.running.port}", credentials)
            return session_service_pb2_grpc.SessionServiceStub(channel), channel

        alice_a, ch1 = stubs(a, "alice")
        alice_b, ch2 = stubs(b, "alice")
        bob_b, ch3 = stubs(b, "bob")
        try:
            session = await alice_a.CreateSession(session_service_pb2.CreateSessionRequest())
            sid = session.session_id
            get = session_service_pb2.GetSessionRequest(session_id=sid)
            got = await alice_b.GetSession(get)  # forwarded to replica-0 over mutual TLS
            assert (got.principal, got.replica) == ("alice", "replica-0")
            with pytest.raises(grpc.aio.AioRpcError) as foreign:
                await bob_b.GetSession(get)  # forwarded as bob, not as replica-1
            assert error_info(foreign.value).reason == "SESSION_NOT_FOUND"
            with pytest.raises(grpc.aio.AioRpcError) as forged:
                await alice_b.GetSession(
                    get,
                    metadata=((FORWARDED_BY, "replica-0"), (PRINCIPAL, "bob"), (REPLICA_SECRET, "guess")),
                )
            assert error_info(forged.value).reason == "UNAUTHENTICATED"
        finally:
            for channel in (ch1, ch2, ch3):
                await channel.close()


async def test_on_shared_storage_a_replica_takes_over_a_dead_ones_sessions_and_the_old_owner_steps_aside(
    tmp_path: Path, database: str
) -> None:
    """replica-0 freezes (SIGSTOP: a paused VM, a partition) with its agents; once its lease
    has run out, replica-1 takes its sessions over from the shared storage and serves them.
    replica-0 resumes (SIGCONT) fenced off: it ends its agents and reports NOT_SERVING, and
    the session stays replica-1's, with nothing lost."""
    shared = tmp_path / "shared"
    lease = 3.0

    extra = ("--shared-storage", "--replica-lease", str(lease), "--state-dir", str(shared))
    owner, other = (_replica_process(tmp_path, database, i, *extra) for i in range(2))
    try:
        a, b, session, ids, rewound = await _owner_and_other(owner, other)
        sid = session.session_id
        assert owner.proc is not None
        os.killpg(owner.proc.pid, signal.SIGSTOP)
        frozen = asyncio.get_running_loop().time()
        # A call forwarded to the frozen owner, with no deadline of its own: the forwarder's
        # keepalive pings go unanswered, and it ends as REPLICA_UNAVAILABLE rather than hanging.
        with pytest.raises(grpc.aio.AioRpcError) as hung:
            await asyncio.wait_for(b.get(sid), 25)
        assert error_info(hung.value).reason == "REPLICA_UNAVAILABLE"
        # Counted from the forwarded call's end, which may itself take most of 25 s on a loaded
        # machine: the takeover is bounded by the lease, not by how long the ping took to fail.
        deadline = asyncio.get_running_loop().time() + 30
        while True:
            try:
                if (await b.get(sid)).replica == "replica-1":
                    break
            except grpc.aio.AioRpcError as err:
                assert error_info(err).reason == "REPLICA_UNAVAILABLE"
            assert asyncio.get_running_loop().time() < deadline, "never taken over"
            await asyncio.sleep(0.2)
        took = asyncio.get_running_loop().time() - frozen
        print(f"taken over {took:.1f} s after the owner froze (lease {lease} s)")
        assert [p.message_id for p in await b.all_points(sid)] == ids
        assert [e.rewind_id for e in await b.events(sid)] == [rewound.rewind_id]
        await b.prompt(sid, "write b.txt taken")  # its agent now runs on replica-1
        assert read(Path(session.cwd) / "b.txt") == "taken\n"
        again = await b.rewind(sid, ids[1], FILES)  # from the snapshots on the shared storage
        assert again.files.can_rewind and read(Path(session.cwd) / "a.txt") == "v0\n"

        os.killpg(owner.proc.pid, signal.SIGCONT)  # back, but fenced off: it steps aside
        assert owner.channel is not None
        health = health_pb2_grpc.HealthStub(owner.channel)
        deadline = asyncio.get_running_loop().time() + 30
        while (
            await health.Check(health_pb2.HealthCheckRequest())
        ).status != health_pb2.HealthCheckResponse.NOT_SERVING:
            assert asyncio.get_running_loop().time() < deadline, "the old owner kept serving"
            await asyncio.sleep(0.2)
        assert any("fenced off" in str(line.get("event")) for line in owner.log_lines())
        assert (await b.get(sid)).replica == "replica-1"
        # It let go of the session: a call sent to it now goes on to replica-1.
        assert (await _until(lambda: a.get(sid))).replica == "replica-1"
        assert [e.rewind_id for e in await b.events(sid)] == [rewound.rewind_id, again.rewind_id]
    finally:
        if owner.proc is not None and owner.proc.returncode is None:
            os.killpg(owner.proc.pid, signal.SIGCONT)
        await other.close()
        await owner.close()


async def test_on_shared_storage_no_replica_hands_out_a_workspace_another_replicas_session_holds(
    tmp_path: Path, database: str
) -> None:
    shared = tmp_path / "workspaces"
    async with replicas(
        tmp_path / "state", database, count=2, shared_storage=True, workspace_roots=(shared,)
    ) as (a, b):
        mine = await a.create(cwd="project")
        for cwd in ("project", "project/inside"):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await b.create(cwd=cwd)
            assert error_info(err.value).reason == "WORKSPACE_IN_USE", cwd
        assert Path(mine.cwd) == (shared / "project").resolve()
        assert (await b.create(cwd="elsewhere")).replica == "replica-1"
