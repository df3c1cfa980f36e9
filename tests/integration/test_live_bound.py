"""The bound on live CLI processes (--max-live-sessions), counted by asking the operating system."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from agent_rewind.api.v1 import rewind_service_pb2, session_pb2, session_service_pb2
from agent_rewind.testing.processes import cli_processes
from tests.integration.harness import FILES, Client, cli_pids, error_info, prompt_id, read, serve

HIBERNATED = session_pb2.SESSION_STATE_HIBERNATED


@dataclass
class _Peak:
    count: int = 0
    processes: list[str] = field(default_factory=list)


@contextlib.asynccontextmanager
async def _most_processes(config_dir: Path) -> AsyncIterator[_Peak]:
    """Samples the server's CLI processes every few milliseconds; yields the most seen at once."""
    peak = _Peak()
    stop = asyncio.Event()

    async def sample() -> None:
        while not stop.is_set():
            now = cli_processes(config_dir=config_dir)
            if len(now) > peak.count:
                peak.count = len(now)
                # Which processes, should the bound ever be exceeded: their pids, parents, sessions.
                peak.processes = [f"{p.pid} (parent {p.ppid}): {' '.join(p.argv[-6:])}" for p in now]
            await asyncio.sleep(0.005)

    task = asyncio.create_task(sample())
    try:
        yield peak
    finally:
        stop.set()
        await task


def _starts(c: Client, session_id: str) -> int:
    """How many CLI processes the server has started for the session."""
    assert c.running is not None
    return c.running.registry.get(session_id).process.starts


async def test_five_sessions_in_turn_never_hold_more_than_two_processes(tmp_path: Path) -> None:
    async with serve(tmp_path, max_live_sessions=2) as c:
        assert c.running is not None
        config_dir = c.running.config.claude_config_dir
        async with _most_processes(config_dir) as peak:
            sessions = [await c.create() for _ in range(5)]
            ids: dict[str, list[str]] = {s.session_id: [] for s in sessions}
            for round_ in range(2):
                for s in sessions:
                    events = await c.prompt(s.session_id, f"write r{round_}.txt {s.session_id[:8]}")
                    ids[s.session_id].append(prompt_id(events))
            for s in sessions:
                result = await c.rewind(s.session_id, ids[s.session_id][1], FILES)
                assert result.files.can_rewind
                assert read(Path(s.cwd) / "r0.txt") == f"{s.session_id[:8]}\n"
                assert read(Path(s.cwd) / "r1.txt") is None
        assert peak.count <= 2, f"{peak.count} CLI processes at once: {peak.processes}"
        assert len(cli_pids(config_dir=config_dir)) <= 2
        # The least recently used are hibernated; their points are read with no process started.
        hibernated = [s for s in sessions if (await c.get(s.session_id)).state == HIBERNATED]
        assert len(hibernated) == 3
        for s in hibernated:
            before = _starts(c, s.session_id)
            points = await c.points(s.session_id)
            assert [p.message_id for p in points.points] == ids[s.session_id]
            assert _starts(c, s.session_id) == before and not cli_pids(s.session_id)


def _transcript(state: Path, session_id: str) -> bytes:
    (path,) = (state / "claude" / "projects").glob(f"*/{session_id}.jsonl")
    return path.read_bytes()


