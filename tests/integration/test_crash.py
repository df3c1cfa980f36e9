"""Crashes at named steps (agent_rewind.faults) of a real server process, and what a restart makes of them.

The rule for a rewind: once its intent is recorded, it is finished, never half-done, by the call
or by the next start of the server; before that, nothing was applied. Either way a caller that saw
no answer retries with its request_id and learns the outcome.
"""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent_rewind import faults
from agent_rewind.testing.server_process import ServerProcess
from tests.integration.harness import (
    BOTH,
    CONVERSATION,
    FILES,
    Client,
    client_of,
    prompt_id,
    read,
    transcript_entries,
)

P0 = "write a.txt v0\nsay made a"
P1 = "edit a.txt v0 => v1\nwrite b.txt bee"
P2 = "edit a.txt v1 => v2\nwrite c.txt sea"


async def _three_turns(c: Client) -> tuple[str, Path, list[str]]:
    session = await c.create()
    ids = [prompt_id(await c.prompt(session.session_id, p)) for p in (P0, P1, P2)]
    return session.session_id, Path(session.cwd), ids


async def _rewind_killed_at(
    server: ServerProcess, step: str, mode: Any = BOTH
) -> tuple[str, Path, list[str], str]:
    """Three turns, then a rewind (`both` unless told) to the second with a request id, killed at
    `step`."""
    await server.start(fault=step)
    c = client_of(server)
    sid, cwd, ids = await _three_turns(c)
    rid = str(uuid.uuid4())
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await c.rewind(sid, ids[1], mode, request_id=rid)
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


@pytest.mark.parametrize("step", ["rewind.intent_recorded", "rewind.files_restored", "rewind.completed"])
async def test_a_files_only_rewind_interrupted_after_its_intent_is_finished_by_the_restart(
    server: ServerProcess, step: str
) -> None:
    """A files-only rewind records no "files applied" mark: killed after restoring, the restart
    restores again (idempotent) and completes it, with the conversation untouched."""
    sid, cwd, ids, rid = await _rewind_killed_at(server, step, FILES)
    c = client_of(server)
    assert [p.message_id for p in (await c.points(sid)).points] == ids
    assert (read(cwd / "a.txt"), read(cwd / "b.txt"), read(cwd / "c.txt")) == ("v0\n", None, None)
    result = await c.rewind(sid, ids[1], FILES, request_id=rid)
    assert result.rewind_id and result.files.can_rewind and not result.conversation.requested
    assert sorted(Path(f).name for f in result.files.files_changed) == ["a.txt", "b.txt", "c.txt"]
    # What it changed, seen from what was kept before it (a.txt v2 -> v0, b.txt and c.txt removed).
    assert (result.files.insertions, result.files.deletions) == (1, 3)
    events = await c.events(sid)
    assert [e.rewind_id for e in events] == [result.rewind_id], "one event, for the finished rewind"


# The usual crash: the server and its CLI processes die together (a pod killed for memory).


async def test_dropped_turns_stay_dropped_when_the_server_and_its_cli_die_together(
    server: ServerProcess,
) -> None:
    await server.start()
    c = client_of(server)
    session = await c.create()
    sid, cwd = session.session_id, Path(session.cwd)
    t1 = prompt_id(await c.prompt(sid, "write a.txt one"))
    t2 = prompt_id(await c.prompt(sid, "write a.txt two"))
    await c.rewind(sid, t2, BOTH)
    t3 = prompt_id(await c.prompt(sid, "write a.txt three"))
    server.kill(with_cli=True)
    await server.wait()
    await server.start()
    c = client_of(server)
    assert [p.message_id for p in (await c.points(sid)).points] == [t1, t3]
    assert await c.recall(sid) == ["write a.txt one", "write a.txt three", "recall"]
    assert (await c.dry_run(sid, t3, FILES)).files.can_rewind, "t3's checkpoint is there"
    await c.rewind(sid, t3, FILES)
    assert read(cwd / "a.txt") == "one\n"


async def test_a_second_both_rewind_then_a_crash_leaves_a_working_session(server: ServerProcess) -> None:
    await server.start()
    c = client_of(server)
    sid, _, ids = await _three_turns(c)
    await c.rewind(sid, ids[2], BOTH)
    await c.rewind(sid, ids[1], BOTH)
    server.kill(with_cli=True)
    await server.wait()
    kept = ids[:1]
    for _ in range(2):  # and on every later start
        await server.start()
        c = client_of(server)
        assert [p.message_id for p in (await c.points(sid)).points] == kept
        kept.append(prompt_id(await c.prompt(sid, "say on")))
        await server.stop()
    await server.start()
    assert await client_of(server).recall(sid) == [P0, "say on", "say on", "recall"]


