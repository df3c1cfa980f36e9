"""PointPages (rpc/pages.py): ListRewindPoints' encoded page, kept per session while what it
shows is the same, and dropped with the session's view."""

from __future__ import annotations

import gc
import weakref
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent_rewind.rpc.pages import PointPages
from agent_rewind.sessions.worker import SessionWorker, WorkerContext
from agent_rewind.store.ledger import SessionRecord
from agent_rewind.testing.fake_agent import FakeFactory

SNAPSHOTS: dict[str, bool] = {}


def _worker(tmp_path: Path, sid: str = "0b7f3c1e-5a8d-4d6e-9f10-2a3b4c5d6e7f") -> SessionWorker:
    now = datetime.now(UTC)
    record = SessionRecord(
        session_id=sid,
        cwd=str(tmp_path),
        options={},
        checkpointing=True,
        create_time=now,
        update_time=now,
        closed=False,
        started=False,
    )
    ctx = WorkerContext(
        ledger=None,  # type: ignore[arg-type]  # never reached here
        client_factory=FakeFactory(config_dir=tmp_path),
        cli_env={},
        claude_config_dir=tmp_path,
        idle_timeout=0,
    )
    return SessionWorker(record, ctx)


def test_a_page_is_served_again_only_for_the_same_view_and_key(tmp_path: Path) -> None:
    pages, worker = PointPages(), _worker(tmp_path)
    view: Any = object()
    pages.put(worker, view, (0, 100), b"page", SNAPSHOTS)
    assert pages.get(worker, view, (0, 100)) == b"page"
    assert pages.get(worker, view, (100, 100)) is None, "another page"
    assert pages.get(worker, object(), (0, 100)) is None, "the transcript changed: a new view"
    assert pages.get(_worker(tmp_path), view, (0, 100)) is None, "another session"


def test_a_page_goes_when_the_session_frees_its_view(tmp_path: Path) -> None:
    pages, worker = PointPages(), _worker(tmp_path)
    view: Any = object()
    pages.put(worker, view, (0, 100), b"page", SNAPSHOTS)
    worker.forget()  # hibernated (or deleted)
    assert pages.get(worker, view, (0, 100)) is None
    pages.put(worker, view, (0, 100), b"again", SNAPSHOTS)
    assert pages.get(worker, view, (0, 100)) == b"again", "kept again once asked again"
    worker.forget()
    assert pages.get(worker, view, (0, 100)) is None


def test_a_page_does_not_keep_a_dropped_worker(tmp_path: Path) -> None:
    """A session forgotten here (deleted, moved to another replica) takes its page with it."""
    pages, worker = PointPages(), _worker(tmp_path)
    view: Any = object()
    pages.put(worker, view, (0, 100), b"page", SNAPSHOTS)
    dropped = weakref.ref(worker)
    del worker
    gc.collect()
    assert dropped() is None
