"""The anchor beside the load: the SDK used directly for the same prompts, at the same number of
live clients (`python -m benchmarks.load.anchor`, a process of its own; `run` starts it).

`ClaudeSDKClient`s are started here with the options the service gives its own CLI processes
(`adapter.build_options`, as benchmarks/overhead.py does for its SDK rows: the bundled CLI, file
checkpointing, the permission callback and hook) and the environment it gives them
(`sandbox.environment.cli_environment`: a scripted model of this process's own, a dummy key), with a
CLAUDE_CONFIG_DIR and workspaces of their own. Two closed loops, each with as many workers as the
load has live-process slots:

- `live`: each worker keeps one client connected and sends it the load's prompts (mix.script), one
  after another: a prompt with nothing to start;
- `resumed`: the load's sessions (as many as its smallest run, one warm-up turn each, untimed),
  each worker taking one no other worker holds, starting a client that resumes it, sending one
  prompt, and disconnecting: what the service does for a Prompt to a hibernated session, timed
  from before the client starts to the result.

What the SDK does not do that the service does: commands run unconfined (the service runs them in
its sandbox, and the CLI under Landlock), no workspace snapshots, no ledger.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from claude_agent_sdk import ClaudeSDKClient, ResultMessage, UserMessage

from agent_rewind.sandbox.environment import cli_environment
from agent_rewind.sessions.adapter import ClientSpec, build_options
from agent_rewind.sessions.options import OperatorOptions, validate
from agent_rewind.sessions.policy import ToolPolicy
from agent_rewind.testing import ScriptedModel
from benchmarks.common import Report, fmt_time, percentile
from benchmarks.load import mix
from benchmarks.load.model import SessionModel


class Sdk:
    def __init__(self, root: Path, model: ScriptedModel) -> None:
        self.root = root
        (root / "home").mkdir(parents=True)
        self.env = cli_environment(
            os.environ,
            config_dir=str(root / "claude"),
            home=str(root / "home"),
            offline_model_url=model.base_url,
        )
        # What the service stores for a session created with Bash allowed (no command sandbox here).
        self.options = validate({"allowed_tools": ["Bash"]}, OperatorOptions(sandbox_hosts=None))

    def client(self, model: SessionModel, *, resume: bool) -> ClaudeSDKClient:
        spec = ClientSpec(
            session_id=model.session_id,
            cwd=model.cwd,
            options=self.options,
            checkpointing=True,
            env=self.env,
            resume=resume,
            stderr=lambda line: None,
        )
        return ClaudeSDKClient(build_options(spec, ToolPolicy(model.cwd, ["Bash"])))

    def new(self, i: int) -> SessionModel:
        import uuid

        cwd = self.root / "workspaces" / str(i)
        cwd.mkdir(parents=True)
        return SessionModel(str(uuid.uuid4()), cwd)


async def turn(client: ClaudeSDKClient, model: SessionModel, rng: random.Random) -> None:
    script = mix.script(model, rng)
    await client.query(script.text)
    prompt_id = ""
    result: ResultMessage | None = None
    async for message in client.receive_response():
        if isinstance(message, UserMessage) and isinstance(message.content, str) and not prompt_id:
            prompt_id = message.uuid or ""
        if isinstance(message, ResultMessage):
            result = message
    if result is None or result.is_error:
        raise RuntimeError(f"SDK turn {script.text!r} did not run as scripted: {result}")
    model.shell_paths |= script.shell
    model.turn(prompt_id, script.text, script.writes, "")


def _cpu() -> tuple[float, float]:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


async def _live(sdk: Sdk, clients: int, seconds: float, rng: random.Random) -> dict[str, Any]:
    latencies: list[float] = []
    ready = asyncio.Barrier(clients + 1)
    go = asyncio.Event()
    deadline = [0.0]

    async def worker(i: int) -> None:
        model = sdk.new(1_000_000 + i)
        client = sdk.client(model, resume=False)
        await client.connect()
        try:
            await turn(client, model, rng)  # warm-up, untimed
            await ready.wait()
            await go.wait()
            while time.monotonic() < deadline[0]:
                start = time.perf_counter()
                await turn(client, model, rng)
                latencies.append(time.perf_counter() - start)
        finally:
            await client.disconnect()

    tasks = [asyncio.create_task(worker(i)) for i in range(clients)]
    await ready.wait()
    before, started = _cpu(), time.monotonic()
    deadline[0] = started + seconds
    go.set()
    await asyncio.gather(*tasks)
    return _row(
        "live", f"{clients} clients kept live, one prompt after another", latencies, before, started, 0
    )


async def _resumed(
    sdk: Sdk, clients: int, sessions: int, seconds: float, rng: random.Random
) -> dict[str, Any]:
    models = [sdk.new(i) for i in range(sessions)]
    gate = asyncio.Semaphore(clients)

    async def first(model: SessionModel) -> None:
        async with gate:
            client = sdk.client(model, resume=False)
            await client.connect()
            try:
                await turn(client, model, rng)
            finally:
                await client.disconnect()

    await asyncio.gather(*(first(m) for m in models))
    free = list(models)
    latencies: list[float] = []
    starts = 0
    deadline = time.monotonic() + seconds

    async def worker() -> None:
        nonlocal starts
        while time.monotonic() < deadline:
            if not free:  # (fewer sessions than clients)
                await asyncio.sleep(0.01)
                continue
            model = free.pop(rng.randrange(len(free)))
            try:
                start = time.perf_counter()
                client = sdk.client(model, resume=True)
                await client.connect()
                starts += 1
                try:
                    await turn(client, model, rng)
                    latencies.append(time.perf_counter() - start)
                finally:
                    await client.disconnect()
            finally:
                free.append(model)

    before, started = _cpu(), time.monotonic()
    await asyncio.gather(*(worker() for _ in range(clients)))
    return _row(
        "resumed",
        f"{sessions} sessions, {clients} clients at once, each prompt resuming its session in a new client",
        latencies,
        before,
        started,
        starts,
    )


def _row(
    key: str, title: str, latencies: list[float], before: tuple[float, float], started: float, starts: int
) -> dict[str, Any]:
    wall = time.monotonic() - started
    after = _cpu()
    n = max(1, len(latencies))
    return {
        "key": key,
        "title": title,
        "prompts": len(latencies),
        "per_s": len(latencies) / wall,
        "p50": percentile(latencies, 0.5),
        "p99": percentile(latencies, 0.99),
        "cpu_per_prompt_s": (after[0] - before[0]) / n,
        "cli_cpu_per_prompt_s": (after[1] - before[1]) / n,
        "starts_per_min": starts / (wall / 60),
        "errors": 0,
    }


async def _anchor(clients: int, sessions: int, seconds: float, seed: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="agent-rewind-load-sdk-"))
    rng = random.Random(seed)
    try:
        with ScriptedModel() as model:
            sdk = Sdk(root, model)
            live = await _live(sdk, clients, seconds, rng)
            resumed = await _resumed(sdk, clients, sessions, seconds, rng)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "clients": clients,
        "sessions": sessions,
        "seconds": seconds,
        "rows": [live, resumed],
        "notes": [
            "SDK anchor: ClaudeSDKClients in a process of their own with the service's options and CLI environment, "
            "the same prompts, as many at once as the load's live-process slots; commands unconfined, no snapshots, "
            "no ledger; CPU per prompt is that process's own (the SDK's side), CLI CPU that of its exited CLIs",
        ],
    }


async def run(*, clients: int, sessions: int, seconds: float, seed: int) -> dict[str, Any]:
    """The anchor, in a process of its own."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "benchmarks.load.anchor",
        "--clients",
        str(clients),
        "--sessions",
        str(sessions),
        "--seconds",
        str(seconds),
        "--seed",
        str(seed),
        stdout=asyncio.subprocess.PIPE,
        limit=1 << 26,
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"the SDK anchor failed (exit code {proc.returncode}); its stderr is above")
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


def report(anchored: dict[str, Any]) -> Report:
    out = Report(
        "The SDK used directly (the anchor)",
        [
            "how",
            "prompts",
            "prompts/s",
            "p50",
            "p99",
            "CPU per prompt (SDK process)",
            "CPU per prompt (its CLIs)",
        ],
    )
    for row in anchored["rows"]:
        out.rows.append(
            [
                row["title"],
                f"{row['prompts']:,}",
                f"{row['per_s']:.1f}",
                fmt_time(row["p50"]),
                fmt_time(row["p99"]),
                fmt_time(row["cpu_per_prompt_s"]),
                fmt_time(row["cli_cpu_per_prompt_s"]),
            ]
        )
    out.notes = list(anchored.get("notes", []))
    out.seconds = anchored["seconds"] * len(anchored["rows"])
    return out


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.load.anchor")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--sessions", type=int, default=50)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    result = asyncio.run(_anchor(a.clients, a.sessions, a.seconds, a.seed))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
