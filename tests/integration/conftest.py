"""Fixtures the integration tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.pgserver_fixture import PostgresServer


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL server (pgserver) for the tests of one module; each makes its databases."""
    server = PostgresServer()
    try:
        yield server
    finally:
        server.stop()
