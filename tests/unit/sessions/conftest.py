"""The session worker's fixtures: `ledger`, the SQLite ledger in tmp_path that fails or waits
on demand (harness.FlakyLedger), and `make_worker`, which makes SessionWorkers over it with a fake
client factory and shuts each down when the test ends."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from agent_rewind.rewind.intent import undo_trees
from agent_rewind.sessions.live import LiveSlots
from agent_rewind.sessions.worker import SessionWorker, WorkerContext
from agent_rewind.snapshots.taking import Snapshots
from agent_rewind.storage.retention import Retention
from agent_rewind.store.ledger import NewSession
from agent_rewind.store.sqlite import SqliteLedger
from agent_rewind.testing.fake_agent import FakeFactory
from tests.unit.sessions.harness import CLI_ENV, FlakyLedger, MakeWorker


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[FlakyLedger]:
    inner = await SqliteLedger.open(tmp_path / "ledger.sqlite3")
    yield FlakyLedger(inner)
    await inner.close()


@pytest.fixture
async def make_worker(tmp_path: Path, ledger: FlakyLedger) -> AsyncIterator[MakeWorker]:
    workers: list[SessionWorker] = []

    async def make(
        *,
        options: dict[str, Any] | None = None,
        checkpointing: bool = True,
        idle_timeout: float = 0.0,
        interrupt_timeout: float = 5.0,
        factory: FakeFactory | None = None,
        session_id: str | None = None,
        resolve_pending: Callable[[SessionWorker], Awaitable[None]] | None = None,
        project_settings: bool = False,
        live: LiveSlots | None = None,
        replica_id: str = "",
        snapshots: Snapshots | None = None,
        snapshot_retention: int = 0,
    ) -> tuple[SessionWorker, FakeFactory]:
        sid = session_id or str(uuid.uuid4())
        record = await ledger.session(sid)
        if record is None:
            cwd = tmp_path / "workspaces" / sid
            cwd.mkdir(parents=True, exist_ok=True)
            record = await ledger.add_session(NewSession(sid, str(cwd), options or {}, checkpointing))
        factory = factory or FakeFactory()
        factory.config_dir = tmp_path / "claude"
        extra: dict[str, Any] = {} if resolve_pending is None else {"resolve_pending": resolve_pending}
        ctx = WorkerContext(
            ledger=ledger,  # type: ignore[arg-type]
            client_factory=factory,
            cli_env=CLI_ENV,
            claude_config_dir=tmp_path / "claude",
            idle_timeout=idle_timeout,
            interrupt_timeout=interrupt_timeout,
            project_settings=project_settings,
            live=live,
            replica_id=replica_id,
            snapshots=snapshots,
            retention=Retention(snapshot_retention),
            rewind_trees=undo_trees,
            **extra,
        )
        worker = SessionWorker(record, ctx)
        workers.append(worker)
        return worker, factory

    yield make
    ledger.fail.clear()
    for gate in ledger.gates.values():
        gate.set()
    for worker in workers:
        await worker.shutdown(0)
