"""The TypeScript example of docs/generating-clients.md, run as it is: `npx buf generate` with a local
protoc-gen-es from npm writes code from protos/, and client.mjs calls a real server with it over
gRPC (Connect's gRPC transport): capabilities, a session, two turns, a files rewind.

Node.js 20+ and npm must be on PATH (as for tests/integration/test_node_client.py): without them
the test fails, it does not skip."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from agent_rewind.testing.server_process import ServerProcess

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "typescript-client"
PROTOS = Path(__file__).resolve().parents[2] / "protos"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"`{name}` is not on PATH: the TypeScript example needs Node.js 20+ and npm", pytrace=False
        )
    return path


@contextlib.contextmanager
def _lock() -> Iterator[None]:
    """One install and generation at a time in the example's folder, whichever run starts it."""
    key = hashlib.sha256(str(EXAMPLE).encode()).hexdigest()[:12]
    with open(Path(tempfile.gettempdir()) / f"agent-rewind-npm-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, cwd=EXAMPLE, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"`{' '.join(command)}` failed:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def generated() -> Path:
    """The example's dependencies as its package-lock.json pins them, and gen/ written afresh."""
    npm, npx = _tool("npm"), _tool("npx")
    lock_digest = hashlib.sha256((EXAMPLE / "package-lock.json").read_bytes()).hexdigest()[:16]
    stamp = EXAMPLE / "node_modules" / f".agent-rewind-lock-{lock_digest}"
    with _lock():
        if not stamp.exists():
            installed = _run([npm, "ci", "--no-audit", "--no-fund"])
            # package.json's allowScripts denies @bufbuild/buf's postinstall (its launcher works
            # without it), so npm 11 has no script to warn about.
            assert "install-scripts" not in installed.stderr, installed.stderr
            stamp.touch()
        shutil.rmtree(EXAMPLE / "gen", ignore_errors=True)
        _run([npx, "buf", "generate"])
    gen = EXAMPLE / "gen" / "agent_rewind" / "v1"
    assert sorted(p.name for p in gen.glob("*_pb.js")) == sorted(
        f"{p.stem}_pb.js" for p in PROTOS.rglob("*.proto")
    )
    return gen


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[ServerProcess]:
    process = ServerProcess(tmp_path / "state")
    try:
        await process.start()
        yield process
    finally:
        await process.close()


async def test_the_generated_typescript_code_calls_the_server(generated: Path, server: ServerProcess) -> None:
    done = await asyncio.to_thread(
        subprocess.run,
        [_tool("node"), "client.mjs"],
        cwd=EXAMPLE,
        env={"PATH": "/usr/bin:/bin", "AGENT_REWIND_SERVER": server.address},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n(server log: {server.log_path})"
    *turns, summary = done.stdout.strip().splitlines()
    assert turns == ["turn success", "turn success"], done.stdout
    said = json.loads(summary)
    assert (said["modelBackend"], said["points"]) == ("offline", 2), said
    assert [Path(p).name for p in said["filesChanged"]] == ["a.txt"], said
