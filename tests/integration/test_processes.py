"""The process helper tests rely on sees CLI processes by what they are, not by their names."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from agent_rewind.sessions.adapter import cli_binary
from agent_rewind.testing.processes import cli_pids, cli_processes, descendants
from tests.integration.harness import serve


@contextmanager
def _idle_cli(config_dir: Path, argv0: str, *, detached: bool) -> Iterator[int]:
    """The bundled CLI waiting on its input, named `argv0`; detached: reparented away from us."""
    config_dir.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(config_dir),
        "CLAUDE_CONFIG_DIR": str(config_dir),
        "ANTHROPIC_API_KEY": "unused",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    command = f"exec -a {argv0} {cli_binary()} -p --input-format stream-json --output-format stream-json"
    if detached:  # the shell exits at once: the CLI's parent becomes init (or a subreaper)
        command = f"({command} < /dev/zero > /dev/null 2>&1 & echo $!)"
        pid = int(subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True).stdout)
        holder = None
    else:
        holder = subprocess.Popen(
            ["bash", "-c", command],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        pid = holder.pid
    # Until bash has exec'd the CLI, the process is bash.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if os.readlink(f"/proc/{pid}/exe") == str(cli_binary().resolve()):
                break
        except OSError:
            pass
        time.sleep(0.01)
    try:
        yield pid
    finally:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        if holder is not None:
            holder.wait()


def test_a_cli_named_after_the_project_is_still_a_cli(tmp_path: Path) -> None:
    # The old helper dropped every command line mentioning "agent-rewind", which every CLI of a
    # checkout named after the project has: it went blind.
    with _idle_cli(tmp_path / "c", "/home/me/agent-rewind/.venv/claude", detached=False) as pid:
        assert pid in cli_pids()
        assert pid in cli_pids(config_dir=tmp_path / "c")
        assert pid not in cli_pids(config_dir=tmp_path / "other")


def test_processes_that_only_mention_claude_are_not_clis(tmp_path: Path) -> None:
    decoy = subprocess.Popen(["sleep", "30", "claude", "--session-id", "s-1"])
    try:
        assert decoy.pid in descendants(os.getpid())
        assert decoy.pid not in cli_pids()
        assert cli_pids("s-1") == []
    finally:
        decoy.kill()
        decoy.wait()


def test_a_cli_left_behind_by_its_parent_is_found_by_its_config_dir(tmp_path: Path) -> None:
    with _idle_cli(tmp_path / "c", "claude", detached=True) as pid:
        assert pid not in cli_pids(), "not a descendant of this process any more"
        assert cli_pids(config_dir=tmp_path / "c") == [pid]


async def test_a_session_has_exactly_one_cli_process_below_the_server(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        first = await c.create()
        second = await c.create()
        mine = [p for p in cli_processes() if p.names(first.session_id)]
        assert len(mine) == 1
        assert os.readlink(f"/proc/{mine[0].pid}/exe") == str(cli_binary().resolve())
        # A config dir of its own, whose transcripts and file history are the shared ones.
        own = Path(mine[0].environ()["CLAUDE_CONFIG_DIR"])
        assert own == tmp_path / "sessions" / first.session_id / "config"
        assert (own / "projects").resolve() == (tmp_path / "claude" / "projects").resolve()
        assert cli_pids(first.session_id, config_dir=tmp_path / "claude") == [mine[0].pid]
        assert len(cli_pids(second.session_id)) == 1
        assert set(cli_pids()) >= set(cli_pids(first.session_id) + cli_pids(second.session_id))
    await asyncio.sleep(0)
    assert cli_pids(first.session_id) == [] and cli_pids(second.session_id) == []
