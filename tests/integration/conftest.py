"""Fixtures the integration tests share."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agent_rewind.testing.server_process import ServerProcess
from tests.pgserver_fixture import PostgresServer


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL server (pgserver) for the tests of one module; each makes its databases."""
    server = PostgresServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[ServerProcess]:
    """A real server process (`agent-rewind serve`, its defaults) on the test's own state dir;
    `start()` it, kill it, start it again on the same state."""
    process = ServerProcess(tmp_path / "state")
    try:
        yield process
    finally:
        await process.close()


class _Answer(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"hello from {self.server.server_address[1]}".encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        return


@pytest.fixture
def web() -> Iterator[tuple[int, int]]:
    """Two HTTP servers on loopback, each answering `hello from PORT`: tests allow the first."""
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), _Answer) for _ in range(2)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield servers[0].server_address[1], servers[1].server_address[1]
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
