"""Webhook delivery end to end: a real server process (and two replicas on one PostgreSQL), real
Claude Code processes, and a real HTTP receiver on loopback (aiohttp) that answers 500 at times,
hangs at times, and verifies every delivery's signature with `standardwebhooks`.

Over rewinds, undos and a deletion, with the server SIGKILLed while a delivery hangs: every
event arrives at least once, in cursor order, signed, as the same RewindEvent a watcher gets;
the only duplicate is the one the crash explains (the event taken just before the kill, whose
cursor move the kill may have cut off)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from agent_rewind.api.v1 import rewind_pb2, rewind_service_pb2, session_service_pb2
from agent_rewind.testing.server_process import ServerProcess
from agent_rewind.webhooks.secrets import new_key
from tests.integration.harness import BOTH, CONVERSATION, FILES, Client, client_of, prompt_id
from tests.pgserver_fixture import PostgresServer
from tests.webhook_receiver import Receiver

KEYS = [new_key(), new_key()]  # two at once: a rotation under way
TYPES = {
    rewind_pb2.REWIND_EVENT_KIND_REWOUND: "agent_rewind.v1.rewound",
    rewind_pb2.REWIND_EVENT_KIND_UNDONE: "agent_rewind.v1.undone",
    rewind_pb2.REWIND_EVENT_KIND_SESSION_DELETED: "agent_rewind.v1.session_deleted",
}


def _webhook_args(tmp_path: Path, url: str) -> list[str]:
    keys = tmp_path / "webhook-keys"
    keys.write_text(
        "# new key first, the old one until every receiver has the new\n" + "\n".join(KEYS) + "\n"
    )
    keys.chmod(0o600)
    return [
        "--webhook-url",
        url,
        "--webhook-secret-file",
        str(keys),
        "--webhook-timeout",
        "1",
        "--webhook-max-attempts",
        "30",
    ]


def _plan(crash_at: int, at_crash_point: asyncio.Event, killed: asyncio.Event) -> Callable[[str, int], str]:
    """Even cursors fail (500) at their first attempt, cursor 3 hangs at its first (the sender's
    timeout ends it). `crash_at` is taken (the receiver keeps it) but never answered, and every
    attempt at it hangs, until the test has killed the server: the restarted server (or the
    replica that takes over) sends it again, the duplicate the crash explains."""

    def plan(msg_id: str, attempt: int) -> str:
        cursor = int(msg_id)
        if cursor == crash_at and not killed.is_set():
            if at_crash_point.is_set():
                return "hang"
            at_crash_point.set()
            return "take-and-hang"
        if attempt == 1 and cursor % 2 == 0:
            return "fail"
        if attempt == 1 and cursor == 3:
            return "hang"
        return "ok"

    return plan


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    made = Receiver(KEYS)
    await made.start()
    try:
        yield made
    finally:
        await made.stop()


async def _watched(c: Client) -> dict[int, rewind_pb2.RewindEvent]:
    """Every event of the log, as a watcher replays it."""
    call = c.rewinds.WatchRewindEvents(rewind_service_pb2.WatchRewindEventsRequest(after_cursor=0))
    found: dict[int, rewind_pb2.RewindEvent] = {}
    try:
        async with asyncio.timeout(30):
            async for response in call:
                if response.HasField("caught_up"):
                    return found
                found[response.event.cursor] = response.event
    finally:
        call.cancel()
    raise AssertionError("no caught_up")


async def _undo(c: Client, sid: str, rewind_id: str) -> None:
    await c.rewinds.UndoRewind(rewind_service_pb2.UndoRewindRequest(session_id=sid, rewind_id=rewind_id))


async def _turns(c: Client, texts: list[str]) -> tuple[str, list[str]]:
    session = await c.create()
    return session.session_id, [prompt_id(await c.prompt(session.session_id, t)) for t in texts]


TURNS = ["write a.txt v0", "edit a.txt v0 => v1", "edit a.txt v1 => v2"]


def _check(
    receiver: Receiver, before_kill: list[int], watched: dict[int, rewind_pb2.RewindEvent], last: int
) -> None:
    cursors = receiver.cursors()
    assert receiver.bad_signatures == 0
    assert sorted(set(cursors)) == list(range(1, last + 1)), "every event at least once"
    assert cursors == sorted(cursors), "in cursor order"
    duplicates = {c for c in cursors if cursors.count(c) > 1}
    assert duplicates <= set(before_kill[-1:]), "only the event taken just before the kill comes twice"
    assert all(cursors.count(c) <= 2 for c in cursors)
    for delivery in receiver.accepted:
        document = delivery.document
        cursor = int(document["id"])
        assert delivery.headers["webhook-id"] == document["id"]
        event = watched.get(cursor)
        if event is not None:  # (the deletion's, sent after it, is checked by its type)
            assert document["type"] == TYPES[event.kind] and document["subject"] == event.session_id
            assert document["data"] == json_format.MessageToDict(event), "what a watcher gets"
    answered = {msg_id: [a for m, a in receiver.attempts if m == msg_id] for msg_id, _ in receiver.attempts}
    assert answered["2"][:2] == ["fail", "ok"] and answered["3"][:2] == ["hang", "ok"]


async def test_every_event_arrives_signed_in_order_across_500s_hangs_and_a_sigkill(
    tmp_path: Path, receiver: Receiver
) -> None:
    at_crash_point, killed = asyncio.Event(), asyncio.Event()
    receiver.plan = _plan(5, at_crash_point, killed)
    server = ServerProcess(tmp_path / "state", args=_webhook_args(tmp_path, receiver.url))
    try:
        await server.start()
        c = client_of(server)
        sid, ids = await _turns(c, TURNS)
        first = await c.rewind(sid, ids[1], FILES)  # 1
        await _undo(c, sid, first.rewind_id)  # 2: 500 first
        second = await c.rewind(sid, ids[1], BOTH)  # 3: hangs first
        await _undo(c, sid, second.rewind_id)  # 4: 500 first
        third = await c.rewind(sid, ids[2], CONVERSATION)  # 5: hangs until the kill
        await asyncio.wait_for(at_crash_point.wait(), 60)
        before_kill = receiver.cursors()
        server.kill()
        assert await server.wait() == -9
        killed.set()
        await server.start()
        c = client_of(server)
        await _undo(c, sid, third.rewind_id)  # 6
        await receiver.wait_for(6)
        watched = await _watched(c)  # before the deletion blanks the files its events name
        await c.sessions.DeleteSession(session_service_pb2.DeleteSessionRequest(session_id=sid))  # 7
        async with asyncio.timeout(60):
            while 7 not in receiver.cursors():
                await receiver.wait_for(len(receiver.accepted) + 1)
        assert before_kill == [1, 2, 3, 4, 5]
        _check(receiver, before_kill, watched, 7)
        assert receiver.cursors().count(5) == 2, "the event taken as the server died comes again"
        assert receiver.accepted[-1].document["type"] == "agent_rewind.v1.session_deleted"
        # What the operator's command says of it, the server still running.
        async with asyncio.timeout(30):
            while (row := await _listed(server.state_dir))["cursor"] < 7:
                await asyncio.sleep(0.1)
        assert (row["lag"], row["failed"], row["held"], row["delivered"]) == (0, 0, True, 7)
    finally:
        await server.close()


async def _listed(state_dir: Path | None = None, database: str = "") -> dict[str, Any]:
    """`agent-rewind webhooks --json`'s one URL."""
    where = ["--database-url", database] if database else ["--state-dir", str(state_dir)]
    command = [sys.executable, "-m", "agent_rewind.cli", "webhooks", *where, "--json"]
    proc = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    assert proc.returncode == 0
    [row] = json.loads(out)["webhooks"]
    return dict(row)