@pytest.mark.parametrize("wait", [0.0, 0.5])
async def test_when_every_slot_runs_a_turn_the_call_is_live_sessions_exhausted(
    tmp_path: Path, wait: float
) -> None:
    """At once with --live-session-wait 0; after the wait otherwise. A refused call leaves the
    session as it was: its transcript untouched (nothing is readied for a process that never
    starts)."""
    async with serve(tmp_path, max_live_sessions=1, live_session_wait=wait) as c:
        busy, waiting = await c.create(), await c.create()
        point = prompt_id(await c.prompt(waiting.session_id, "write a.txt v0"))
        long_turn = asyncio.create_task(c.prompt(busy.session_id, "sleep 5\nsay done"))
        await c.wait_for_state(busy.session_id, session_pb2.SESSION_STATE_RUNNING)
        before = _transcript(tmp_path, waiting.session_id)
        for call in (
            c.prompt(waiting.session_id, "say hello"),
            c.dry_run(waiting.session_id, point, FILES),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            info = error_info(err.value)
            assert (info.reason, info.metadata["max_live_sessions"]) == ("LIVE_SESSIONS_EXHAUSTED", "1")
        assert _transcript(tmp_path, waiting.session_id) == before
        # Reading needs no process; creating one more is not refused (it starts on first use).
        assert (await c.points(waiting.session_id)).points
        extra = await c.create()
        assert (await c.get(extra.session_id)).state == HIBERNATED
        await long_turn
        # Retryable: once the turn ended, the slot goes to whoever asks.
        events = await c.prompt(waiting.session_id, "say hello again")
        assert events[-1].result.result == "hello again"
        assert len(cli_pids(config_dir=tmp_path / "claude")) == 1


async def test_a_prompt_that_finds_every_slot_busy_waits_for_one_first_come_first_served(
    tmp_path: Path,
) -> None:
    async with serve(tmp_path, max_live_sessions=1, live_session_wait=60) as c:
        busy, first, second = await c.create(), await c.create(), await c.create()
        long_turn = asyncio.create_task(c.prompt(busy.session_id, "sleep 2\nsay done"))
        await c.wait_for_state(busy.session_id, session_pb2.SESSION_STATE_RUNNING)
        answered: list[str] = []

        async def ask(session_id: str, text: str) -> None:
            events = await c.prompt(session_id, f"sleep 1\nsay {text}")
            assert events[-1].result.result == text
            answered.append(text)

        waiting = [asyncio.create_task(ask(first.session_id, "first"))]
        await asyncio.sleep(0.5)
        waiting.append(asyncio.create_task(ask(second.session_id, "second")))
        await asyncio.sleep(0.5)
        assert not long_turn.done() and answered == [], "both wait while the slot runs a turn"
        await asyncio.gather(long_turn, *waiting)
        assert answered == ["first", "second"]
        assert len(cli_pids(config_dir=tmp_path / "claude")) == 1


async def test_deleting_a_session_whose_prompt_waits_for_a_slot_ends_the_wait_at_once(tmp_path: Path) -> None:
    """The queued prompt is SESSION_NOT_FOUND as soon as the deletion begins: neither waits out
    --live-session-wait, and no process of the deleted session ever starts."""
    async with serve(tmp_path, max_live_sessions=1, live_session_wait=60) as c:
        busy, doomed = await c.create(), await c.create()
        long_turn = asyncio.create_task(c.prompt(busy.session_id, "sleep 20\nsay done"))
        await c.wait_for_state(busy.session_id, session_pb2.SESSION_STATE_RUNNING)
        queued = asyncio.create_task(c.prompt(doomed.session_id, "say never"))
        await asyncio.sleep(0.5)
        assert not queued.done()
        started = asyncio.get_running_loop().time()
        delete = session_service_pb2.DeleteSessionRequest(session_id=doomed.session_id)
        await asyncio.wait_for(c.sessions.DeleteSession(delete), 10)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await asyncio.wait_for(queued, 10)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert error_info(err.value).reason == "SESSION_NOT_FOUND"
        assert asyncio.get_running_loop().time() - started < 10 and not long_turn.done()
        assert not cli_pids(doomed.session_id)
        long_turn.cancel()


async def test_a_burst_of_calls_to_a_hibernated_session_resumes_it_once(tmp_path: Path) -> None:
    async with serve(tmp_path, max_live_sessions=1) as c:
        target, other = await c.create(), await c.create()
        point = prompt_id(await c.prompt(target.session_id, "write a.txt v0"))
        await c.prompt(other.session_id, "say take the slot")
        assert (await c.get(target.session_id)).state == HIBERNATED
        before = _starts(c, target.session_id)
        caps = await c.rewinds.GetCapabilities(rewind_service_pb2.GetCapabilitiesRequest())
        assert caps.max_live_sessions == 1
        results = await asyncio.gather(*(c.dry_run(target.session_id, point, FILES) for _ in range(8)))
        assert all(r.files.can_rewind for r in results)
        assert _starts(c, target.session_id) == before + 1
