"""`agent-rewind watch` as a process against a real server: it replays the events after its
cursor, says when it has caught up, prints a live event the moment it happens, and exits 130 on
Ctrl-C saying where to resume."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.integration.harness import FILES, prompt_id, serve

CLI = Path(sys.executable).parent / "agent-rewind"
# Every wait is on a line, an exit or the process's quiet, bounded by this; none sleeps a fixed time.
WITHIN = 10.0


@contextmanager
def _sigint_reaches_children() -> Iterator[None]:
    """A child inherits an ignored SIGINT (a test run in the background of a shell without job
    control ignores it), and Python then raises no KeyboardInterrupt: undo that while spawning."""
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if previous is signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def _cpu_ticks(pid: int) -> tuple[str, int]:
    """A process's state letter and the CPU time its threads used, in clock ticks (/proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return fields[0], int(fields[11]) + int(fields[12])


async def _waiting(pid: int) -> None:
    """Until the process sleeps and spends no CPU for a while: it printed a line, took its cursor
    and waits for the next response. (A Ctrl-C that lands between a line's write and the cursor
    taken after it names the cursor before: on resume that event comes again, none is lost; the
    test means the Ctrl-C of someone who read the line.)"""
    deadline = asyncio.get_running_loop().time() + WITHIN
    last = _cpu_ticks(pid)
    while asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.1)
        now = _cpu_ticks(pid)
        if now == last and now[0] == "S":
            return
        last = now
    raise AssertionError("the watch never sat waiting for the next event")


async def _line(proc: asyncio.subprocess.Process) -> str:
    assert proc.stdout is not None
    raw = await asyncio.wait_for(proc.stdout.readline(), WITHIN)
    assert raw, "watch closed its stdout"
    return raw.decode("utf-8").rstrip("\n")


async def test_watch_after_0_replays_catches_up_follows_live_and_exits_130_on_ctrl_c(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        assert c.running is not None
        sid = (await c.create()).session_id
        ids = [prompt_id(await c.prompt(sid, p)) for p in ("write a.txt v0", "edit a.txt v0 => v1")]
        # Files rewinds to alternate points: each one changes a.txt, each one is an event.
        replayed = [await c.rewind(sid, ids[1], FILES), await c.rewind(sid, ids[0], FILES)]

        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_REWIND_")}
        env["PYTHONIOENCODING"] = "utf-8"
        with _sigint_reaches_children():
            proc = await asyncio.create_subprocess_exec(
                str(CLI),
                "watch",
                "--server",
                c.running.address,
                "--after",
                "0",
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
            )
        try:
            for cursor, result in enumerate(replayed, start=1):
                line = await _line(proc)
                assert line.startswith(f"cursor {cursor} · "), line
                assert (
                    f" · REWOUND · session {sid} · rewind {result.rewind_id} · mode files · message "
                    f"{ids[2 - cursor]} · 1 file changed " in line
                ), line
                assert line.endswith(" · messages dropped: 0 · by local"), line
            assert await _line(proc) == "caught up at cursor 2; following live events"

            live = await c.rewind(sid, ids[1], FILES)
            line = await _line(proc)
            assert line.startswith("cursor 3 · ") and f" · rewind {live.rewind_id} · " in line, line

            await _waiting(proc.pid)
            proc.send_signal(signal.SIGINT)
            assert await asyncio.wait_for(proc.wait(), WITHIN) == 130
            assert proc.stdout is not None and proc.stderr is not None
            assert await proc.stdout.read() == b"", "nothing printed after the live event"
            stderr = (await proc.stderr.read()).decode()
            assert stderr.splitlines() == ["stopped watching; resume with --after 3"], stderr
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
