"""Status (sessions/status.py): what a session worker accepts, and every change of it."""

from __future__ import annotations

from pathlib import Path

import structlog

from agent_rewind.sessions.adapter import ClientSpec
from agent_rewind.sessions.process import AgentProcess
from agent_rewind.sessions.status import Phase, State, Status
from agent_rewind.sessions.turns import Turn
from agent_rewind.testing.fake_agent import FakeFactory

SID = "0b7f3c1e-5a8d-4d6e-9f10-2a3b4c5d6e7f"


def _status(tmp_path: Path) -> Status:
    process = AgentProcess(SID, FakeFactory(config_dir=tmp_path), structlog.get_logger())
    return Status(process)


def test_a_new_session_is_open_hibernated_and_not_stopping(tmp_path: Path) -> None:
    status = _status(tmp_path)
    assert status.phase is Phase.OPEN and not status.gone and not status.deleted
    assert not status.turn_running and not status.stopping
    assert status.state(closed=False) == State.HIBERNATED
    assert status.state(closed=True) == State.CLOSED


def test_a_claimed_turn_shows_running_until_it_is_released(tmp_path: Path) -> None:
    status = _status(tmp_path)
    turn = Turn(SID, "hello")
    status.claim(turn)
    assert status.claimed is turn and status.turn_running
    assert status.state(closed=True) == State.RUNNING, "a turn reopens a closed session"
    status.release()
    assert status.claimed is None and status.state(closed=False) == State.HIBERNATED


def test_a_deletion_that_fails_before_its_commit_leaves_the_session_open(tmp_path: Path) -> None:
    status = _status(tmp_path)
    status.retire()
    assert status.phase is Phase.RETIRING and status.gone and not status.deleted
    status.retired()
    assert status.phase is Phase.OPEN and not status.gone and not status.stopping


def test_a_committed_deletion_is_for_good_and_no_process_starts_after_it(tmp_path: Path) -> None:
    status = _status(tmp_path)
    status.retire()
    status.delete()
    assert status.deleted and status.gone
    assert not status.stopping, "the erasure runs first, holding the lock, with no process"
    status.retired()
    assert status.phase is Phase.DELETED and status.stopping
    status.retire()
    assert status.phase is Phase.DELETED, "a deleted session is never retiring again"


def test_a_server_stop_stops_the_process_but_leaves_the_phase(tmp_path: Path) -> None:
    status = _status(tmp_path)
    status.stop()
    assert status.stopping and status.phase is Phase.OPEN and not status.gone


async def test_the_state_of_a_session_with_a_live_process_is_idle(tmp_path: Path) -> None:
    process = AgentProcess(SID, FakeFactory(config_dir=tmp_path), structlog.get_logger())
    status = Status(process)
    await process.start(
        ClientSpec(session_id=SID, cwd=tmp_path, options={}, checkpointing=True, env={}, resume=False)
    )
    assert status.state(closed=False) == State.IDLE
    assert status.state(closed=True) == State.CLOSED
