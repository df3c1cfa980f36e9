"""The PostgreSQL ledger beyond the contract: schema migration, several replicas writing at once,
what the database's settings cannot change, a lost server, and erasure's VACUUM. Against a real
server (`postgres_server` in conftest.py)."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC
from typing import Any

import psycopg
import pytest
from structlog.testing import capture_logs

from agent_rewind import metrics
from agent_rewind.errors import ReplicaUnavailable, StorageUnavailable
from agent_rewind.store.ledger import Anchor, NewEvent, NewRequest, NewRewind, NewSession
from agent_rewind.store.postgres import MIGRATIONS, PostgresLedger, SchemaTooNew
from tests.pgserver_fixture import PostgresServer

SID = "0b7f3c1e-5a8d-4d6e-9f10-2a3b4c5d6e7f"
OTHER = "1c8e4d2f-6b9e-4e7f-8a21-3b4c5d6e7f80"
TABLES = {
    "agent_rewind_schema",
    "sessions",
    "replicas",
    "anchors",
    "rewinds",
    "requests",
    "events",
    "counters",
    "snapshots",
    "secrets",
    "egress",
    "webhooks",
    "webhook_failures",
    "point_heads",
    "session_storage",
    "points",
}


def _database(url: str) -> str:
    return str(psycopg.conninfo.conninfo_to_dict(url)["dbname"])


def _run(server: PostgresServer, url: str, query: str, *args: Any) -> list[Any]:
    return server.execute(query, args, database=_database(url))


def _tables(server: PostgresServer, url: str) -> set[str]:
    rows = _run(server, url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    return {r[0] for r in rows}


def _failures() -> float:
    return metrics.REGISTRY.get_sample_value("agent_rewind_ledger_write_failures_total") or 0.0


async def _begin(ledger: PostgresLedger, rewind_id: str, session_id: str = SID) -> None:
    await ledger.begin_rewind(
        NewRewind(rewind_id, session_id, f"m-{rewind_id}", "both", {"target": rewind_id})
    )


def _event(rewind_id: str, session_id: str = SID) -> NewEvent:
    return NewEvent("REWOUND", session_id, rewind_id, "alice", {"mode": "both"})


# Schema migration


async def test_a_fresh_database_is_migrated_to_the_newest_schema(
    postgres_server: PostgresServer, empty_postgres_url: str
) -> None:
    assert _tables(postgres_server, empty_postgres_url) == set()
    ledger = await PostgresLedger.open(empty_postgres_url)
    try:
        assert await ledger.schema_version() == len(MIGRATIONS)
        assert _tables(postgres_server, empty_postgres_url) == TABLES
        assert await ledger.event_bounds() == (0, 0)
    finally:
        await ledger.close()


async def test_each_version_a_migration_reaches_is_logged(empty_postgres_url: str) -> None:
    with capture_logs() as logged:
        ledger = await PostgresLedger.open(empty_postgres_url)
    await ledger.close()
    migrated = [e["version"] for e in logged if e["event"] == "ledger schema migrated"]
    assert migrated == list(range(1, len(MIGRATIONS) + 1))


async def test_a_ledger_may_have_a_schema_of_its_own(
    postgres_server: PostgresServer, empty_postgres_url: str
) -> None:
    _run(postgres_server, empty_postgres_url, "CREATE SCHEMA ledger")
    ledger = await PostgresLedger.open(f"{empty_postgres_url}&options=-csearch_path%3Dledger")
    try:
        await ledger.add_session(NewSession(SID, "/ws/a", {}, True))
        rows = _run(postgres_server, empty_postgres_url, "SELECT session_id FROM ledger.sessions")
        assert rows == [(SID,)] and _tables(postgres_server, empty_postgres_url) == set()
    finally:
        await ledger.close()


async def test_reopening_migrates_nothing_and_keeps_everything(
    postgres_server: PostgresServer, postgres_url: str
) -> None:
    first = await PostgresLedger.open(postgres_url)
    (before,) = _run(postgres_server, postgres_url, "SELECT xmin::text, version FROM agent_rewind_schema")
    await first.add_session(
        NewSession(SID, "/ws/a", {"model": "m"}, False), NewRequest("req-1", "CreateSession", "fp", SID)
    )
    await first.touch_session(SID, started=True)
    await first.begin_rewind(
        NewRewind("r1", SID, "m-1", "both", {"target": "m-1"}, request=NewRequest("rw-1", "Rewind", "f", SID))
    )
    anchor = Anchor(SID, "a-1", "m-1", 10, None, "r1")
    await first.complete_rewind("r1", {"ok": True}, anchor, NewEvent("REWOUND", SID, "r1"))
    await first.begin_rewind(NewRewind("r2", SID, "m-2", "files", {"target": "m-2"}))
    secret = await first.secret("page_tokens")
    await first.close()

    second = await PostgresLedger.open(postgres_url)
    try:
        after = _run(postgres_server, postgres_url, "SELECT xmin::text, version FROM agent_rewind_schema")
        assert after == [before], "the version row was not written again"
        record = await second.session(SID)
        assert record is not None and record.options == {"model": "m"} and record.started
        assert await second.anchor(SID) == anchor
        request = await second.request("rw-1")
        assert request is not None and request.done
        applied = await second.rewind("r1")
        assert applied is not None and (applied.state, applied.cursor, applied.result) == (
            "applied",
            1,
            {"ok": True},
        )
        assert [r.rewind_id for r in await second.pending_rewinds()] == ["r2"]
        assert (await second.complete_rewind("r2", {}, None, NewEvent("REWOUND", SID, "r2"))).cursor == 2
        assert await second.secret("page_tokens") == secret
    finally:
        await second.close()


async def test_replicas_starting_together_migrate_once(
    postgres_server: PostgresServer, empty_postgres_url: str
) -> None:
    ledgers = await asyncio.gather(*(PostgresLedger.open(empty_postgres_url) for _ in range(4)))
    try:
        assert _run(postgres_server, empty_postgres_url, "SELECT version FROM agent_rewind_schema") == [
            (len(MIGRATIONS),)
        ]
        assert _run(postgres_server, empty_postgres_url, "SELECT name, value FROM counters") == [
            ("event_cursor", 0)
        ]
    finally:
        for ledger in ledgers:
            await ledger.close()


async def test_a_database_from_a_newer_version_is_refused_untouched(
    postgres_server: PostgresServer, postgres_url: str, empty_postgres_url: str
) -> None:
    newer = len(MIGRATIONS) + 1
    _run(postgres_server, postgres_url, "UPDATE agent_rewind_schema SET version = %s", newer)
    before = _run(postgres_server, postgres_url, "SELECT xmin::text, version FROM agent_rewind_schema")
    with pytest.raises(SchemaTooNew):
        await PostgresLedger.open(postgres_url)
    assert (
        _run(postgres_server, postgres_url, "SELECT xmin::text, version FROM agent_rewind_schema") == before
    )
    # A newer version that has nothing this one knows: none of this one's tables is made.
    _run(postgres_server, empty_postgres_url, "CREATE TABLE agent_rewind_schema (version integer NOT NULL)")
    _run(postgres_server, empty_postgres_url, "INSERT INTO agent_rewind_schema VALUES (%s)", newer)
    with pytest.raises(SchemaTooNew):
        await PostgresLedger.open(empty_postgres_url)
    assert _tables(postgres_server, empty_postgres_url) == {"agent_rewind_schema"}


# Several replicas


async def test_two_replicas_appending_at_once_get_gap_free_unique_cursors(postgres_url: str) -> None:
    a = await PostgresLedger.open(postgres_url)
    b = await PostgresLedger.open(postgres_url)
    try:
        await a.add_session(NewSession(SID, "/ws/a", {}, True))
        await b.add_session(NewSession(OTHER, "/ws/b", {}, True))
        ids = [f"r{n}" for n in range(200)]
        await asyncio.gather(
            *(_begin(a if n % 2 else b, rid, SID if n < 100 else OTHER) for n, rid in enumerate(ids))
        )
        # Each replica completes 100, interleaved with the other's, both sessions in each.
        events = await asyncio.gather(
            *(
                (a if n % 2 else b).complete_rewind(rid, {}, None, _event(rid, SID if n < 100 else OTHER))
                for n, rid in enumerate(ids)
            )
        )
        assert sorted(e.cursor for e in events) == list(range(1, 201))
        logged = await a.events_after(0)
        assert [e.cursor for e in logged] == list(range(1, 201))
        assert {e.cursor: e.rewind_id for e in logged} == {e.cursor: e.rewind_id for e in events}
        for event in events:
            record = await b.rewind(event.rewind_id)
            assert record is not None and record.cursor == event.cursor
        assert await b.event_bounds() == (1, 200)
        assert (await b.events_after(0, SID))[-1].cursor <= 200
    finally:
        await a.close()
        await b.close()


async def test_two_replicas_claiming_one_request_id_one_wins(postgres_url: str) -> None:
    a = await PostgresLedger.open(postgres_url)
    b = await PostgresLedger.open(postgres_url)
    try:
        for n in range(30):
            outcomes = await asyncio.gather(
                a.begin_request(NewRequest(f"req-{n}", "Prompt", "from-a", SID)),
                b.begin_request(NewRequest(f"req-{n}", "Prompt", "from-b", SID)),
                return_exceptions=True,
            )
            assert sorted(type(o).__name__ for o in outcomes) == ["NoneType", "RequestIdTaken"], outcomes
            recorded = await a.request(f"req-{n}")
            assert recorded is not None
            (taken,) = [o for o in outcomes if o is not None]
            assert taken.existing == recorded  # type: ignore[union-attr]
    finally:
        await a.close()
        await b.close()


async def test_a_row_held_too_long_is_storage_unavailable_and_leaves_no_gap(postgres_url: str) -> None:
    ledger = await PostgresLedger.open(postgres_url, lock_timeout=0.2)
    try:
        await ledger.add_session(NewSession(SID, "/ws/a", {}, True))
        await _begin(ledger, "r1")
        async with await psycopg.AsyncConnection.connect(postgres_url) as holder:
            # Another writer holds the cursor's counter (in its transaction) past the lock timeout.
            await holder.execute("SELECT value FROM counters FOR UPDATE")
            failures = _failures()
            with pytest.raises(StorageUnavailable):
                await ledger.complete_rewind("r1", {}, None, _event("r1"))
            assert _failures() == failures + 1
        record = await ledger.rewind("r1")
        assert record is not None and record.state == "pending", "the transaction was rolled back"
        assert (await ledger.complete_rewind("r1", {}, None, _event("r1"))).cursor == 1
    finally:
        await ledger.close()


async def test_writes_are_durable_and_read_committed_whatever_the_database_defaults_to(
    postgres_server: PostgresServer, postgres_url: str
) -> None:
    database = _database(postgres_url)
    postgres_server.execute(f'ALTER DATABASE "{database}" SET synchronous_commit = off')
    postgres_server.execute(f'ALTER DATABASE "{database}" SET default_transaction_isolation = serializable')
    a = await PostgresLedger.open(postgres_url)
    b = await PostgresLedger.open(postgres_url)
    try:
        async with a.dialect._pool.connection() as conn:
            row = await (await conn.execute("SHOW synchronous_commit")).fetchone()
            assert row is not None and row["synchronous_commit"] == "on"
        # Serializable transactions would fail on the counter row; the ledger's are READ COMMITTED.
        await a.add_session(NewSession(SID, "/ws/a", {}, True))
        for n in range(40):
            await _begin(a, f"r{n}")
        events = await asyncio.gather(
            *((a if n % 2 else b).complete_rewind(f"r{n}", {}, None, _event(f"r{n}")) for n in range(40))
        )
        assert sorted(e.cursor for e in events) == list(range(1, 41))
    finally:
        await a.close()
        await b.close()
    # A stricter setting than "on" is left as the database has it.
    postgres_server.execute(f'ALTER DATABASE "{database}" SET synchronous_commit = remote_apply')
    ledger = await PostgresLedger.open(postgres_url)
    try:
        async with ledger.dialect._pool.connection() as conn:
            row = await (await conn.execute("SHOW synchronous_commit")).fetchone()
            assert row is not None and row["synchronous_commit"] == "remote_apply"
    finally:
        await ledger.close()


# A lost server


async def test_a_connection_the_administrator_ended_is_replaced(
    postgres_server: PostgresServer, postgres_url: str
) -> None:
    ledger = await PostgresLedger.open(postgres_url, min_size=2)
    try:
        await ledger.add_session(NewSession(SID, "/ws/a", {}, True))
        ended = _run(
            postgres_server,
            postgres_url,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        assert len(ended) >= 2
        await ledger.touch_session(SID, started=True)
        record = await ledger.session(SID)
        assert record is not None and record.started
    finally:
        await ledger.close()


async def test_a_pool_of_one_whose_connection_was_ended_makes_a_new_one_for_the_next_call(
    postgres_server: PostgresServer, postgres_url: str
) -> None:
    """Every connection the pool holds failed its check: the next one it makes is taken."""
    ledger = await PostgresLedger.open(postgres_url, min_size=1, max_size=1)
    try:
        await ledger.add_session(NewSession(SID, "/ws/a", {}, True))
        _run(
            postgres_server,
            postgres_url,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        await ledger.touch_session(SID, closed=True)
        record = await ledger.session(SID)
        assert record is not None and record.closed
    finally:
        await ledger.close()


async def test_a_ledger_whose_connections_cannot_be_set_up_is_refused_at_open(postgres_url: str) -> None:
    """The pool's connections are made, and set up (here: a lock timeout the server refuses),
    before `open` returns: a ledger that could serve no call is never handed out."""
    with pytest.raises(StorageUnavailable):
        await PostgresLedger.open(postgres_url, lock_timeout=-1, connection_timeout=1)


async def test_storage_unavailable_while_the_server_is_down_and_back_after(
    postgres_server: PostgresServer, postgres_url: str
) -> None:
    ledger = await PostgresLedger.open(postgres_url, connection_timeout=0.2)
    try:
        await ledger.add_session(NewSession(SID, "/ws/a", {}, True))
        with postgres_server.stopped():
            failures = _failures()
            with pytest.raises(StorageUnavailable):
                await ledger.touch_session(SID)
            with pytest.raises(StorageUnavailable):
                await ledger.begin_request(NewRequest("req-1", "Prompt", "fp", SID))
            assert _failures() == failures + 2
            with pytest.raises(StorageUnavailable):
                await ledger.session(SID)
            with pytest.raises(StorageUnavailable):  # refused: nothing listens on the socket
                await PostgresLedger.open(postgres_url, connection_timeout=0.2)
        # The same ledger goes on once the server is back: its pool connects again (retrying
        # with a backoff that started at a second or so while the server was down).
        async with asyncio.timeout(15):
            while True:
                try:
                    await ledger.begin_request(NewRequest("req-1", "Prompt", "fp", SID))
                    break
                except StorageUnavailable:
                    await asyncio.sleep(0.1)
        assert await ledger.request("req-1") is not None
    finally:
        await ledger.close()


async def test_a_read_only_server_is_storage_unavailable_for_writes(
    postgres_server: PostgresServer, postgres_url: str
) -> None:
    """As a standby is, when a failover has moved the primary and the URL still names the old one."""
    ledger = await PostgresLedger.open(postgres_url)
    try:
        await ledger.add_session(NewSession(SID, "/ws/a", {}, True))
        postgres_server.execute(
            f'ALTER DATABASE "{_database(postgres_url)}" SET default_transaction_read_only = on'
        )
        _run(
            postgres_server,
            postgres_url,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        with pytest.raises(StorageUnavailable):
            await ledger.touch_session(SID)
        assert await ledger.session(SID) is not None, "reads go on"
    finally:
        await ledger.close()


# What comes back


async def test_json_and_times_come_back_as_sqlite_gives_them(postgres_url: str) -> None:
    ledger = await PostgresLedger.open(postgres_url)
    try:
        options: dict[str, Any] = {"b": [1, 2.5, None, True], "a": {"nested": "é ☃"}, "z": ""}
        created = await ledger.add_session(NewSession(SID, "/ws/a", options, True))
        assert created.options == options
        assert created.create_time.tzinfo is UTC
        # A request's result may hold a model's text: NUL and all (jsonb would refuse it).
        result = {"result": {"result": "a\x00b \\u0000 \U0001f600 \ud800"}}
        await ledger.begin_request(NewRequest("req-1", "Prompt", "fp", SID))
        await ledger.finish_request("req-1", result)
        recorded = await ledger.request("req-1")
        assert recorded is not None and recorded.result == result and recorded.create_time.tzinfo is UTC
    finally:
        await ledger.close()


# Erasure


async def _session_with_text(ledger: PostgresLedger, sid: str, text: str) -> None:
    await ledger.add_session(
        NewSession(sid, f"/ws/{text}", {"system_prompt": text}, True, "alice"),
        NewRequest(f"create-{sid}", "CreateSession", json.dumps([text]), sid),
    )
    for n in range(40):  # small rows and rows large enough to be TOASTed
        await ledger.begin_request(NewRequest(f"p{n}-{sid}", "Prompt", json.dumps([f"{text} {n}"]), sid))
        await ledger.finish_request(f"p{n}-{sid}", {"reply": text * (1 if n % 2 else 500)})
    await ledger.begin_rewind(NewRewind(f"r-{sid}", sid, "m-1", "both", {"target": "m-1", "note": text}))
    await ledger.complete_rewind(
        f"r-{sid}",
        {"files": [f"/ws/{text}/a.txt"]},
        Anchor(sid, f"a-{sid}", "m-1", 10, None, f"r-{sid}"),
        NewEvent("REWOUND", sid, f"r-{sid}", data={"files": {"files_changed": [f"/ws/{text}/a.txt"]}}),
    )


async def test_an_erasure_vacuums_the_tables_it_touched(
    postgres_server: PostgresServer, postgres_url: str
) -> None:
    ledger = await PostgresLedger.open(postgres_url)
    try:
        await _session_with_text(ledger, SID, "text")
        vacuumed = "SELECT relname FROM pg_stat_user_tables WHERE last_vacuum IS NOT NULL"
        assert _run(postgres_server, postgres_url, vacuumed) == []
        await ledger.erase_session(SID, NewEvent("SESSION_DELETED", SID), erasure={"cwd": "/ws/gone"})
        touched = {"sessions", "anchors", "rewinds", "snapshots", "requests", "events", "egress"}
        touched |= {"point_heads", "points", "session_storage"}
        assert {r[0] for r in _run(postgres_server, postgres_url, vacuumed)} == touched
        dead = "SELECT relname, n_dead_tup FROM pg_stat_user_tables WHERE n_dead_tup > 0"
        assert _run(postgres_server, postgres_url, dead) == [], "no old row versions are left"
    finally:
        await ledger.close()


async def test_an_erasure_is_committed_even_when_a_table_cannot_be_vacuumed(
    postgres_server: PostgresServer, postgres_url: str
) -> None:
    ledger = await PostgresLedger.open(postgres_url, lock_timeout=0.2)
    try:
        await _session_with_text(ledger, SID, "text")
        async with await psycopg.AsyncConnection.connect(postgres_url) as holder:
            await holder.execute("LOCK TABLE requests IN SHARE UPDATE EXCLUSIVE MODE")  # as VACUUM takes
            event = await ledger.erase_session(SID, NewEvent("SESSION_DELETED", SID))
        assert (await ledger.events_after(0))[-1] == event and await ledger.tombstone(SID) is not None
        vacuumed = "SELECT relname FROM pg_stat_user_tables WHERE last_vacuum IS NOT NULL"
        assert "requests" not in {r[0] for r in _run(postgres_server, postgres_url, vacuumed)}
        assert "events" in {r[0] for r in _run(postgres_server, postgres_url, vacuumed)}, "the others were"
    finally:
        await ledger.close()


def _holding(server: PostgresServer, url: str, text: str) -> list[str]:
    """The relations (tables, their TOAST and indexes) whose files hold `text`."""
    server.execute("CHECKPOINT")  # what is in shared buffers only is written to the files
    relations = _run(
        server,
        url,
        "SELECT relname, pg_relation_filepath(oid) FROM pg_class"
        " WHERE relnamespace IN ('public'::regnamespace, 'pg_toast'::regnamespace)"
        " AND pg_relation_filepath(oid) IS NOT NULL",
    )
    data = server.root / "data"
    return sorted(
        {
            name
            for name, path in relations
            for file in [data / path, *data.glob(f"{path}.*"), *data.glob(f"{path}_*")]
            if file.exists() and text.encode() in file.read_bytes()
        }
    )


async def test_with_vacuum_full_an_erased_session_s_text_is_in_none_of_the_tables_files(
    postgres_server: PostgresServer, postgres_url: str
) -> None:
    secret = uuid.uuid4().hex
    ledger = await PostgresLedger.open(postgres_url, vacuum_full=True)
    try:
        await _session_with_text(ledger, OTHER, "kept")
        await _session_with_text(ledger, SID, secret)
        assert _holding(postgres_server, postgres_url, secret)
        await ledger.erase_session(
            SID, NewEvent("SESSION_DELETED", SID, data={"owner": "alice"}), erasure={"cwd": "/ws/gone"}
        )
        assert _holding(postgres_server, postgres_url, secret) == []
        assert _holding(postgres_server, postgres_url, "/ws/gone") == ["sessions"]
        await ledger.finish_erasure(SID)
        assert _holding(postgres_server, postgres_url, "/ws/gone") == []
        record = await ledger.session(OTHER)
        assert record is not None and record.options == {"system_prompt": "kept"}
        assert len(await ledger.rewinds(OTHER)) == 1
    finally:
        await ledger.close()


async def test_an_append_by_another_replica_wakes_a_waiting_one_at_once(postgres_url: str) -> None:
    """The event hub waits in `wait_for_events` between reads of the log: an append anywhere
    (NOTIFY on commit) ends the wait, rather than the poll's timeout."""
    from agent_rewind.events import EventHub

    a = await PostgresLedger.open(postgres_url)
    b = await PostgresLedger.open(postgres_url)
    hub = EventHub(a)
    try:
        await a.add_session(NewSession(SID, "/ws/a", {}, True))
        await a.wait_for_events(0.01)  # listening from here on
        waiting = asyncio.create_task(a.wait_for_events(60))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        await _begin(b, "r1", SID)
        assert not waiting.done(), "a write without an event wakes nobody"
        await b.complete_rewind("r1", {}, None, _event("r1"))
        await asyncio.wait_for(waiting, 5)  # not the 60 s of the poll

        # The hub, its poll set to a minute, delivers another replica's event to its watcher.
        from agent_rewind.events import hub as hub_module

        hub_module._POLL, poll = 60.0, hub_module._POLL
        try:
            await hub.start()
            watch = hub.watch(None, None, lambda e: True).__aiter__()
            await asyncio.wait_for(watch.__anext__(), 5)  # caught up
            await _begin(b, "r2", SID)
            await b.complete_rewind("r2", {}, None, _event("r2"))
            event = await asyncio.wait_for(watch.__anext__(), 5)
            assert event.rewind_id == "r2"
            await watch.aclose()
        finally:
            hub_module._POLL = poll
    finally:
        await hub.close()
        await a.close()
        await b.close()


