"""Confinement, tried as an attacker would with the real CLI (issue "Confinement", API.md Round 3
"Sandboxed commands"): a prompt can make the agent call any tool with any input (the scripted
model's `tool NAME {json}`) and run any command its session allows. Each test here failed on
the code before the sandbox: the tools ran, the commands read and wrote anything.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2

from agent_rewind.api.v1 import rewind_service_pb2
from agent_rewind.sessions import tools
from tests.integration.harness import FILES, Client, cli_pids, error_info, prompt_id, read, serve
from tests.integration.test_auth import _access, _as

# A program the agent runs (it is in its workspace, as a repository's script would be): every
# way out a command might try, each answered with what it got. Its argument names its report.
PROBE = r"""
import json, os, socket, sys
targets = json.loads(os.environ.get("PROBE_TARGETS") or open("targets.json").read())
out = {"env": dict(os.environ), "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit())}

def attempt(fn):
    try:
        return "ok:" + str(fn())[:200]
    except Exception as err:
        return "refused:" + type(err).__name__

out["read"] = {p: attempt(lambda p=p: open(p, "rb").read(200)) for p in targets["read"]}
out["list"] = {p: attempt(lambda p=p: os.listdir(p)) for p in targets["list"]}
def write(p):
    with open(p, "w") as f:
        f.write("written by the agent\n")
    return p
out["write"] = {p: attempt(lambda p=p: write(p)) for p in targets["write"]}
def connect(port):
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect(("127.0.0.1", port))
        return "connected"
    finally:
        s.close()
out["connect"] = {str(p): attempt(lambda p=p: connect(p)) for p in targets["connect"]}
def unix(path):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        return "connected"
    finally:
        s.close()
out["unix"] = {p: attempt(lambda p=p: unix(p)) for p in targets["unix"]}
# The PID namespace's first process: what the issue found there was bwrap, with the CLI's
# environment, the sandbox's arguments and the CLI's socket pair as its input.
def whole(fn):
    try:
        return "ok:" + str(fn())
    except Exception as err:
        return "refused:" + type(err).__name__
out["proc1"] = {
    name: whole(lambda name=name: open(f"/proc/1/{name}", "rb").read().decode(errors="replace"))
    for name in ("environ", "cmdline")
}
out["proc1"]["fds"] = whole(lambda: {fd: os.readlink(f"/proc/1/fd/{fd}") for fd in os.listdir("/proc/1/fd")})
open(f"report-{sys.argv[1]}.json", "w").write(json.dumps(out))
"""


def _options(**values: Any) -> struct_pb2.Struct:
    options = struct_pb2.Struct()
    options.update(values)
    return options


def _tool(tool: str, **arguments: Any) -> str:
    return f"tool {tool} {json.dumps(arguments)}"


def _results(events: list[Any]) -> list[tuple[str, bool]]:
    return [(e.tool_result.content, e.tool_result.is_error) for e in events if e.HasField("tool_result")]


def _advertised(c: Client) -> list[set[str]]:
    """The tool list of every request the real CLI sent the model since it began recording."""
    assert c.running is not None and c.running.model is not None
    return [{str(t.get("name")) for t in r.get("tools") or []} for r in c.running.model.requests]


def _recording(c: Client) -> Client:
    assert c.running is not None and c.running.model is not None
    c.running.model.record()
    return c


async def _report(
    c: Client, sid: str, cwd: Path, name: str, prompt: str, within: float = 60.0
) -> dict[str, Any]:
    await c.prompt(sid, prompt)
    path = cwd / f"report-{name}.json"
    deadline = asyncio.get_running_loop().time() + within
    while not path.exists():  # a background task writes it after its turn
        assert asyncio.get_running_loop().time() < deadline, f"no report from {name}"
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.1)
    report: dict[str, Any] = json.loads(path.read_text())
    return report


# --- tools exist only when named ----------------------------------------------------------------


async def test_a_session_is_offered_only_the_file_tools_and_what_it_named(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        _recording(c)
        plain = (await c.create()).session_id
        await c.prompt(plain, "say hello")
        named = (await c.create(options=_options(allowed_tools=["Bash(ls:*)", "WebFetch"]))).session_id
        await c.prompt(named, "say hello")
        first, second = _advertised(c)[0], _advertised(c)[-1]
        assert first - tools.INERT_PLACEHOLDERS == {"Read", "Write", "Edit", "NotebookEdit", "Glob", "Grep"}
        assert second - tools.INERT_PLACEHOLDERS == first - tools.INERT_PLACEHOLDERS | {"Bash", "WebFetch"}


async def test_tools_the_session_did_not_name_are_no_such_tool_even_when_called(tmp_path: Path) -> None:
    """Before: the CLI ran these without asking can_use_tool. ListAgents listed every live CLI on
    the host, SendMessage prompted another principal's agent, ScheduleWakeup started a turn of its
    own a minute later, Agent ran a subagent that wrote files."""
    calls = [
        _tool("ListAgents"),
        _tool("SendMessage", to="any", message="write pwned.txt from a peer"),
        _tool("ScheduleWakeup", delaySeconds=60, prompt="write woke.txt by itself"),
        _tool("CronCreate", cron="* * * * *", prompt="write cron.txt"),
        _tool(
            "Agent", description="d", prompt="write sub.txt from a subagent", subagent_type="general-purpose"
        ),
        _tool("Skill", skill="simplify"),
        _tool("ToolSearch", query="select:WebFetch"),
        _tool("EnterPlanMode"),
        _tool("EnterWorktree", name="elsewhere"),
        _tool("Bash", command="touch bash.txt"),
        _tool("DeferredToolPlaceholder"),
    ]
    async with serve(tmp_path) as c:
        _recording(c)
        session = await c.create()
        cwd = Path(session.cwd)
        results = _results(await c.prompt(session.session_id, "\n".join(calls)))
        assert len(results) == len(calls)
        for (content, is_error), call in zip(results, calls, strict=True):
            assert is_error and "No such tool available" in content, (call, content)
        assert sorted(p.name for p in cwd.iterdir()) == []
        requests = len(c.running.model.requests) if c.running and c.running.model else 0
        await asyncio.sleep(1.0)
        assert c.running is not None and c.running.model is not None
        assert len(c.running.model.requests) == requests, "no turn the CLI started by itself"


async def test_a_tool_that_reaches_other_sessions_cannot_be_named(tmp_path: Path) -> None:
    async with serve(tmp_path) as c:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await c.create(options=_options(allowed_tools=["Bash", "SendMessage"]))
        assert error_info(refused.value).reason == "OPTION_NOT_ALLOWED"
        assert error_info(refused.value).metadata["field"] == "options.allowed_tools[1]"


async def test_every_tool_the_cli_offers_is_one_the_policy_knows(tmp_path: Path) -> None:
    """Fails when a CLI upgrade offers a tool the catalogue (sessions/tools.py) does not know,
    named or not: such a tool could run without the service knowing what it does."""
    allowable = [name for name, kind in tools.CATALOGUE.items() if kind is not tools.Kind.REFUSED]
    async with serve(tmp_path) as c:
        _recording(c)
        for allowed in ([], allowable):
            sid = (await c.create(options=_options(allowed_tools=allowed))).session_id
            await c.prompt(sid, "say hello")
            offered = _advertised(c)[-1]
            unknown = offered - set(tools.CATALOGUE) - tools.INERT_PLACEHOLDERS
            assert not unknown, f"the CLI offers tools the policy does not know: {sorted(unknown)}"
            assert offered - tools.INERT_PLACEHOLDERS <= set(tools.base_tools(allowed))


async def test_two_principals_sessions_cannot_list_or_message_each_other(tmp_path: Path) -> None:
    access = _access(
        tmp_path / "access.json",
        {"alice": ["sessions.read", "sessions.write"], "bob": ["sessions.read", "sessions.write"]},
        {"alice": "arw_alice", "bob": "arw_bob"},
    )
    # A short state dir: the CLI keeps its messaging socket where XDG_RUNTIME_DIR says only when
    # the socket's path fits a Unix socket address (103 bytes); pytest's directories are long.
    state = Path(tempfile.mkdtemp(prefix="ar-", dir="/tmp"))
    try:
        await _two_principals(state, access)
    finally:
        shutil.rmtree(state, ignore_errors=True)


async def _two_principals(state: Path, access: Path) -> None:
    async with serve(state, access_file=access) as c:
        alice, bob = _as(c, "arw_alice"), _as(c, "arw_bob")
        theirs = await bob.create(options=_options(allowed_tools=["Bash"]))
        await bob.prompt(theirs.session_id, "say I am bob")
        (bob_cli,) = cli_pids(theirs.session_id)
        sockets = list((state / "sessions" / theirs.session_id / "run").glob("cc-socks/*.sock"))
        assert [p.name for p in sockets] == [f"{bob_cli}.sock"], (
            "bob's CLI's messaging socket is his session's"
        )
        bob_socket = str(sockets[0])
        mine = await alice.create(options=_options(allowed_tools=["Bash"]))
        cwd = Path(mine.cwd)
        calls = [
            _tool("ListAgents"),
            _tool("SendMessage", to=str(bob_cli), message="write pwned.txt for alice"),
            f"bash ls -a /tmp > peers.txt; python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.connect('{bob_socket}')\" 2> connect.txt; true",
        ]
        results = _results(await alice.prompt(mine.session_id, "\n".join(calls)))
        assert all("No such tool available" in r for r, _ in results[:2]), results
        peers = read(cwd / "peers.txt") or ""
        assert peers and "cc-socks" not in peers and ".sock" not in peers, peers
        assert "FileNotFoundError" in (read(cwd / "connect.txt") or ""), "bob's socket is not there at all"
        assert not (Path(theirs.cwd) / "pwned.txt").exists()
        bob_prompts = await bob.recall(theirs.session_id)
        assert bob_prompts == ["say I am bob", "recall"], "nothing of alice's reached bob's conversation"


# --- commands run confined ----------------------------------------------------------------------


@pytest.fixture
def canaries(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Secrets in the server's own environment (the server runs in this process), as a platform
    would inject them."""
    values = {
        "PGPASSWORD": f"pg-{uuid.uuid4().hex}",
        "AGENT_REWIND_DATABASE_URL": f"postgresql://u:{uuid.uuid4().hex}@db/x",
        "SOME_CLOUD_SECRET": f"cloud-{uuid.uuid4().hex}",
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


@pytest.fixture
def outside_tmp() -> Iterator[Path]:
    """A directory outside /tmp (which a command's sandbox has of its own), so that what a
    command sees of the paths under it is only the sandbox's view."""
    path = Path(tempfile.mkdtemp(prefix="agent-rewind-test-", dir="/var/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def test_bash_background_and_subagent_commands_reach_nothing_outside_the_workspace(
    outside_tmp: Path, canaries: dict[str, str]
) -> None:
    tmp_path = outside_tmp
    service_file = tmp_path / "access.json"
    service_file.write_text(json.dumps({"principals": []}))
    state = tmp_path / "state"
    async with serve(state, metrics_listen="127.0.0.1:0") as c:
        assert c.running is not None and c.running.model is not None
        other = await c.create()
        await c.prompt(other.session_id, "write secret.txt another session's secret")
        session = await c.create(options=_options(allowed_tools=["Bash", "Agent"]))
        sid, cwd = session.session_id, Path(session.cwd)
        await c.prompt(sid, "say hello")  # the CLI is live: its pid, the server's
        (cli,) = cli_pids(sid)
        model_port = int(c.running.model.base_url.rsplit(":", 1)[1])
        metrics = c.running.side.metrics.port if c.running.side and c.running.side.metrics else 0
        outside = tmp_path / "outside.txt"
        targets = {
            "read": [
                str(state / "ledger.sqlite3"),
                str(Path(other.cwd) / "secret.txt"),
                str(service_file),
                f"/proc/{os.getpid()}/environ",
                f"/proc/{os.getpid()}/cmdline",
                f"/proc/{cli}/environ",
                f"/proc/{cli}/cmdline",
            ],
            "list": [
                str(state),
                str(state / "claude"),
                str(Path(other.cwd)),
                str(tmp_path),
                "/root",
                "/home",
            ],
            "write": [
                str(Path(other.cwd) / "pwned.txt"),
                str(state / "pwned.txt"),
                str(outside),
                "/etc/pwned",
            ],
            "connect": [c.running.port, model_port, metrics],
            "unix": [str(p) for p in Path("/tmp").glob("cc-socks*/*.sock")][:5],
        }
        (cwd / "targets.json").write_text(json.dumps(targets))
        (cwd / "probe.py").write_text(PROBE)
        reports = {
            "bash": await _report(c, sid, cwd, "bash", "bash python3 probe.py bash"),
            "background": await _report(
                c,
                sid,
                cwd,
                "background",
                _tool("Bash", command="python3 probe.py background", run_in_background=True),
            ),
            "subagent": await _report(c, sid, cwd, "subagent", "agent bash python3 probe.py subagent"),
        }
    secrets = [*canaries.values(), "offline-scripted-model"]
    # A directory on the way to the session's own workspace and temporary directory shows inside
    # (empty, but for the way on): nothing else of the host does.
    skeleton = set(cwd.parts) | set((state / "sessions" / sid / "tmp").parts)
    for who, report in reports.items():
        for path, got in report["read"].items():
            assert got.startswith("refused:"), (who, path, got)
        for path, got in report["list"].items():
            shown = set(eval(got[3:])) if got.startswith("ok:") else set()
            assert shown <= skeleton, (who, path, shown - skeleton)
        for path, got in report["write"].items():
            assert got.startswith("refused:"), (who, path, got)
        for port, got in report["connect"].items():
            assert got.startswith("refused:"), (who, port, got)
        for path, got in report["unix"].items():
            assert got.startswith("refused:"), (who, path, got)
        text = json.dumps(report)
        assert not [s for s in secrets if s in text], (
            who,
            "a secret of the server's or the CLI's environment",
        )
        assert "CLAUDE_CODE_MESSAGING" not in text, (who, "no way to the CLI's own messaging socket")
        assert max(report["pids"]) < 20, (who, "a PID namespace of its own", report["pids"])
        first = report["proc1"]
        assert first["cmdline"].startswith("ok:") and "bwrap" not in first["cmdline"], (who, first)
        # (The command's own text names the session's temporary directory, as the CLI wrote it.)
        assert "--ro-bind" not in first["cmdline"] and str(state / "claude") not in json.dumps(first), (
            who,
            "none of the sandbox's arguments at pid 1",
            first,
        )
        assert "PATH=" in first["environ"] and "ANTHROPIC" not in first["environ"], (who, first)
        assert eval(first["fds"][3:]).get("0") == "/dev/null", (who, "no way to the CLI at pid 1", first)
    assert not outside.exists() and not (Path(other.cwd) / "pwned.txt").exists()
    assert not (state / "pwned.txt").exists()


async def test_a_planted_link_leads_nowhere_outside(tmp_path: Path) -> None:
    secret = tmp_path / "outside" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("the host's\n")
    async with serve(tmp_path / "state", workspace_snapshots=True) as c:
        session = await c.create(options=_options(allowed_tools=["Bash"]))
        sid, cwd = session.session_id, Path(session.cwd)
        await c.prompt(
            sid,
            f"bash ln -s {secret} file-link && ln -s {secret.parent} dir-link && "
            "(cat file-link; ls dir-link; echo x > dir-link/new.txt) > seen.txt 2>&1; true",
        )
        assert "the host's" not in (read(cwd / "seen.txt") or "")
        assert sorted(p.name for p in secret.parent.iterdir()) == ["secret.txt"]
        assert secret.read_text() == "the host's\n"


async def test_a_replaced_workspace_is_never_written_through(tmp_path: Path) -> None:
    """With both confinements off (so the agent can move its workspace aside and plant a link in
    its place, as it could before), a files rewind refuses rather than writing where the link leads."""
    target = tmp_path / "target"
    target.mkdir()
    async with serve(tmp_path / "state", workspace_snapshots=True, sandbox="off", cli_confinement="off") as c:
        session = await c.create(options=_options(allowed_tools=["Bash"]))
        sid, cwd = session.session_id, Path(session.cwd)
        first = prompt_id(await c.prompt(sid, "write a.txt one"))
        await c.prompt(
            sid, f"write a.txt two\nbash cd .. && mv {cwd.name} moved && ln -s {target} {cwd.name}"
        )
        assert cwd.is_symlink()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await c.rewind(sid, first, FILES)
        assert error_info(refused.value).reason == "WORKSPACE_OUTSIDE_ROOT"
        assert list(target.iterdir()) == [], "nothing written through the link"


async def test_a_confined_cli_cannot_move_its_workspace_even_with_the_command_sandbox_off(
    tmp_path: Path,
) -> None:
    """The same attack with the CLI confined (the default): its commands run in its Landlock
    domain, which may write inside the workspace, not the directory that holds it."""
    async with serve(tmp_path / "state", sandbox="off") as c:
        session = await c.create(options=_options(allowed_tools=["Bash"]))
        sid, cwd = session.session_id, Path(session.cwd)
        await c.prompt(sid, f"bash cd .. && mv {cwd.name} moved; ln -s /tmp {cwd.name}; echo x > ../planted")
        assert cwd.is_dir() and not cwd.is_symlink()
        assert not (cwd.parent / "moved").exists() and not (cwd.parent / "planted").exists()


async def test_a_tampered_ledger_row_cannot_move_a_workspace_outside_the_roots(tmp_path: Path) -> None:
    state, outside = tmp_path / "state", tmp_path / "outside"
    outside.mkdir()
    async with serve(state) as c:
        session = await c.create()
        sid = session.session_id
        await c.prompt(sid, "write a.txt one")
    with sqlite3.connect(state / "ledger.sqlite3") as db:
        db.execute("UPDATE sessions SET cwd = ? WHERE session_id = ?", (str(outside), sid))
    async with serve(state) as c:
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await c.get(sid)
        assert error_info(missing.value).reason == "SESSION_NOT_FOUND"
        with pytest.raises(grpc.aio.AioRpcError):
            await c.prompt(sid, "write b.txt two")
    assert list(outside.iterdir()) == []


FETCH = (
    "import sys, urllib.request, urllib.error\n"
    "for url in sys.argv[1:]:\n"
    "    try:\n"
    "        print(url, urllib.request.urlopen(url, timeout=10).read().decode())\n"
    "    except urllib.error.HTTPError as err:\n"
    "        print(url, 'status', err.code)\n"
    "    except Exception as err:\n"
    "        print(url, 'failed', type(err).__name__)\n"
)


async def test_an_allowed_host_is_reached_through_the_proxy_and_no_other(
    tmp_path: Path, web: tuple[int, int]
) -> None:
    allowed_port, other_port = web
    hosts = (f"127.0.0.1:{allowed_port}", f"localhost:{allowed_port}")
    async with serve(tmp_path / "state", sandbox_allow_hosts=hosts) as c:
        caps = await c.rewinds.GetCapabilities(rewind_service_pb2.GetCapabilitiesRequest())
        assert caps.sandbox.enabled and tuple(caps.sandbox.allowed_hosts) == hosts
        session = await c.create(options=_options(allowed_tools=["Bash"]))
        sid, cwd = session.session_id, Path(session.cwd)
        (cwd / "fetch.py").write_text(FETCH)
        allowed, other = f"http://127.0.0.1:{allowed_port}/", f"http://127.0.0.1:{other_port}/"
        await c.prompt(
            sid,
            f"bash python3 fetch.py {allowed} {other} http://example.com/ > fetched.txt 2>&1; "
            f"env -u HTTP_PROXY -u http_proxy python3 fetch.py {allowed} >> fetched.txt 2>&1",
        )
        lines = (read(cwd / "fetched.txt") or "").splitlines()
        assert lines[0] == f"{allowed} hello from {allowed_port}", lines
        assert lines[1] == f"{other} status 403", lines
        assert lines[2] == "http://example.com/ status 403", lines
        assert lines[3].startswith(f"{allowed} failed"), "without the proxy, no way out at all"
        narrowed = await c.create(
            options=_options(
                allowed_tools=["Bash"], sandbox={"network": {"allowedDomains": [f"localhost:{allowed_port}"]}}
            )
        )
        (Path(narrowed.cwd) / "fetch.py").write_text(FETCH)
        await c.prompt(narrowed.session_id, f"bash python3 fetch.py {allowed} > fetched.txt 2>&1")
        assert read(Path(narrowed.cwd) / "fetched.txt") == f"{allowed} status 403\n", (
            "a session narrows the list"
        )


async def test_capabilities_say_whether_commands_are_confined(tmp_path: Path) -> None:
    async with serve(tmp_path / "on") as c:
        caps = await c.rewinds.GetCapabilities(rewind_service_pb2.GetCapabilitiesRequest())
        assert caps.sandbox.enabled and list(caps.sandbox.allowed_hosts) == []
    async with serve(tmp_path / "off", sandbox="off") as c:
        caps = await c.rewinds.GetCapabilities(rewind_service_pb2.GetCapabilitiesRequest())
        assert not caps.sandbox.enabled


async def test_git_configuration_planted_in_the_workspace_runs_nothing_outside(tmp_path: Path) -> None:
    """The CLI runs git on the workspace itself, unconfined (its system prompt's git status): a
    repository configuration the agent writes must not make that git run a program."""
    marker = tmp_path / "ran"
    async with serve(tmp_path / "state") as c:
        session = await c.create(options=_options(allowed_tools=["Bash"]))
        sid, cwd = session.session_id, Path(session.cwd)
        hook = f"sh -c 'date > {marker}'"
        await c.prompt(
            sid,
            "bash git init -q . && echo a > a && git add a && git commit -qm a"
            f' && git config filter.x.clean "{hook}" && git config core.fsmonitor "{hook}"'
            f' && git config core.pager "{hook}" && git config diff.external "{hook}"'
            f" && mkdir -p .git/hooks && printf '#!/bin/sh\\n{hook}\\n' > .git/hooks/post-checkout"
            " && echo '* filter=x diff=x' > .gitattributes && echo b > a",
        )
        assert (cwd / ".git" / "config").exists()
        await c.sessions.CloseSession(_close(sid))
        await c.prompt(sid, "say resumed: the CLI reads the repository again")
    assert not marker.exists(), "a program the agent planted ran outside the sandbox"


def _close(sid: str) -> Any:
    from agent_rewind.api.v1 import session_service_pb2

    return session_service_pb2.CloseSessionRequest(session_id=sid)
