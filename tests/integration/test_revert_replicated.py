"""The revert and paths tests of test_revert.py again, on three replicas of one deployment (one
PostgreSQL database): each test's sessions are created on replica-0, and every other call goes to
replica-1, which owns none of them and forwards each (test_rewind_replicated.py does the same for
the rewind tests)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from agent_rewind import metrics
from tests.integration import test_revert
from tests.integration.harness import Client, replicas, through
from tests.pgserver_fixture import PostgresServer

globals().update(
    {name: test for name, test in vars(test_revert).items() if name.startswith("test_") and callable(test)}
)


@pytest.fixture(autouse=True)
def _through_a_replica_that_owns_nothing(monkeypatch: pytest.MonkeyPatch, postgres: PostgresServer) -> None:
    @asynccontextmanager
    async def serve(state_dir: Path, **overrides: Any) -> AsyncIterator[Client]:
        database = postgres.url(postgres.create_database())
        async with replicas(state_dir, database, **overrides) as (owner, other, _):
            forwarded = metrics.FORWARDED_RPCS.labels("Rewind")._value.get()
            yield through(owner, other)
            assert other.running is not None and not other.running.registry.workers, "it owns none"
            assert metrics.FORWARDED_RPCS.labels("Rewind")._value.get() > forwarded, (
                "the rewinds were forwarded"
            )

    monkeypatch.setattr(test_revert, "serve", serve)
