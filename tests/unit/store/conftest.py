"""Every ledger implementation, so the contract tests run against each."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from agent_rewind.store.ledger import Ledger
from agent_rewind.store.postgres import PostgresLedger
from agent_rewind.store.sqlite import SqliteLedger
from tests.pgserver_fixture import PostgresServer


async def _migrate(url: str) -> None:
    await (await PostgresLedger.open(url)).close()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One real PostgreSQL server for the whole run (initdb and start: a second or two), with a
    template database the ledger has migrated already: a test's database is a copy of it.
    Synchronous, so the `ledger` fixture can ask for it only when its parameter is postgres; the
    migration runs on an event loop of its own, in a thread."""
    server = PostgresServer()
    try:
        migrated = server.create_database()
        with concurrent.futures.ThreadPoolExecutor(1) as thread:
            thread.submit(asyncio.run, _migrate(server.url(migrated))).result()
        server.migrated = migrated
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A database of the test's own, at the newest schema, dropped after it."""
    name = postgres_server.create_database(postgres_server.migrated)
    try:
        yield postgres_server.url(name)
    finally:
        postgres_server.drop_database(name)


@pytest.fixture
def empty_postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A database of the test's own, empty (no schema yet), dropped after it."""
    name = postgres_server.create_database()
    try:
        yield postgres_server.url(name)
    finally:
        postgres_server.drop_database(name)


@pytest.fixture(params=["sqlite", "postgres"])
async def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Ledger]:
    db: Ledger
    if request.param == "postgres":
        db = await PostgresLedger.open(request.getfixturevalue("postgres_url"))
    else:
        db = await SqliteLedger.open(tmp_path / "state" / "ledger.sqlite3")
    try:
        yield db
    finally:
        await db.close()
