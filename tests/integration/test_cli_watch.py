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
# Every wait is on a line or an exit, bounded by this; nothing sleeps a fixed time.
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
