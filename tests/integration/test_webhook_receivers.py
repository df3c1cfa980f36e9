"""The receivers docs/events.md shows, in Python (`standardwebhooks` from PyPI) and Node.js
(`standardwebhooks` from npm), run as they are against a real server: each verifies what the
service signs (each with a different key of a rotation), refuses what it did not, and handles a
rewind, its undo and the session's deletion once each.

Node.js 20+ and npm must be on PATH (as for tests/integration/test_node_client.py): without them
the Node test fails, it does not skip."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import pytest

from agent_rewind.api.v1 import rewind_service_pb2, session_service_pb2
from agent_rewind.testing.server_process import ServerProcess
from agent_rewind.webhooks.secrets import new_key
from agent_rewind.webhooks.signing import Signer
from tests.integration.harness import FILES, client_of, prompt_id

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
NODE_DIR = EXAMPLES / "webhook-receiver"
OLD, NEW = new_key(), new_key()


@contextlib.contextmanager
def _npm_lock() -> Iterator[None]:
    with open(Path(tempfile.gettempdir()) / "agent-rewind-npm-webhook-receiver.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _node() -> str:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail("node and npm must be on PATH for the Node receiver example", pytrace=False)
    with _npm_lock():
        if not (NODE_DIR / "node_modules" / "standardwebhooks").is_dir():
            subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, check=True, timeout=300)
    return node


@contextlib.asynccontextmanager
async def _receiver(
    command: list[str], keys: str, cwd: Path
) -> AsyncIterator[tuple[str, asyncio.StreamReader]]:
    """The example running on a free port: its URL, and its output (one line per event handled)."""
    proc = await asyncio.create_subprocess_exec(
        *command,
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "WEBHOOK_SECRETS": keys, "PORT": "0", "PYTHONPATH": ":".join(sys.path)},
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        port = json.loads(await asyncio.wait_for(proc.stdout.readline(), 30))["listening"]
        yield f"http://127.0.0.1:{port}/agent-rewind", proc.stdout
    finally:
        proc.kill()
        await proc.wait()


async def _lines(out: asyncio.StreamReader, count: int) -> list[str]:
    async with asyncio.timeout(60):
        return [(await out.readline()).decode().strip() for _ in range(count)]


async def _forged(url: str) -> int:
    """A delivery signed by a key the receiver does not trust: its status."""
    body = json.dumps({"id": "999", "type": "agent_rewind.v1.session_deleted", "subject": "x", "data": {}})
    headers = Signer([new_key()]).headers("999", body, at=datetime.now(UTC))
    async with aiohttp.ClientSession() as http, http.post(url, data=body, headers=headers) as answer:
        return answer.status


@pytest.mark.parametrize("language", ["python", "node"])
async def test_the_documented_receiver_verifies_and_handles_each_event_once(
    tmp_path: Path, language: str
) -> None:
    if language == "python":
        command, keys, cwd = [sys.executable, str(EXAMPLES / "webhook_receiver.py")], OLD, tmp_path
    else:
        command, keys, cwd = [_node(), "receiver.mjs"], NEW, NODE_DIR
    secret_file = tmp_path / "webhook-keys"
    secret_file.write_text(f"{NEW}\n{OLD}\n")
    secret_file.chmod(0o600)
    async with _receiver(command, keys, cwd) as (url, out):
        assert await _forged(url) == 401
        server = ServerProcess(
            tmp_path / "state", args=["--webhook-url", url, "--webhook-secret-file", str(secret_file)]
        )
        try:
            await server.start()
            c = client_of(server)
            session = await c.create()
            sid = session.session_id
            ids = [prompt_id(await c.prompt(sid, f"write a.txt v{i}")) for i in range(2)]
            rewound = await c.rewind(sid, ids[1], FILES)
            undone = await c.rewinds.UndoRewind(
                rewind_service_pb2.UndoRewindRequest(session_id=sid, rewind_id=rewound.rewind_id)
            )
            await c.sessions.DeleteSession(session_service_pb2.DeleteSessionRequest(session_id=sid))
            assert await _lines(out, 3) == [
                f"rewound id=1 session={sid} rewind={rewound.rewind_id}",
                f"undone id=2 session={sid} rewind={undone.rewind_id}",
                f"session_deleted id=3 session={sid} rewind=",
            ]
        finally:
            await server.close()