async def test_a_lost_listening_connection_falls_back_to_the_poll_and_listens_again(
    postgres_url: str,
) -> None:
    a = await PostgresLedger.open(postgres_url)
    b = await PostgresLedger.open(postgres_url)
    try:
        await a.add_session(NewSession(SID, "/ws/a", {}, True))
        await a.wait_for_events(0.01)
        assert a.dialect._listener is not None
        pid = a.dialect._listener.info.backend_pid
        async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as admin:
            await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        # The connection is gone: the wait neither raises nor returns early; it lasts the poll.
        loop = asyncio.get_running_loop()
        started = loop.time()
        await a.wait_for_events(0.3)
        assert loop.time() - started >= 0.25
        # The next wait listens on a new connection: another replica's append wakes it.
        await a.wait_for_events(0.01)
        assert a.dialect._listener is not None and a.dialect._listener.info.backend_pid != pid
        waiting = asyncio.create_task(a.wait_for_events(60))
        await asyncio.sleep(0.1)
        await _begin(b, "r1", SID)
        await b.complete_rewind("r1", {}, None, _event("r1"))
        await asyncio.wait_for(waiting, 5)
    finally:
        await a.close()
        await b.close()


async def test_5_a_registration_waits_for_a_write_of_the_old_epoch_in_flight(postgres_url: str) -> None:
    """The fence is the directory's row read FOR SHARE in every write: a new registration of the
    same replica (a new epoch) must wait until a write that passed the check commits, so no write
    of the old epoch commits after the registration returned. The write (a session's creation) is
    held open after its check and its insert, before its commit (a spy on the transaction), and the
    registration made on another connection."""
    old = await PostgresLedger.open(postgres_url)
    new = await PostgresLedger.open(postgres_url)
    try:
        first = await old.register_replica("r", "127.0.0.1:1", 30)
        old.fence("r", first.epoch)
        checked, release = asyncio.Event(), asyncio.Event()
        committed_at: list[float] = []
        transaction = old.dialect._write

        async def held(work: Any) -> Any:
            async def body(conn: Any) -> Any:
                result = await work(conn)  # the fence's check first, then the insert
                checked.set()
                await release.wait()
                return result

            return await transaction(body)

        old.dialect._write = held  # type: ignore[method-assign]

        async def write() -> None:
            await old.add_session(NewSession("0b7f3c1e-5a8d-4d6e-9f10-2a3b4c5d6e70", "/ws/held", {}, True))
            committed_at.append(asyncio.get_running_loop().time())
            old.dialect._write = transaction  # type: ignore[method-assign]

        writing = asyncio.create_task(write())
        await checked.wait()
        registering = asyncio.create_task(new.register_replica("r", "127.0.0.1:2", 30))
        await asyncio.sleep(0.5)
        assert not registering.done(), "the registration waited for the write in flight"
        release.set()
        await writing
        second = await registering
        registered_at = asyncio.get_running_loop().time()
        assert second.epoch == first.epoch + 1
        assert committed_at[0] <= registered_at
        assert await new.session("0b7f3c1e-5a8d-4d6e-9f10-2a3b4c5d6e70") is not None
        # From now on the old epoch's writes are refused.
        with pytest.raises(ReplicaUnavailable):
            await old.add_session(NewSession("0b7f3c1e-5a8d-4d6e-9f10-2a3b4c5d6e71", "/ws/late", {}, True))
    finally:
        await old.close()
        await new.close()
