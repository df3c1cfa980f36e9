"""ListRewindPoints on a replica that does not own the session: answered from the points index in
the shared ledger (PostgreSQL), with no forwarded call, and the same answer as the owner's, page
tokens included, after every step of a run of prompts, rewinds, undos and forks; and still
answered while the owner is down."""

from __future__ import annotations

import random
from pathlib import Path

import grpc
import pytest

from agent_rewind import metrics
from agent_rewind.access import Permission
from agent_rewind.api.v1 import rewind_service_pb2, session_service_pb2
from tests.integration.harness import BOTH, CONVERSATION, FILES, Client, error_info, replicas
from tests.integration.test_auth import _access, _as
from tests.pgserver_fixture import PostgresServer

STEPS = 14
PAGE = 2  # small pages: every answer spans several, with tokens


def _forwarded(method: str) -> float:
    return metrics.FORWARDED_RPCS.labels(method)._value.get()


async def _pages(c: Client, sid: str, token: str = "") -> list[bytes]:
    """Every page from `token` on, as the bytes of each response."""
    out = []
    while True:
        page = await c.rewinds.ListRewindPoints(
            rewind_service_pb2.ListRewindPointsRequest(session_id=sid, page_size=PAGE, page_token=token)
        )
        out.append(page.SerializeToString(deterministic=True))
        token = page.next_page_token
        if not token:
            return out


async def _same_answers(owner: Client, other: Client, sid: str) -> list[bytes]:
    """The non-owner first (it must not need the owner to have read since the step), then the
    owner, then a token of each used on the other."""
    theirs = await _pages(other, sid)
    mine = await _pages(owner, sid)
    assert theirs == mine, "a non-owner answers as the owner does"
    first = rewind_service_pb2.ListRewindPointsResponse.FromString(mine[0])
    if first.next_page_token:
        assert await _pages(other, sid, first.next_page_token) == mine[1:], (
            "the owner's token works elsewhere"
        )
        assert await _pages(owner, sid, first.next_page_token) == mine[1:]
    return mine


def _points(pages: list[bytes]) -> list[str]:
    return [
        p.message_id
        for raw in pages
        for p in rewind_service_pb2.ListRewindPointsResponse.FromString(raw).points
    ]


async def test_a_non_owner_serves_the_owners_points_after_every_step_of_a_random_run(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    rng = random.Random(24)  # a fixed run: the same steps every time
    url = postgres.url(postgres.create_database())
    async with replicas(tmp_path, url, count=2) as (owner, other):
        forwarded = _forwarded("ListRewindPoints")
        sids = [(await owner.create(workspace_snapshots=True)).session_id]
        rewinds: dict[str, str] = {}  # session -> its latest rewind, while it may be undone
        for step in range(STEPS):
            sid = rng.choice(sids)
            pages = await _same_answers(owner, other, sid)
            ids = _points(pages)
            op = rng.choice(["prompt", "prompt", "rewind", "undo", "fork"]) if ids else "prompt"
            if op == "prompt":
                await owner.prompt(sid, f"write f{step}.txt v{step}\nsay step {step}")
                rewinds.pop(sid, None)
            elif op == "rewind":
                mode = rng.choice([CONVERSATION, BOTH, FILES]) if len(ids) > 1 else FILES
                target = rng.choice(ids[1:]) if mode != FILES else rng.choice(ids)
                try:
                    result = await owner.rewind(sid, target, mode)
                    rewinds[sid] = result.rewind_id
                except grpc.aio.AioRpcError as err:  # a point aged out of what files can do
                    assert error_info(err).reason in {"FILE_CHECKPOINT_UNAVAILABLE", "SNAPSHOT_UNAVAILABLE"}
            elif op == "undo" and sid in rewinds:
                await owner.rewinds.UndoRewind(
                    rewind_service_pb2.UndoRewindRequest(session_id=sid, rewind_id=rewinds.pop(sid))
                )
            elif op == "fork":
                fork = await owner.sessions.ForkSession(
                    session_service_pb2.ForkSessionRequest(session_id=sid, message_id=rng.choice([*ids, ""]))
                )
                sids.append(fork.session_id)
            for each in sids:
                await _same_answers(owner, other, each)
        assert _forwarded("ListRewindPoints") == forwarded, "no ListRewindPoints was forwarded"


async def test_a_non_owner_answers_points_while_the_owner_is_down(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    url = postgres.url(postgres.create_database())
    async with replicas(tmp_path, url, count=2) as (owner, other):
        sid = (await owner.create()).session_id
        for n in range(3):
            await owner.prompt(sid, f"write f{n}.txt v{n}")
        before = await _same_answers(owner, other, sid)
        assert owner.running is not None
        await owner.running.stop(grace=2)
        assert await _pages(other, sid) == before, "the ledger's points, with no owner to ask"
        with pytest.raises(grpc.aio.AioRpcError) as err:  # what needs the owner still does
            await other.rewind(sid, _points(before)[1], CONVERSATION)
        assert error_info(err.value).reason == "REPLICA_UNAVAILABLE"


async def test_a_deleted_session_s_points_are_gone_from_every_replica(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    """A non-owner that served (and kept) a page of a session answers SESSION_NOT_FOUND once
    the owner deleted it: the index went with the erasure, and the kept page with it."""
    url = postgres.url(postgres.create_database())
    async with replicas(tmp_path, url, count=2) as (owner, other):
        sid = (await owner.create()).session_id
        await owner.prompt(sid, "write f.txt secret")
        await _same_answers(owner, other, sid)
        await owner.sessions.DeleteSession(session_service_pb2.DeleteSessionRequest(session_id=sid))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _pages(other, sid)
        assert error_info(err.value).reason == "SESSION_NOT_FOUND"


async def test_a_non_owner_that_cached_a_session_s_record_shows_its_points_to_no_other_principal(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    """The slip of issue 37: `_stored` skipped the principal check for a record it had cached, so
    once alice had listed her points on a replica that does not own the session, bob's
    ListRewindPoints there returned them, prompt previews included."""
    url = postgres.url(postgres.create_database())
    every = [p.value for p in Permission if p is not Permission.ADMIN]
    access = _access(tmp_path / "access.json", {"alice": every, "bob": every}, {"alice": "ta", "bob": "tb"})
    async with replicas(tmp_path / "state", url, count=2, access_file=access) as (owner, other):
        alice, alice_there, bob_there = _as(owner, "ta"), _as(other, "ta"), _as(other, "tb")
        sid = (await alice.create()).session_id
        await alice.prompt(sid, "say alice's secret plan")
        for _ in range(2):  # the first read caches the record on the non-owner
            assert [p.text for p in (await alice_there.points(sid)).points] == ["say alice's secret plan"]
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await bob_there.points(sid)
            assert error_info(refused.value).reason == "SESSION_NOT_FOUND"
            assert "secret" not in (refused.value.details() or "")
