"""The command sandbox's program, run for real with bubblewrap: what a command can and cannot reach.

The proof that the CLI runs every command through it is tests/integration/test_confinement.py."""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agent_rewind.sandbox import CommandLimits, CommandSandbox, SandboxUnavailable
from agent_rewind.sandbox.commands import _PROXY_SOCKET, PROXY_PORT


@pytest.fixture
def host(tmp_path: Path) -> dict[str, Path]:
    state = tmp_path / "state"
    workspace = state / "workspaces" / "mine"
    other = state / "workspaces" / "theirs"
    for d in (workspace, other):
        d.mkdir(parents=True)
    (other / "secret.txt").write_text("theirs\n")
    (state / "ledger.sqlite3").write_text("ledger\n")
    return {"state": state, "workspace": workspace, "other": other}


def _run(sandbox: CommandSandbox, workspace: Path, command: str) -> subprocess.CompletedProcess[str]:
    confined = sandbox.prepare("s1", workspace, proxy=False)
    return subprocess.run(
        [str(confined.command), command], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture
def sandbox(host: dict[str, Path]) -> CommandSandbox:
    return CommandSandbox.find(host["state"] / "sandbox", need_socat=False, hidden=[host["state"]])


def test_a_command_writes_its_workspace_and_its_tmp(sandbox: CommandSandbox, host: dict[str, Path]) -> None:
    done = _run(sandbox, host["workspace"], "echo a > made.txt && echo b > /tmp/t && cat /tmp/t && pwd")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["b", str(host["workspace"])]
    assert (host["workspace"] / "made.txt").read_text() == "a\n"


@pytest.mark.parametrize(
    "target",
    ["state/ledger.sqlite3", "other/secret.txt", "state"],
    ids=["ledger", "other_workspace", "state_dir"],
)
def test_a_command_reads_nothing_of_the_state_dir_or_another_workspace(
    sandbox: CommandSandbox, host: dict[str, Path], target: str
) -> None:
    key, _, rest = target.partition("/")
    path = host[key] / rest if rest else host[key]
    done = _run(sandbox, host["workspace"], f"ls -la {path}; cat {path}")
    assert "ledger" not in done.stdout and "theirs" not in done.stdout


def test_a_command_writes_nowhere_else(
    sandbox: CommandSandbox, host: dict[str, Path], tmp_path: Path
) -> None:
    outside = tmp_path / "outside.txt"
    done = _run(sandbox, host["workspace"], f"echo x > {outside}; echo y > /usr/x; echo z > /etc/x; echo $?")
    assert not outside.exists()
    assert not Path("/usr/x").exists() and not Path("/etc/x").exists()
    assert done.stdout.strip().endswith("1")


def test_a_planted_link_leads_nowhere_outside(sandbox: CommandSandbox, host: dict[str, Path]) -> None:
    (host["workspace"] / "link").symlink_to(host["other"] / "secret.txt")
    (host["workspace"] / "dirlink").symlink_to(host["other"])
    done = _run(sandbox, host["workspace"], "cat link; ls dirlink; echo w > dirlink/new.txt")
    assert "theirs" not in done.stdout
    assert not (host["other"] / "new.txt").exists()


def test_a_command_has_its_own_environment_and_processes(
    sandbox: CommandSandbox, host: dict[str, Path]
) -> None:
    os.environ["AGENT_REWIND_TEST_SECRET"] = "s3cr3t"
    try:
        done = _run(
            sandbox, host["workspace"], f"env; ls /proc; cat /proc/{os.getpid()}/environ; cat /proc/1/cmdline"
        )
    finally:
        del os.environ["AGENT_REWIND_TEST_SECRET"]
    assert "s3cr3t" not in done.stdout
    pids = [int(p) for p in done.stdout.split() if p.isdigit()]
    assert pids and max(pids) < 10, "only the sandbox's own few processes"


def test_a_command_reaches_no_loopback_port_of_the_host(
    sandbox: CommandSandbox, host: dict[str, Path]
) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        done = _run(
            sandbox,
            host["workspace"],
            f"python3 -c \"import socket; s=socket.socket(); s.settimeout(3); print(s.connect_ex(('127.0.0.1', {port})))\"",
        )
    finally:
        listener.close()
    assert done.stdout.strip() not in ("", "0"), done.stderr


def test_the_service_s_files_are_hidden_where_they_would_show(tmp_path: Path, host: dict[str, Path]) -> None:
    # /etc is in the view; a service file in it (an access file mounted from a Secret) is not.
    files = [Path("/etc/hostname")] if Path("/etc/hostname").exists() else []
    sandbox = CommandSandbox.find(host["state"] / "sandbox", need_socat=False, hidden=files)
    done = _run(sandbox, host["workspace"], "cat /etc/hostname | wc -c; test -r /etc/passwd && echo passwd")
    if files:
        assert done.stdout.split()[0] == "0"
    assert "passwd" in done.stdout, "the rest of /etc is there"


def test_the_tools_agents_need_work_inside(sandbox: CommandSandbox, host: dict[str, Path]) -> None:
    done = _run(
        sandbox,
        host["workspace"],
        "git init -q repo && cd repo && echo a > a && git add a && git commit -qm first && git log --format=%s"
        " && python3 -c 'print(6*7)' && node -e 'console.log(1+1)'",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["first", "42", "2"]


def test_the_probe_passes_here_and_names_what_is_missing_elsewhere(
    sandbox: CommandSandbox, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    sandbox.probe()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(SandboxUnavailable, match=r"bubblewrap \(bwrap\) and socat"):
        CommandSandbox.find(tmp_path, need_socat=True)


def test_the_probe_fails_where_bwrap_cannot_confine(tmp_path: Path) -> None:
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    sandbox = CommandSandbox(root=tmp_path / "sandbox", bwrap=str(fake))
    with pytest.raises(SandboxUnavailable, match="user namespaces"):
        sandbox.probe()


def test_the_probe_names_the_pod_settings_where_the_container_s_proc_is_masked(
    tmp_path: Path,
) -> None:
    """What bwrap says in a container with a runtime's default /proc masks (seen in the image
    test): the error names the two pod settings that fix it, not user namespaces."""
    fake = tmp_path / "bwrap"
    fake.write_text(
        "#!/bin/sh\necho 'bwrap: Can'\\''t mount proc on /newroot/proc: Operation not permitted' >&2\n"
        "exit 1\n"
    )
    fake.chmod(0o755)
    sandbox = CommandSandbox(root=tmp_path / "sandbox", bwrap=str(fake))
    with pytest.raises(SandboxUnavailable, match="procMount: Unmasked and hostUsers: false") as err:
        sandbox.probe()
    assert "Can't mount proc" in str(err.value)


def test_pid_1_is_the_command_itself_with_nothing_of_the_cli(
    sandbox: CommandSandbox, host: dict[str, Path]
) -> None:
    """The issue's finding: pid 1 was bwrap, with the CLI's environment (the model credential),
    the sandbox's arguments, and the CLI's socket pair as its standard input."""
    left, right = socket.socketpair()
    confined = sandbox.prepare("s1", host["workspace"], proxy=False)
    assert confined.command is not None
    try:
        done = subprocess.run(
            [
                str(confined.command),
                'tr "\\0" "\\n" </proc/1/environ; echo ===; tr "\\0" " " </proc/1/cmdline; echo ===; '
                "readlink /proc/1/fd/0; echo ===; echo $$",
            ],
            stdin=left.fileno(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, "ANTHROPIC_API_KEY": "sk-canary", "CLAUDE_CODE_MESSAGING_TOKEN": "tok-canary"},
        )
    finally:
        left.close()
        right.close()
    environ, cmdline, stdin, pid = done.stdout.split("===\n")
    assert "canary" not in done.stdout and "CLAUDE_CODE" not in environ
    assert "bwrap" not in cmdline and str(host["state"]) not in cmdline
    assert stdin.strip() == "/dev/null", "no way to the CLI through pid 1's input"
    assert pid.strip() == "1"


def _as_nobody(sandbox: CommandSandbox, base: Path, command: str) -> subprocess.CompletedProcess[str]:
    """The command run as an unprivileged service would run it (the image's uid 10001; here
    65534): RLIMIT_NPROC binds every user but root."""
    workspace = base / "workspace"
    workspace.mkdir(parents=True)
    confined = sandbox.prepare("s1", workspace, proxy=False)
    for path in [base, *base.rglob("*")]:
        os.lchown(path, 65534, 65534)
    # setpriv drops to the user (util-linux, as bwrap's own package needs): subprocess's own
    # `user=` forks without vfork, and a fork in a process grpc has threads in can break the child.
    return subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(confined.command), command],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=workspace,
    )


# A bounded fork bomb: forks until refused (at most 2,000), each child sleeping 5 s; it reports
# how many it made, and exits, which ends every process of the sandbox.
BOMB = """python3 -c '
import os, time
made = 0
for _ in range(2000):
    try:
        if os.fork() == 0:
            time.sleep(5)
            os._exit(0)
    except OSError as err:
        print("refused", made, err.errno)
        break
    made += 1
else:
    print("made all", made)
'"""


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A directory another user can reach (pytest's own are private to root)."""
    path = Path(tempfile.mkdtemp(prefix="agent-rewind-nobody-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_fork_bomb_stops_at_the_sandbox_s_process_limit_and_others_still_fork(open_tmp: Path) -> None:
    tmp_path = open_tmp
    sandbox = CommandSandbox.find(tmp_path / "one", need_socat=False)
    sandbox = dataclasses.replace(sandbox, limits=CommandLimits(processes=48))
    with ThreadPoolExecutor(2) as pool:
        bomb = pool.submit(_as_nobody, sandbox, tmp_path / "one", BOMB)
        # Another session's sandbox meanwhile, same user: its processes are counted on their own.
        other = CommandSandbox.find(tmp_path / "two", need_socat=False)
        other = dataclasses.replace(other, limits=CommandLimits(processes=48))
        done = pool.submit(
            _as_nobody, other, tmp_path / "two", "for i in $(seq 20); do sleep 0.5 & done; wait; echo ok"
        )
        assert done.result().stdout.strip() == "ok", done.result().stderr
        made = bomb.result()
    assert made.stdout.split()[:1] == ["refused"], made.stdout + made.stderr
    assert int(made.stdout.split()[1]) < 48, "the sandbox's first process counts too"


def test_a_memory_hog_is_refused_past_the_data_limit(sandbox: CommandSandbox, host: dict[str, Path]) -> None:
    bounded = dataclasses.replace(sandbox, limits=CommandLimits(memory=256 << 20))
    hog = "python3 -c 'b = bytearray(512 << 20)' 2>&1 | tail -1; python3 -c 'b = bytearray(64 << 20); print(\"fits\")'"
    done = _run(bounded, host["workspace"], hog)
    assert done.stdout.splitlines() == ["MemoryError", "fits"], done.stdout + done.stderr


def test_a_session_s_sandbox_is_written_again_alike_at_its_next_start(
    sandbox: CommandSandbox, host: dict[str, Path]
) -> None:
    first = sandbox.prepare("s1", host["workspace"], proxy=False)
    assert first.command is not None
    text = first.command.read_text()
    again = sandbox.prepare("s1", host["workspace"], proxy=False)  # a resume: everything exists
    assert again == first and again.command is not None and again.command.read_text() == text
    env = again.environment()
    assert env["TMPDIR"] == env["CLAUDE_CODE_TMPDIR"] == str(again.tmp)
    assert env["XDG_RUNTIME_DIR"] == str(again.runtime)
    assert env["CLAUDE_CODE_SHELL_PREFIX"] == str(again.command)


def test_without_socat_only_a_sandbox_with_allowed_hosts_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import shutil as real_shutil

    which = real_shutil.which
    monkeypatch.setattr(
        "agent_rewind.sandbox.commands.shutil.which", lambda name: None if name == "socat" else which(name)
    )
    with pytest.raises(SandboxUnavailable, match="socat") as refused:
        CommandSandbox.find(tmp_path, need_socat=True)
    assert "bwrap" not in str(refused.value)
    assert CommandSandbox.find(tmp_path, need_socat=False).socat is None


@pytest.mark.parametrize(
    ("proxy", "socket", "reaches"),
    [(True, True, True), (False, True, False), (True, False, False)],
)
def test_a_command_gets_the_proxy_only_when_its_session_has_one(
    host: dict[str, Path], tmp_path: Path, proxy: bool, socket: bool, reaches: bool
) -> None:
    """Its proxy settings, and its way to the proxy: the port inside that leads to the server's
    socket (here a listener that greets whoever connects)."""
    listening = tmp_path / "proxy.sock"
    server = _greeter(listening) if socket else None
    try:
        sandbox = CommandSandbox.find(host["state"] / "sandbox", need_socat=True, hidden=[host["state"]])
        sandbox = dataclasses.replace(sandbox, proxy_socket=listening if socket else None)
        confined = sandbox.prepare(
            "s1", host["workspace"], proxy=proxy, proxy_url="http://s1:pw@127.0.0.1:3128"
        )
        assert confined.command is not None
        done = subprocess.run(
            [
                str(confined.command),
                'echo "proxy=${HTTPS_PROXY:-none}"; '
                f"(exec 3<>/dev/tcp/127.0.0.1/{PROXY_PORT} && head -1 <&3) 2>/dev/null || echo unreachable; "
                f"test -e {_PROXY_SOCKET} && echo socket-shown || echo no-socket",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        if server is not None:
            server.close()
    expected = (
        ["proxy=http://s1:pw@127.0.0.1:3128", "hello from the proxy", "socket-shown"]
        if reaches
        else ["proxy=none", "unreachable", "no-socket"]
    )
    assert done.stdout.strip().splitlines() == expected, done.stdout + done.stderr


def _greeter(path: Path) -> socket.socket:
    """A unix socket that answers each connection with one line (closed by the caller)."""
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"hello from the proxy\n")

    threading.Thread(target=serve, daemon=True).start()
    return server


def test_a_probe_left_behind_by_a_killed_start_does_not_stop_the_next(sandbox: CommandSandbox) -> None:
    """A start SIGKILLed during its probe leaves the probe's directory: the next start probes
    over it."""
    (sandbox.root / "probe" / "workspace").mkdir(parents=True)
    sandbox.probe()
    assert not (sandbox.root / "probe").exists()


def test_a_sandbox_whose_agent_removed_its_tmp_link_is_written_again_at_the_next_start(
    sandbox: CommandSandbox, host: dict[str, Path]
) -> None:
    """Under a /tmp state dir the private /tmp holds a link back to itself, which the agent can
    delete (it is in its /tmp): the next start puts it back instead of failing."""
    first = sandbox.prepare("s1", host["workspace"], proxy=False)
    tmp = first.tmp
    assert tmp.is_relative_to("/tmp"), "pytest's directories are under /tmp"
    link = tmp / tmp.relative_to("/tmp")
    assert link.is_symlink()
    link.unlink()
    again = sandbox.prepare("s1", host["workspace"], proxy=False)
    assert link.is_symlink() and os.readlink(link) == "/tmp"
    assert again.command is not None
    done = subprocess.run(
        [str(again.command), f"cd {tmp} && pwd -P"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stdout.strip() == "/tmp", done.stderr


def test_var_tmp_is_the_sandbox_s_own_tmp(sandbox: CommandSandbox, host: dict[str, Path]) -> None:
    """Tools that write to /var/tmp write to the private /tmp, never the host's."""
    done = _run(sandbox, host["workspace"], "echo kept > /var/tmp/t && cat /tmp/t")
    assert done.returncode == 0 and done.stdout == "kept\n", done.stderr


def test_a_hidden_path_that_is_not_there_is_left_out(host: dict[str, Path]) -> None:
    """A service file named but missing (an access file not mounted) hides nothing and breaks
    nothing: bwrap could not mount over a path that does not exist in a read-only /etc."""
    missing = Path("/etc") / f"agent-rewind-absent-{os.getpid()}" / "access.yaml"
    sandbox = CommandSandbox.find(
        host["state"] / "sandbox", need_socat=False, hidden=[missing, host["state"]]
    )
    assert sandbox.hidden == (host["state"].resolve(),)
    done = _run(sandbox, host["workspace"], "echo ran")
    assert done.stdout == "ran\n", done.stderr
