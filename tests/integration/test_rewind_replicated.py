"""The rewind integration tests of test_rewind.py again, on three replicas of one deployment
(one PostgreSQL database, three servers on loopback): each test's sessions are created on
replica-0, and every other call goes to replica-1, which owns none of them and forwards each
(but ListRewindPoints, which it answers from the ledger's points index). A restart within a test restarts the three on the same database and state dirs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from agent_rewind import metrics
from tests.integration import test_rewind
from tests.integration.harness import Client, replicas, through
from tests.pgserver_fixture import PostgresServer

# Every test of test_rewind.py but the one about a single server's capabilities (replicas':
# test_replicas.py).
_SINGLE_SERVER = {"test_capabilities_describe_this_deployment"}
globals().update(
    {
        name: test
        for name, test in vars(test_rewind).items()
        if name.startswith("test_") and callable(test) and name not in _SINGLE_SERVER
    }
)


@pytest.fixture(autouse=True)
def _through_a_replica_that_owns_nothing(monkeypatch: pytest.MonkeyPatch, postgres: PostgresServer) -> None:
    databases: dict[Path, str] = {}

    @asynccontextmanager
    async def serve(state_dir: Path, **overrides: Any) -> AsyncIterator[Client]:
        if state_dir not in databases:
            databases[state_dir] = postgres.url(postgres.create_database())
        async with replicas(state_dir, databases[state_dir], **overrides) as (owner, other, _):
            points = metrics.FORWARDED_RPCS.labels("ListRewindPoints")._value.get()
            yield through(owner, other)
            assert other.running is not None and not other.running.registry.workers, "it owns none"
            # So every call about a session was forwarded to the owner, but ListRewindPoints,
            # which any replica answers from the ledger's points index.
            assert metrics.FORWARDED_RPCS.labels("ListRewindPoints")._value.get() == points

    monkeypatch.setattr(test_rewind, "serve", serve)