async def test_a_conversation_rewind_after_a_crash_works(server: ServerProcess) -> None:
    await server.start()
    c = client_of(server)
    sid, _, ids = await _three_turns(c)
    server.kill(with_cli=True)
    await server.wait()
    await server.start()
    c = client_of(server)
    result = await c.rewind(sid, ids[2], CONVERSATION)
    assert result.conversation.rewound
    assert await c.recall(sid) == [P0, P1, "recall"]


# Chaos: a SIGKILL of the server and its CLI processes at every step, then a restart.

REWIND_STEPS = [s for s in faults.STEPS if s.startswith("rewind.")]
TURN_STEPS = [s for s in faults.STEPS if s.startswith("turn.")]
APPLIED_FROM = REWIND_STEPS.index("rewind.intent_recorded")


def _files(cwd: Path) -> tuple[str | None, ...]:
    return tuple(read(cwd / name) for name in ("a.txt", "b.txt", "c.txt"))


@pytest.mark.parametrize("step", REWIND_STEPS)
async def test_a_crash_at_any_step_of_a_rewind_leaves_all_of_it_or_none(
    server: ServerProcess, step: str
) -> None:
    await server.start(fault=step, fault_scope="group")
    c = client_of(server)
    sid, cwd, ids = await _three_turns(c)
    before = _files(cwd)
    with pytest.raises(grpc.aio.AioRpcError):
        await c.rewind(sid, ids[1], BOTH)
    assert await server.wait() == -9
    await server.start()
    c = client_of(server)
    points = [p.message_id for p in (await c.points(sid)).points]
    applied = REWIND_STEPS.index(step) >= APPLIED_FROM
    if applied:
        assert (points, _files(cwd)) == (ids[:1], ("v0\n", None, None)), step
        assert await c.recall(sid) == [P0, "recall"], step
    else:
        assert (points, _files(cwd)) == (ids, before), step
        assert await c.recall(sid) == [P0, P1, P2, "recall"], step
    assert server_ledger_is_settled(server)


@pytest.mark.parametrize("step", TURN_STEPS)
async def test_a_crash_at_any_step_of_a_turn_loses_no_earlier_turn_and_the_session_goes_on(
    server: ServerProcess, step: str
) -> None:
    await server.start(fault=f"{step}@3", fault_scope="group")  # the third turn
    c = client_of(server)
    session = await c.create()
    sid = session.session_id
    ids = [prompt_id(await c.prompt(sid, p)) for p in (P0, P1)]
    with pytest.raises(grpc.aio.AioRpcError):
        await c.prompt(sid, "write d.txt dee")
    assert await server.wait() == -9
    await server.start()
    c = client_of(server)
    points = await c.points(sid)
    texts = [p.text for p in points.points]
    assert [p.message_id for p in points.points][:2] == ids, step
    reached = step != "turn.accepted" and step != "turn.prompt_sent"
    if reached:
        assert texts == [P0, P1, "write d.txt dee"], f"{step}: the prompt was in the transcript"
    else:
        assert texts[:2] == [P0, P1] and len(texts) in (2, 3), step
    assert (await c.recall(sid)) == [*texts, "recall"], step
    assert server_ledger_is_settled(server)


def server_ledger_is_settled(server: ServerProcess) -> bool:
    """After a restart: no intent left pending, an event for every applied rewind."""
    import sqlite3

    db = sqlite3.connect(server.state_dir / "ledger.sqlite3")
    try:
        pending = db.execute("SELECT COUNT(*) FROM rewinds WHERE state = 'pending'").fetchone()[0]
        applied = db.execute("SELECT cursor FROM rewinds WHERE state = 'applied' ORDER BY cursor").fetchall()
        events = db.execute("SELECT cursor FROM events ORDER BY cursor").fetchall()
    finally:
        db.close()
    assert pending == 0, "an intent was left pending"
    assert applied == events, "every applied rewind has its event and no event lacks its rewind"
    assert [c for (c,) in events] == list(range(1, len(events) + 1)), "cursors are gap-free"
    return True


async def test_the_real_model_without_a_credential_stops_the_server_at_start(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "state", args=["--model", "anthropic"])
    try:
        with pytest.raises(RuntimeError, match="exited with 1"):
            await server.start(ready_within=30)
        assert any("no credential" in str(line.get("error", "")) for line in server.log_lines())
    finally:
        await server.close()


async def test_a_crash_after_a_turn_on_a_branch_cut_in_place_resumes_that_branch(
    server: ServerProcess,
) -> None:
    """The CLI marks the leaf it resumes from lazily; killed before it did, it would resume the
    dropped branch (or refuse: "No message found with message.uuid")."""
    await server.start()
    c = client_of(server)
    sid, _, ids = await _three_turns(c)
    await c.rewind(sid, ids[1], CONVERSATION)  # cut in place, in the live process
    t4 = prompt_id(await c.prompt(sid, "say four"))
    server.kill(with_cli=True)
    await server.wait()
    await server.start()
    c = client_of(server)
    assert [p.message_id for p in (await c.points(sid)).points] == [ids[0], t4]
    assert await c.recall(sid) == [P0, "say four", "recall"]


