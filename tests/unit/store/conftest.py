"""Every ledger implementation, so the contract tests run against each."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent_rewind.store.ledger import Ledger
from agent_rewind.store.sqlite import SqliteLedger


@pytest.fixture(params=["sqlite"])
async def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Ledger]:
    db = await SqliteLedger.open(tmp_path / "state" / "ledger.sqlite3")
    try:
        yield db
    finally:
        await db.close()
