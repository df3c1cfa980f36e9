"""Crashes at named steps (agent_rewind.faults) of a real server process, and what a restart makes of them.

The rule for a rewind: once its intent is recorded, it is finished, never half-done, by the call
or by the next start of the server; before that, nothing was applied. Either way a caller that saw
no answer retries with its request_id and learns the outcome.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from agent_rewind.testing.server_process import ServerProcess
from tests.integration.harness import BOTH, Client, client_of, prompt_id, read

P0 = "write a.txt v0\nsay made a"
P1 = "edit a.txt v0 => v1\nwrite b.txt bee"
P2 = "edit a.txt v1 => v2\nwrite c.txt sea"


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[ServerProcess]:
    process = ServerProcess(tmp_path / "state")
    try:
        yield process
    finally:
        await process.close()


async def _three_turns(c: Client) -> tuple[str, Path, list[str]]:
    session = await c.create()
    ids = [prompt_id(await c.prompt(session.session_id, p)) for p in (P0, P1, P2)]
    return session.session_id, Path(session.cwd), ids


async def _rewind_killed_at(server: ServerProcess, step: str) -> tuple[str, Path, list[str], str]:
    """Three turns, then a `both` rewind to the second with a request id, killed at `step`."""
    await server.start(fault=step)
    c = client_of(server)
    sid, cwd, ids = await _three_turns(c)
    rid = str(uuid.uuid4())
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await c.rewind(sid, ids[1], BOTH, request_id=rid)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE, "the caller sees no answer"
    assert await server.wait() == -9
    await server.start()
    return sid, cwd, ids, rid


async def test_a_crash_before_the_intent_is_recorded_applies_nothing(server: ServerProcess) -> None:
    sid, cwd, ids, rid = await _rewind_killed_at(server, "rewind.planned")
    c = client_of(server)
    assert [p.message_id for p in (await c.points(sid)).points] == ids
    assert (read(cwd / "a.txt"), read(cwd / "c.txt")) == ("v2\n", "sea\n")
    # The retry learns the outcome: nothing had happened, so it applies the rewind now.
    result = await c.rewind(sid, ids[1], BOTH, request_id=rid)
    assert result.rewind_id and result.files.can_rewind and result.conversation.rewound
    assert (read(cwd / "a.txt"), read(cwd / "c.txt")) == ("v0\n", None)
    assert await c.rewind(sid, ids[1], BOTH, request_id=rid) == result


@pytest.mark.parametrize(
    "step", ["rewind.intent_recorded", "rewind.files_restored", "rewind.files_recorded", "rewind.completed"]
)
async def test_a_crash_after_the_intent_is_recorded_is_finished_by_the_restart(
    server: ServerProcess, step: str
) -> None:
    sid, cwd, ids, rid = await _rewind_killed_at(server, step)
    c = client_of(server)
    # Finished before the server admitted a call: all of it, files and conversation.
    assert [p.message_id for p in (await c.points(sid)).points] == ids[:1]
    assert (read(cwd / "a.txt"), read(cwd / "b.txt"), read(cwd / "c.txt")) == ("v0\n", None, None)
    # The retry learns the outcome and applies nothing again.
    result = await c.rewind(sid, ids[1], BOTH, request_id=rid)
    assert result.rewind_id and result.files.can_rewind and result.conversation.rewound
    assert await c.recall(sid) == [P0, "recall"]