async def test_a_killed_server_starts_again_at_once_on_its_state(server: ServerProcess) -> None:
    """The harness itself: `start()` right after `kill()` waits for the exit it has not seen yet
    (test_replicas.py restarts an owner so), instead of taking the server for still running."""
    await server.start()
    c = client_of(server)
    sid = (await c.create()).session_id
    server.kill()
    await server.start()
    assert (await client_of(server).get(sid)).session_id == sid


# The points index (sessions/points.py): written in the ledger after the CLI wrote the turn.

_REBUILT = "points index rebuilt from the whole transcript"


def _rebuilds(server: ServerProcess) -> int:
    return sum(1 for line in server.log_lines() if line.get("event") == _REBUILT)


def _transcript(server: ServerProcess, sid: str) -> Path:
    files = list((server.state_dir / "claude" / "projects").glob(f"*/{sid}.jsonl"))
    assert len(files) == 1, files
    return files[0]


@pytest.mark.parametrize("step", ["turn.result", "points.recording"])
async def test_a_turn_the_transcript_holds_but_the_index_missed_is_a_point_after_the_restart(
    server: ServerProcess, step: str
) -> None:
    """Killed between the CLI's write of the third turn and the ledger's: the restart reads the
    transcript's tail (not all of it) and shows the turn, never losing it."""
    await server.start()
    c = client_of(server)
    session = await c.create()
    sid = session.session_id
    ids = [prompt_id(await c.prompt(sid, p)) for p in (P0, P1)]
    await server.stop()
    await server.start(fault=step)  # the next write of the index is the third turn's
    c = client_of(server)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await c.prompt(sid, P2)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert await server.wait() == -9
    before = _rebuilds(server)
    await server.start()
    c = client_of(server)
    found = await c.points(sid)
    third = next(e["uuid"] for e in transcript_entries(server.state_dir, sid) if _prompt_of(e) == P2)
    assert [p.message_id for p in found.points] == [*ids, third]
    assert _rebuilds(server) == before, "read from the tail, not the whole transcript"
    assert _indexed(server, sid) == [*ids, third], "the ledger's index holds it now"
    # And the owner's view, once it reads the whole transcript, agrees.
    assert await c.recall(sid) == [P0, P1, P2, "recall"]
    assert [p.message_id for p in (await c.points(sid)).points][:3] == [*ids, third]


def _indexed(server: ServerProcess, sid: str) -> list[str]:
    db = sqlite3.connect(server.state_dir / "ledger.sqlite3")
    try:
        rows = db.execute("SELECT message_id FROM points WHERE session_id = ? ORDER BY idx", (sid,))
        return [r[0] for r in rows]
    finally:
        db.close()


def _prompt_of(entry: dict[str, Any]) -> str:
    message = entry.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, str) and entry.get("type") == "user" else ""


async def test_a_transcript_cut_short_under_the_index_never_shows_a_point_it_lost(
    server: ServerProcess,
) -> None:
    """The transcript lost its last turn while the server was down (a restore from backup, a
    disk that lied): the index covers bytes the file no longer has, so it is rebuilt from the
    file, and the lost turn is no point (the index never shows what the transcript does not)."""
    await server.start()
    c = client_of(server)
    session = await c.create()
    sid = session.session_id
    ids = [prompt_id(await c.prompt(sid, P0))]
    path = _transcript(server, sid)
    size = path.stat().st_size
    await c.prompt(sid, P1)
    assert len((await c.points(sid)).points) == 2
    await server.stop()
    with path.open("r+b") as f:
        f.truncate(size)
    await server.start()
    assert [p.message_id for p in (await client_of(server).points(sid)).points] == ids


async def test_a_transcript_replaced_under_the_index_is_read_whole(server: ServerProcess) -> None:
    """Another file of the same length in its place (other content): the index is not trusted."""
    await server.start()
    c = client_of(server)
    session = await c.create()
    sid = session.session_id
    ids = [prompt_id(await c.prompt(sid, p)) for p in (P0, P1)]
    await server.stop()
    path = _transcript(server, sid)
    data = path.read_bytes()
    second = data.index(ids[1].encode())
    forged = data.replace(data[second : second + 36], str(uuid.uuid4()).encode())
    assert len(forged) == len(data)
    replacement = path.with_suffix(".new")
    replacement.write_bytes(forged)
    replacement.replace(path)
    before = _rebuilds(server)
    await server.start()
    found = await client_of(server).points(sid)
    assert ids[1] not in [p.message_id for p in found.points]
    assert _rebuilds(server) == before + 1