def _replica(tmp_path: Path, database: str, i: int, url: str) -> ServerProcess:
    args = [
        "--database-url",
        database,
        "--replica-id",
        f"replica-{i}",
        "--replica-lease",
        "3",
        *_webhook_args(tmp_path, url),
    ]
    return ServerProcess(tmp_path / f"replica-{i}", args=args)


async def test_two_replicas_on_postgresql_deliver_once_each_and_survive_the_delivering_one_killed(
    tmp_path: Path, receiver: Receiver, postgres: PostgresServer
) -> None:
    database = postgres.url(postgres.create_database())
    at_crash_point, killed = asyncio.Event(), asyncio.Event()
    receiver.plan = _plan(5, at_crash_point, killed)
    delivering, other = (_replica(tmp_path, database, i, receiver.url) for i in range(2))
    try:
        await delivering.start()  # claims the URL first: it delivers
        await other.start()
        c = client_of(other)  # the session is the other replica's: its events reach the deliverer by the log
        sid, ids = await _turns(c, TURNS)
        first = await c.rewind(sid, ids[1], FILES)
        await _undo(c, sid, first.rewind_id)
        second = await c.rewind(sid, ids[1], BOTH)
        await _undo(c, sid, second.rewind_id)
        third = await c.rewind(sid, ids[2], CONVERSATION)
        await asyncio.wait_for(at_crash_point.wait(), 60)
        before_kill = receiver.cursors()
        delivering.kill()
        assert await delivering.wait() == -9
        killed.set()
        # The other replica claims the URL once the killed one's lease lapses (3 s), from its cursor.
        await _undo(c, sid, third.rewind_id)
        await receiver.wait_for(6)
        watched = await _watched(c)
        await c.sessions.DeleteSession(session_service_pb2.DeleteSessionRequest(session_id=sid))
        async with asyncio.timeout(60):
            while 7 not in receiver.cursors():
                await receiver.wait_for(len(receiver.accepted) + 1)
        assert before_kill == [1, 2, 3, 4, 5]
        _check(receiver, before_kill, watched, 7)
        assert receiver.cursors().count(5) == 2, "the event taken as the server died comes again"
        held = [line for line in other.log_lines() if line.get("event") == "delivering to a webhook URL"]
        assert held and held[-1].get("after_cursor") == 4, "the other took over from the cursor"
        async with asyncio.timeout(30):
            while (row := await _listed(database=database))["cursor"] < 7:
                await asyncio.sleep(0.1)
        assert (row["holder"], row["held"], row["lag"], row["failed"]) == ("replica-1", True, 0, 0)
    finally:
        await delivering.close()
        await other.close()
