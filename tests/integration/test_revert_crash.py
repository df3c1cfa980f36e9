"""A revert of one turn, and a files rewind narrowed to some paths, killed (SIGKILL, the server with
its CLI processes) at each step a rewind has, then the server started again on the same state:
all of it or none of it, nothing applied twice, the conversation untouched."""

from __future__ import annotations

import uuid
from pathlib import Path

import grpc
import pytest

from agent_rewind import faults
from agent_rewind.api.v1 import rewind_pb2
from agent_rewind.testing.server_process import ServerProcess
from tests.integration.harness import FILES, Client, client_of, prompt_id, read
from tests.integration.test_crash import server_ledger_is_settled
from tests.integration.test_revert import WRITE_A, text

TURN = rewind_pb2.REWIND_SCOPE_TURN
PROMPTS = (
    f"{WRITE_A}\nwrite keep.txt kept",
    "edit a.txt charlie => CHARLIE\nwrite b.txt bee",
    "edit a.txt oscar => OSCAR\nwrite c.txt sea",
)
# The steps a files-only rewind passes (one with a conversation half marks its files applied too).
STEPS = [s for s in faults.STEPS if s.startswith("rewind.") and s != "rewind.files_recorded"]
APPLIED_FROM = STEPS.index("rewind.intent_recorded")


async def _three_turns(c: Client, **kw: bool) -> tuple[str, Path, list[str]]:
    session = await c.create(**kw)
    ids = [prompt_id(await c.prompt(session.session_id, p)) for p in PROMPTS]
    return session.session_id, Path(session.cwd), ids


def _files(cwd: Path) -> tuple[str | None, ...]:
    return tuple(read(cwd / name) for name in ("a.txt", "b.txt", "c.txt", "keep.txt"))


BEFORE = (text(charlie="CHARLIE", oscar="OSCAR"), "bee\n", "sea\n", "kept\n")
REVERTED = (text(oscar="OSCAR"), None, "sea\n", "kept\n")


@pytest.mark.parametrize("step", STEPS)
async def test_a_revert_killed_at_any_step_is_all_applied_or_none_and_once(
    server: ServerProcess, step: str
) -> None:
    await server.start(fault=step, fault_scope="group")
    c = client_of(server)
    sid, cwd, ids = await _three_turns(c)
    assert _files(cwd) == BEFORE
    rid = str(uuid.uuid4())
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await c.rewind(sid, ids[1], FILES, scope=TURN, request_id=rid)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE, "the caller sees no answer"
    assert await server.wait() == -9
    await server.start()
    c = client_of(server)
    applied = STEPS.index(step) >= APPLIED_FROM
    assert _files(cwd) == (REVERTED if applied else BEFORE), step
    # The conversation and its points are the revert's to keep, crash or not.
    assert [p.message_id for p in (await c.points(sid)).points] == ids
    assert server_ledger_is_settled(server)
    events = await c.events(sid)
    assert len(events) == (1 if applied else 0)
    # The retry learns the outcome (or, nothing having happened, applies it now), and applies
    # nothing twice: a change made since stays.
    (cwd / "keep.txt").write_text("a person's\n")
    result = await c.rewind(sid, ids[1], FILES, scope=TURN, request_id=rid)
    assert result.files.can_rewind and result.files.source == rewind_pb2.FILES_SOURCE_SNAPSHOT
    assert sorted(Path(f).name for f in result.files.files_changed) == ["a.txt", "b.txt"]
    assert _files(cwd) == (*REVERTED[:3], "a person's\n")
    assert [(e.rewind_id, e.scope) for e in await c.events(sid)] == [(result.rewind_id, TURN)]
    assert await c.recall(sid) == [*PROMPTS, "recall"]


@pytest.mark.parametrize("step", ["rewind.intent_recorded", "rewind.files_restored"])
async def test_a_narrowed_rewind_from_checkpoints_killed_after_its_intent_is_finished(
    server: ServerProcess, step: str
) -> None:
    """The service writes a narrowed rewind's files from the CLI's backups itself: a restart
    writes them again (idempotent), and only those."""
    await server.start(fault=step, fault_scope="group")
    c = client_of(server)
    sid, cwd, ids = await _three_turns(c, workspace_snapshots=False)
    rid = str(uuid.uuid4())
    with pytest.raises(grpc.aio.AioRpcError):
        await c.rewind(sid, ids[1], FILES, paths=["c.txt", "a.txt"], request_id=rid)
    assert await server.wait() == -9
    await server.start()
    c = client_of(server)
    assert _files(cwd) == (text(), "bee\n", None, "kept\n"), "a.txt and c.txt as before the point; b.txt kept"
    result = await c.rewind(sid, ids[1], FILES, paths=["c.txt", "a.txt"], request_id=rid)
    assert result.files.source == rewind_pb2.FILES_SOURCE_CHECKPOINT
    assert sorted(Path(f).name for f in result.files.files_changed) == ["a.txt", "c.txt"]
    assert [list(e.paths) for e in await c.events(sid)] == [["a.txt", "c.txt"]]
    assert server_ledger_is_settled(server)
