"""`make demo` as a newcomer runs it (issue "Deployable", 5): started at once with `make run`, it
waits for the server instead of failing, then every check of the tour passes against the real
CLI; with no server at all it says so after its wait, without a traceback."""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

from agent_rewind.testing.server_process import ServerProcess

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _demo(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "scripts" / "demo.py"),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def test_the_demo_started_before_the_server_waits_for_it_and_every_check_passes(tmp_path: Path) -> None:
    port = _free_port()
    demo = await _demo("--server", f"127.0.0.1:{port}")
    assert demo.stderr is not None
    said = await asyncio.wait_for(demo.stderr.readline(), 30)
    assert b"waiting for the server at" in said, said
    server = ServerProcess(tmp_path / "state", args=("--listen", f"127.0.0.1:{port}"))
    await server.start()
    try:
        out, err = await asyncio.wait_for(demo.communicate(), 120)
    finally:
        await server.stop()
    assert demo.returncode == 0, (out + err).decode()[-2000:]
    assert b"Every check passed." in out
    assert b"Traceback" not in err


async def test_the_demo_without_a_server_says_so_after_its_wait(tmp_path: Path) -> None:
    port = _free_port()
    demo = await _demo("--server", f"127.0.0.1:{port}", "--wait", "1")
    _out, err = await asyncio.wait_for(demo.communicate(), 60)
    assert demo.returncode == 1
    assert f"no agent-rewind server is serving at 127.0.0.1:{port} after 1 s".encode() in err
    assert b"Traceback" not in err
