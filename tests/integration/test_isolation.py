"""Tenant isolation, tried as an attacker would against a real server and the real CLI (issue 36):
what a caller names, what a command sees of the CLI, what the CLI's own tools can reach."""

from __future__ import annotations

import asyncio
import collections
import os
import time
from pathlib import Path

import grpc
import pytest

from agent_rewind.api.v1 import session_service_pb2
from agent_rewind.transcript.paths import PROJECT_NAME_MAX
from tests.integration.harness import Client, bad_request, error_info, serve
from tests.integration.test_confinement import _options, _tool


def _cwd(root: Path, length: int) -> str:
    """A relative cwd whose absolute path under `root` has `length` characters."""
    left = length - len(str(root)) - 1
    parts = []
    while left > 0:
        part = "d" * min(60, left)
        if left - len(part) == 1:  # no component of one character left over with its slash
            part = part[:-2]
        parts.append(part)
        left -= len(part) + 1
    return "/".join(parts)


@pytest.mark.parametrize("length", [PROJECT_NAME_MAX + 1, 252, 256, 261, 1000])
async def test_a_workspace_path_too_long_for_the_transcript_s_name_is_a_clean_invalid_argument(
    tmp_path: Path, length: int
) -> None:
    """The issue: a relative cwd of 252 to 261 characters was INTERNAL (ENAMETOOLONG), at
    CreateSession and at ForkSession."""
    async with serve(tmp_path / "state") as c:
        root = tmp_path / "state" / "workspaces"
        cwd = _cwd(root, length)
        assert len(str(root / cwd)) == length
        source = await c.create()
        for call in (
            c.create(cwd=cwd),
            c.sessions.ForkSession(
                session_service_pb2.ForkSessionRequest(session_id=source.session_id, cwd=cwd)
            ),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert error_info(err.value).reason == "INVALID_ARGUMENT"
            assert [v.field for v in bad_request(err.value).field_violations] == ["cwd"]


async def test_a_workspace_path_at_the_bound_is_served(tmp_path: Path) -> None:
    async with serve(tmp_path / "state") as c:
        root = tmp_path / "state" / "workspaces"
        session = await c.create(cwd=_cwd(root, PROJECT_NAME_MAX))
        assert len(session.cwd) == PROJECT_NAME_MAX
        await c.prompt(session.session_id, "write a.txt one")
        assert (Path(session.cwd) / "a.txt").read_text() == "one\n"


# The race (issue 36): the hook resolves a file tool's path and allows it; the CLI opens it
# later; a background command swaps the path for a link meanwhile. Each round is one Read, Write
# or Edit while a file (or a directory) flips between itself and a link to another session's
# workspace. AGENT_REWIND_RACE_ROUNDS sets the rounds per kind (make attack: 1,000).
ROUNDS = int(os.environ.get("AGENT_REWIND_RACE_ROUNDS", "25"))
SWAP = r"""end=$(( $(date +%s) + {seconds} )); i=0
while [ $(date +%s) -lt $end ]; do
  ln -sfn {secret} x.new && mv -Tf x.new x; printf 'old\n' > x.new && mv -Tf x.new x
  ln -sfn {theirs} d.new && mv -Tf d.new d; rm -rf d.dir; mkdir d.dir && printf 'old\n' > d.dir/f && mv -Tf d.dir d 2>/dev/null
  i=$((i+1))
done; echo swapped $i"""


async def test_a_path_swapped_for_a_link_during_a_file_tool_never_reaches_another_workspace(
    tmp_path: Path,
) -> None:
    async with serve(tmp_path / "state") as c:
        victim = await c.create()
        await c.prompt(victim.session_id, "write secret.txt old victim's secret")
        theirs = Path(victim.cwd)
        secret = theirs / "secret.txt"
        before = secret.read_bytes()
        results: list[str] = []
        # A fresh attacker every 100 rounds: a conversation of thousands of tool calls would
        # make each of the model's requests longer than the last.
        for first in range(0, ROUNDS, PER_SESSION):
            rounds = range(first, min(ROUNDS, first + PER_SESSION))
            results += await _race(c, secret, theirs, rounds)
        print("RACE", collections.Counter(r.split("\n")[0][:60] for r in results).most_common(12))
        assert len(results) >= 5 * ROUNDS
        assert not [r for r in results if "victim's secret" in r], "a read reached the other workspace"
        assert secret.read_bytes() == before, "an edit reached the other workspace"
        assert sorted(p.name for p in theirs.iterdir()) == ["secret.txt"], "a write reached it"
        # The race was run: some calls found the file, some the link (refused by the hook or the kernel).
        assert any("old" in r for r in results) and any(r for r in results if "old" not in r)


PER_SESSION = 100


async def _race(c: Client, secret: Path, theirs: Path, rounds: range) -> list[str]:
    """One attacker session: its background command swaps x and d while it calls Read, Write and
    Edit on them, five calls a round. Returns every tool result."""
    session = await c.create(options=_options(allowed_tools=["Bash"]))
    sid, cwd = session.session_id, Path(session.cwd)
    (cwd / "x").write_text("old\n")
    (cwd / "d").mkdir()
    (cwd / "d" / "f").write_text("old\n")
    swap = SWAP.format(seconds=max(30, len(rounds) // 2), secret=secret, theirs=theirs)
    (cwd / "swap.sh").write_text(swap)
    await c.prompt(sid, _tool("Bash", command="sh swap.sh", run_in_background=True))
    lines = []
    for i in rounds:
        lines += [
            "read x",
            "read d/f",
            f"write d/new{i}.txt pwned",
            "edit x old => pwned",
            "edit d/f old => pwned",
        ]
    results: list[str] = []
    for start in range(0, len(lines), 50):
        events = await c.prompt(sid, "\n".join(lines[start : start + 50]))
        results += [e.tool_result.content for e in events if e.HasField("tool_result")]
    await c.sessions.CloseSession(session_service_pb2.CloseSessionRequest(session_id=sid, force=True))
    return results


# A command's bounds (issue 36): one session's runaway commands leave another's turn working.
HOG = "python3 -c 'b = bytearray(64 << 30)' 2>&1 | tail -1"
BOMB = (
    "python3 -c 'import os, time\\nn = 0\\nfor _ in range(300):\\n"
    "    try:\\n        pid = os.fork()\\n    except OSError:\\n        break\\n"
    '    if pid == 0:\\n        time.sleep(3)\\n        os._exit(0)\\n    n += 1\\nprint("forked", n)\''
)


async def test_a_memory_hog_and_a_fork_bomb_in_one_session_leave_another_s_turn_working(
    tmp_path: Path,
) -> None:
    async with serve(tmp_path / "state") as c:
        attacker = await c.create(options=_options(allowed_tools=["Bash"]))
        bystander = await c.create()
        await c.prompt(bystander.session_id, "say ready")
        for attack in (HOG, BOMB):
            running = asyncio.ensure_future(c.prompt(attacker.session_id, _tool("Bash", command=attack)))
            started = time.monotonic()
            events = await asyncio.wait_for(c.prompt(bystander.session_id, "write b.txt still here"), 30)
            assert events[-1].result.subtype == "success" and time.monotonic() - started < 30
            out = "".join(e.tool_result.content for e in await running if e.HasField("tool_result"))
            if attack is HOG:
                assert "MemoryError" in out, out  # refused at the sandbox's data limit
            else:
                assert "forked" in out, out
        assert (Path(bystander.cwd) / "b.txt").read_text() == "still here\n"


def _cli_niceness(session_id: str) -> list[int]:
    """The niceness of every process whose command line names the session (its CLI, and with
    Landlock the launcher that started it): field 19 of /proc/PID/stat."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmdline = Path(entry.path, "cmdline").read_bytes()
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        if session_id.encode() in cmdline:
            found.append(int(stat.rsplit(")", 1)[1].split()[16]))
    return found


@pytest.mark.parametrize(("confinement", "nice"), [("landlock", None), ("off", 4), ("landlock", 0)])
async def test_the_cli_and_its_commands_run_nicer_than_the_service(
    tmp_path: Path, confinement: str, nice: int | None
) -> None:
    """So that on a node the agents keep busy, the service's own answers do not wait behind
    them: --cli-nice (10 by default) is added to the CLI's niceness and its commands'."""
    mine = os.nice(0)
    overrides = {"cli_confinement": confinement} | ({} if nice is None else {"cli_nice": nice})
    expected = min(mine + (10 if nice is None else nice), 19)
    async with serve(tmp_path / "state", **overrides) as c:
        session = await c.create(options=_options(allowed_tools=["Bash"]))
        events = await c.prompt(session.session_id, _tool("Bash", command="nice"))
        out = "".join(e.tool_result.content for e in events if e.HasField("tool_result"))
        assert out.split() == [str(expected)], out
        seen = _cli_niceness(session.session_id)
        assert seen and set(seen) == {expected}, seen
