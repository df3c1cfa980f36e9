"""`agent-rewind serve` as a separate process, for crash tests and soak runs.

The server runs in a process group of its own, so a test can SIGKILL the server alone or the
server with every CLI process it started (as when a pod is killed for memory), restart it on the
same state dir, and look at what survived. Faults are injected with `agent_rewind.faults`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc

from agent_rewind.api.v1 import (
    rewind_service_pb2_grpc,
    session_service_pb2_grpc,
)
from agent_rewind.testing.processes import cli_pids


class ServerProcess:
    """One server process on a state dir; `start()` again after it died reuses the state dir."""

    def __init__(
        self,
        state_dir: Path,
        *,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.state_dir = state_dir.resolve()
        self.args = list(args)
        self.env = dict(env or {})
        self.log_path = self.state_dir / "server.log"
        self.proc: asyncio.subprocess.Process | None = None
        self.address = ""
        self.channel: grpc.aio.Channel | None = None
        self.sessions: session_service_pb2_grpc.SessionServiceStub | None = None
        self.rewinds: rewind_service_pb2_grpc.RewindServiceStub | None = None
        self.starts = 0
        self._killed = False  # the running process was sent SIGKILL

    @property
    def config_dir(self) -> Path:
        return self.state_dir / "claude"

    async def start(self, *, fault: str = "", fault_scope: str = "", ready_within: float = 60.0) -> None:
        """Starts the server (with a fault armed, if given) and waits until it serves."""
        if self.proc is not None and self.proc.returncode is None and self._killed:
            # Killed, but its exit not reaped yet (the event loop learns of it a moment later).
            await asyncio.wait_for(self.proc.wait(), 30)
        assert self.proc is None or self.proc.returncode is not None, "already running"
        self._killed = False
        self.state_dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_REWIND_", "ANTHROPIC_"))}
        env.update(self.env)
        if fault:
            env["AGENT_REWIND_FAULT"] = fault
        if fault_scope:
            env["AGENT_REWIND_FAULT_SCOPE"] = fault_scope
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        command = [
            str(Path(sys.executable).parent / "agent-rewind"),
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--state-dir",
            str(self.state_dir),
            *(() if "--model" in self.args else ("--model", "offline")),
            # No 64 MiB reserve file in every test's state dir, unless a test asks for one.
            *(() if "--storage-reserve" in self.args else ("--storage-reserve", "0")),
            "--log-format",
            "json",
            "--idle-timeout",
            "0",
            *self.args,
        ]
        with self.log_path.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
                start_new_session=True,
            )
        self.starts += 1
        self.address = await self._wait_serving(offset, ready_within)
        await self._connect()

    async def _wait_serving(self, offset: int, within: float) -> str:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.returncode is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}: see {self.log_path}")
            with self.log_path.open("rb") as f:
                f.seek(offset)
                for line in f.read().splitlines():
                    try:
                        entry = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(entry, dict) and entry.get("event") == "serving":
                        return str(entry["address"])
            await asyncio.sleep(0.05)
        raise TimeoutError(f"the server did not serve within {within}s: see {self.log_path}")

    async def _connect(self) -> None:
        await self._disconnect()
        self.channel = grpc.aio.insecure_channel(self.address)
        self.sessions = session_service_pb2_grpc.SessionServiceStub(self.channel)
        self.rewinds = rewind_service_pb2_grpc.RewindServiceStub(self.channel)

    async def _disconnect(self) -> None:
        if self.channel is not None:
            await self.channel.close()
            self.channel = None

    async def wait(self, within: float = 60.0) -> int:
        """Waits for the process to exit; its exit code (-9 for SIGKILL)."""
        assert self.proc is not None
        code = await asyncio.wait_for(self.proc.wait(), within)
        await self._disconnect()
        return code

    def kill(self, *, with_cli: bool = True) -> None:
        """SIGKILL: the server and every CLI process it started, or the server alone."""
        if self.proc is None or self.proc.returncode is not None:
            return
        self._killed = True
        if with_cli:
            os.killpg(self.proc.pid, signal.SIGKILL)
        else:
            self.proc.kill()

    async def stop(self, within: float = 60.0) -> int:
        """SIGTERM, then the exit code."""
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        return await self.wait(within)

    async def close(self) -> None:
        """Ends everything this object started, whatever state it is in (for test teardown)."""
        self.kill(with_cli=True)
        if self.proc is not None:
            await self.proc.wait()
        await self._disconnect()
        for pid in cli_pids(config_dir=self.config_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def log_lines(self) -> list[dict[str, object]]:
        """Every JSON log line the server wrote, over all its starts."""
        out = []
        if self.log_path.exists():
            for line in self.log_path.read_bytes().splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if isinstance(entry, dict):
                    out.append(entry)
        return out
