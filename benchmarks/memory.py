"""Benchmark 3: the memory a session holds, as the operating system reports it.

The real server runs in this process. Its CLI processes are those running the bundled Claude
Code binary with the server's CLAUDE_CONFIG_DIR, below this process or orphaned; a session's is
the one whose command line names its id (`agent_rewind.testing.processes`). Nothing here asks
the server which process it runs, and nothing waits for what is measured to happen: the samples
start the moment the call under test returns.

- a live session, idle after its turns: its CLI process tree's VmRSS, sampled for a while;
- a hibernated session, from the moment hibernating it (what the idle timer does) returned:
  no CLI process names it and it holds 0 KB, at every sample;
- a session right after a conversation `Rewind` returns: every 20 ms for 1.5 s, then right after
  the next prompt, at most one CLI process names it, and its resident memory stays within 1.5x
  a live session's (one process, not the old one and a new one);
- the server as a whole: no CLI process beyond one per session that holds one, and none left
  once it has stopped.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.common import Report, Target, fmt_kb, ratio_target
from benchmarks.service import CONVERSATION, Client, CliSnapshot, cli_snapshot, serve, watch_cli

# One process's memory, not two: two processes would hold about 2x.
MAX_REWOUND_OVER_LIVE = 1.5
EVERY_S = 0.02  # between samples
AFTER_REWIND_S = 1.5  # how long a rewound session is watched
LIVE_S = 0.5  # how long the live and the hibernated sessions are watched
TIMEOUT_S = 120.0
TURNS = ("write a.txt v0\nsay made a", "edit a.txt v0 => v1\nsay edited a", "say ping")


def _row(title: str, snaps: Sequence[CliSnapshot]) -> list[str]:
    rss = [s.session_rss_kb for s in snaps]
    return [
        title,
        str(len(snaps)),
        str(max(len(s.session_pids) for s in snaps)),
        str(max(len(s.server_pids) for s in snaps)),
        fmt_kb(statistics.median(rss)),
        fmt_kb(max(rss)),
        fmt_kb(max(s.session_hwm_kb for s in snaps)),
    ]


async def _session(c: Client) -> str:
    session = await c.create()
    for text in TURNS:
        await c.prompt(session.session_id, text)
    return str(session.session_id)


async def _measure(c: Client, rewinds: int) -> Report:
    report = Report(
        "3. Memory per session (CLI processes, as /proc reports them)",
        [
            "session",
            "samples",
            "CLI processes naming it (max)",
            "CLI processes of the server (max)",
            "VmRSS (median)",
            "VmRSS (max)",
            "VmHWM (max)",
        ],
    )
    live = await _session(c)
    hibernated = await _session(c)
    await c.hibernate(hibernated)
    hib = await watch_cli(c, hibernated, LIVE_S, EVERY_S)  # from the moment it returned

    live_snaps = await watch_cli(c, live, LIVE_S, EVERY_S)
    if any(len(s.session_pids) != 1 for s in live_snaps):
        raise RuntimeError(f"a live session should show one CLI process: {live_snaps}")
    live_kb = statistics.median(s.session_rss_kb for s in live_snaps)

    rewound = await _session(c)
    after_rewind: list[CliSnapshot] = []
    after_prompt: list[CliSnapshot] = []
    for _ in range(rewinds):
        target = await c.prompt(rewound, "say ping")
        result = await c.rewind(rewound, target, CONVERSATION)
        after_rewind += await watch_cli(c, rewound, AFTER_REWIND_S, EVERY_S)  # from the moment it returned
        if not result.conversation.rewound:
            raise RuntimeError(f"conversation rewind did not apply: {result}")
        await c.prompt(rewound, "say ping")
        after_prompt.append(cli_snapshot(c, rewound))
    if any(not s.session_pids for s in after_prompt):
        raise RuntimeError(f"a session that just ran a prompt should show its CLI process: {after_prompt}")
    hib_end = cli_snapshot(c, hibernated)  # and still nothing at the end

    report.rows = [
        _row("live, idle after its turns", live_snaps),
        _row("hibernated: from the moment hibernating it returned, and at the end", [*hib, hib_end]),
        _row(f"rewound: from the moment a conversation Rewind returned ({rewinds} rewinds)", after_rewind),
        _row("rewound: right after the next prompt", after_prompt),
    ]
    rewound_snaps = after_rewind + after_prompt
    most = max(len(s.session_pids) for s in rewound_snaps)
    hib_most = max(len(s.session_pids) for s in [*hib, hib_end])
    hib_kb = max(s.session_rss_kb for s in [*hib, hib_end])
    # The CLI processes of the server beyond the sessions holding one when each sample was taken:
    # the live one while the hibernated one was watched; the live and the rewound ones after that.
    holders = [(hib, 1), (live_snaps, 1), ([*rewound_snaps, hib_end], 2)]
    server_most = max(len(s.server_pids) - n for snaps, n in holders for s in snaps)
    samples = sum(len(snaps) for snaps, _ in holders)
    report.targets = [
        Target(
            "a hibernated session: no CLI process names it and it holds 0 KB, at every sample",
            hib_most == 0 and hib_kb == 0,
            f"at most {hib_most} process(es), {fmt_kb(hib_kb)}, over {len(hib) + 1} samples",
        ),
        Target(
            "right after a conversation Rewind: at most one CLI process names the session, at every sample",
            most <= 1,
            f"at most {most} process(es) over {len(rewound_snaps)} samples",
        ),
        ratio_target(
            "right after a conversation Rewind: one process's memory, not two: max VmRSS / a live session's",
            max(s.session_rss_kb for s in rewound_snaps),
            live_kb,
            at_most=MAX_REWOUND_OVER_LIVE,
            fmt=fmt_kb,
        ),
        Target(
            "the server runs no CLI process beyond one per session that holds one, at every sample",
            server_most <= 0,
            f"at most {server_most:+d} process(es) beyond that, over {samples} samples",
        ),
    ]
    report.notes = [
        "a sample: every CLI process of the server (the bundled binary, with the server's "
        "CLAUDE_CONFIG_DIR), those naming the session, and their VmRSS (with their children) and "
        f"VmHWM from /proc/<pid>/status; one every {EVERY_S * 1000:.0f} ms while watched",
        "SDK-FACTS.md (Costs) has what a live CLI process held when it was measured",
    ]
    return report


async def _run(work: Path, rewinds: int) -> Report:
    async with asyncio.timeout(TIMEOUT_S):
        async with serve(work) as c:
            report = await _measure(c, rewinds)
        report.targets.append(
            Target(
                "once the server has stopped, none of its CLI processes is left",
                not c.leftover,
                f"{len(c.leftover)} left the moment the stop returned",
            )
        )
    return report


def run(work: Path, rewinds: int) -> Report:
    started = time.monotonic()
    report = asyncio.run(_run(work, rewinds))
    report.seconds = time.monotonic() - started
    return report
