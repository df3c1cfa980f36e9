"""The CLI's confinement (sandbox/cli.py, sandbox/launcher.py), run for real with Landlock: what a
process confined as a session's CLI can and cannot reach, whatever path it is handed. A swap that
wins the race against the service's check is a link already in place when the process opens it:
these tests plant it first.

The proof that the service starts every CLI this way is tests/integration/test_isolation.py."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agent_rewind.sandbox import CommandSandbox, SandboxUnavailable, launcher
from agent_rewind.sandbox.cli import PROGRAMS, CliConfinement, niced
from agent_rewind.sandbox.commands import private_directories, write_program


@pytest.fixture
def host(tmp_path: Path) -> dict[str, Path]:
    state = tmp_path / "state"
    config = state / "claude"
    mine = state / "workspaces" / "mine"
    theirs = state / "workspaces" / "theirs"
    for d in (mine, theirs, config / "projects" / "theirs"):
        d.mkdir(parents=True)
    (theirs / "secret.txt").write_text("theirs\n")
    (config / "projects" / "theirs" / "t.jsonl").write_text("their transcript\n")
    (state / "ledger.sqlite3").write_text("ledger\n")
    (mine / "own.txt").write_text("mine\n")
    return {"state": state, "config": config, "mine": mine, "theirs": theirs}


def _confined(host: dict[str, Path], *, door: bool = False) -> tuple[CliConfinement, Path]:
    """A session's confinement, and the rules its CLI is started with."""
    root = host["state"] / "sessions"
    cli = CliConfinement.find(root, host["config"], Path("/bin/true"), hidden=[host["state"]])
    base = root / "s1"
    own = private_directories(base)
    if door:
        sandbox = CommandSandbox.find(root, need_socat=False, hidden=[host["state"]])
        own = sandbox.prepare("s1", host["mine"], proxy=False, programs=base / PROGRAMS)
    cli.prepare("s1", host["mine"], own, transcript_dir=host["config"] / "projects" / "mine", base=base)
    return cli, base / PROGRAMS / "cli.rules"


def _run(rules: Path, *argv: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-I", "-S", launcher.__file__, "cli", str(rules), "--", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        **kw,
    )


def _sh(rules: Path, script: str) -> subprocess.CompletedProcess[str]:
    return _run(rules, "/bin/sh", "-c", script)


def test_the_kernel_has_a_landlock_the_service_can_use() -> None:
    assert launcher.abi() >= launcher.MIN_ABI, "this machine's kernel is the one the suite runs on"


def test_a_confined_cli_works_in_its_workspace_and_its_own_files(host: dict[str, Path]) -> None:
    _, rules = _confined(host)
    done = _sh(
        rules,
        "cat own.txt && echo new > new.txt && mkdir d && mv new.txt d/ && rm d/new.txt && "
        f"echo line >> {host['config']}/projects/mine/s1.jsonl && "
        f"echo backup > {host['config']}/file-history/s1/b@v1 && "
        f"echo kept > {host['state']}/sessions/s1/config/x.json && ls /usr/bin/env >/dev/null",
    )
    # (cwd: the workspace, as the SDK starts the CLI)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "mine\n"


@pytest.fixture(autouse=True)
def _in_workspace(host: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(host["mine"])


@pytest.mark.parametrize(
    "target",
    [
        "theirs/secret.txt",  # another session's workspace
        "ledger.sqlite3",  # the state dir
        "claude/projects/theirs/t.jsonl",  # another session's transcript
        "sessions/s1/bin/cli.rules",  # its own rules (read, yes: run, yes; written, never)
    ],
)
def test_a_link_that_won_the_race_leads_nowhere(host: dict[str, Path], target: str) -> None:
    """What the issue's race produced: a path the hook saw in the workspace is a link to another
    tenant's file when the CLI opens it. The kernel refuses the read or the write."""
    real = host["state"] / target if not target.startswith("theirs") else host["theirs"] / "secret.txt"
    (host["mine"] / "link").symlink_to(real)
    _, rules = _confined(host)
    before = real.read_bytes()
    done = _sh(rules, "cat link; echo pwned > link; echo pwned >> link")
    assert "Permission denied" in done.stderr
    assert real.read_bytes() == before, "nothing written through the link"
    if not target.endswith("cli.rules"):
        assert before.decode() not in done.stdout, "nothing read through the link"


def test_a_directory_swapped_for_a_link_leads_nowhere(host: dict[str, Path]) -> None:
    (host["mine"] / "dir").symlink_to(host["theirs"])
    _, rules = _confined(host)
    done = _sh(rules, "cat dir/secret.txt; echo pwned > dir/new.txt; ls dir")
    assert done.stdout == ""
    assert not (host["theirs"] / "new.txt").exists()


def test_a_confined_cli_reads_no_other_process_and_nothing_of_tmp(host: dict[str, Path]) -> None:
    sleeper = subprocess.Popen(["sleep", "30"], env={"SECRET_OF_ANOTHER": "canary"})
    try:
        _, rules = _confined(host)
        done = _sh(
            rules,
            f"cat /proc/{sleeper.pid}/environ; cat /proc/{os.getpid()}/cmdline; ls /tmp; ls /dev/shm",
        )
    finally:
        sleeper.kill()
        sleeper.wait()
    assert "canary" not in done.stdout and "pytest" not in done.stdout
    assert done.stdout == ""
    # Its own process's entries it reads (the runtime does).
    assert "Name:\tcat" in _run(rules, "/bin/cat", "/proc/self/status").stdout


def test_the_confinement_is_inherited_and_cannot_be_undone(host: dict[str, Path]) -> None:
    _, rules = _confined(host)
    again = f"{sys.executable} -I -S {launcher.__file__} cli {rules} -- /bin/cat {host['theirs']}/secret.txt"
    done = _sh(rules, f"/bin/sh -c 'cat {host['theirs']}/secret.txt'; {again}")
    assert "theirs" not in done.stdout


def test_the_door_runs_a_command_in_the_command_sandbox_and_returns_its_status(host: dict[str, Path]) -> None:
    _, rules = _confined(host, door=True)
    door = host["state"] / "sessions" / "s1" / PROGRAMS / "door"
    done = _sh(
        rules, f"{door} 'echo out; echo err >&2; test -e /proc/1 && cat /proc/1/cmdline; exit 7'; echo rc=$?"
    )
    assert done.stdout.splitlines()[0] == "out"
    assert done.stdout.endswith("rc=7\n")
    assert "err" in done.stderr
    assert "bwrap" not in done.stdout


def test_a_command_whose_door_call_is_killed_is_ended(host: dict[str, Path]) -> None:
    _, rules = _confined(host, door=True)
    door = host["state"] / "sessions" / "s1" / PROGRAMS / "door"
    marker = host["mine"] / "still-running"
    script = f"{door} 'sleep 3; touch still-running' & pid=$!; sleep 1; kill -TERM $pid; wait $pid; sleep 3"
    started = time.monotonic()
    done = _sh(rules, script)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started >= 4
    assert not marker.exists(), "the command outlived its door call"


def test_the_cli_gets_the_signal_and_its_exit_status_is_the_launcher_s(host: dict[str, Path]) -> None:
    _, rules = _confined(host)
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", launcher.__file__, "cli", str(rules), "--", "/bin/sh", "-c", "sleep 30"]
    )
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 128 + signal.SIGTERM
    assert _sh(rules, "exit 3").returncode == 3


def test_a_kernel_without_landlock_is_refused_naming_the_way_out(
    host: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launcher, "abi", lambda: 2)
    with pytest.raises(SandboxUnavailable, match="--cli-confinement off"):
        CliConfinement.find(host["state"], host["config"], Path("/bin/true"))


def test_the_probe_passes_here(host: dict[str, Path]) -> None:
    cli, _ = _confined(host)
    cli.probe(host["mine"], host["theirs"] / "secret.txt")
    with pytest.raises(SandboxUnavailable):
        cli.probe(host["mine"], host["mine"] / "own.txt")  # readable: the probe says it is not confined


def test_a_probe_that_fails_names_what_the_launcher_said(host: dict[str, Path]) -> None:
    """The last line the confined program wrote, as text, in the refusal an operator reads."""
    cli, _ = _confined(host)
    broken = dataclasses.replace(cli, python="/bin/sh")  # no Python: sh refuses `-I`
    with pytest.raises(SandboxUnavailable) as refused:
        broken.probe(host["mine"], host["theirs"] / "secret.txt")
    message = str(refused.value)
    assert "Illegal option -" in message and "b'" not in message, message


def test_a_first_session_makes_the_shared_config_dir_its_links_lead_to(host: dict[str, Path]) -> None:
    """A fresh state dir: the shared config dir does not exist before the first session's CLI."""
    fresh = host["state"] / "fresh" / "claude"
    root = host["state"] / "sessions"
    cli = CliConfinement.find(root, fresh, Path("/bin/true"), hidden=[host["state"]])
    base = root / "s1"
    cli.prepare(
        "s1", host["mine"], private_directories(base), transcript_dir=fresh / "projects" / "m", base=base
    )
    for name in ("projects", "file-history"):
        assert (base / "config" / name).resolve() == (fresh / name).resolve()
        assert (fresh / name).is_dir()


def test_a_directory_the_service_cannot_list_is_left_out_of_a_grant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As /etc/ssl/private is to the image's user: granted around, not a failed start."""
    from agent_rewind.sandbox.cli import _around

    tree = tmp_path / "tree"
    for name in ("open/a", "closed/secret", "closed/key"):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(name)
    listed = Path.iterdir

    def iterdir(path: Path) -> Any:
        if path == tree / "closed":
            raise PermissionError(13, "Permission denied", str(path))
        return listed(path)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    assert sorted(_around(tree, [tree / "closed" / "key"])) == [tree / "open"]


def test_the_door_serves_only_the_cli_s_own_processes(host: dict[str, Path]) -> None:
    """Its socket is a path, which Landlock does not keep another session's process from
    connecting to: the door serves only a process below its CLI."""
    _, rules = _confined(host, door=True)
    base = host["state"] / "sessions" / "s1"
    cli = subprocess.Popen(
        [sys.executable, "-I", "-S", launcher.__file__, "cli", str(rules), "--", "/bin/sleep", "30"]
    )
    try:
        door = base / "run" / "door.sock"
        deadline = time.monotonic() + 10
        while not door.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        outsider = subprocess.run(
            [sys.executable, "-I", "-S", launcher.__file__, "run", str(door), "touch pwned"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    finally:
        cli.kill()
        cli.wait()
    assert outsider.returncode == 126, outsider.stderr
    assert not (host["mine"] / "pwned").exists()


def test_a_tree_is_granted_around_the_service_s_files_in_it(tmp_path: Path) -> None:
    from agent_rewind.sandbox.cli import _around

    tmp_path = tmp_path / "tree"
    for name in ("a.txt", "keys/tls.key", "keys/ca.pem", "deep/er/secret", "deep/other"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    (tmp_path / "link").symlink_to(tmp_path / "keys")
    hidden = [tmp_path / "keys" / "tls.key", tmp_path / "deep" / "er"]
    assert sorted(_around(tmp_path, hidden)) == sorted(
        [tmp_path / "a.txt", tmp_path / "keys" / "ca.pem", tmp_path / "deep" / "other", tmp_path / "link"]
    )
    assert _around(tmp_path, [tmp_path]) == [], "a hidden tree is not granted at all"
    assert _around(tmp_path / "a.txt", hidden) == [tmp_path / "a.txt"]


def test_a_service_file_inside_a_granted_tree_is_not_readable_by_the_cli(host: dict[str, Path]) -> None:
    """As a key in /etc or a state dir inside the venv would be: here, the venv's own
    pyvenv.cfg stands for it, with the venv's interpreter beside it still granted."""
    secret = Path(sys.prefix) / "pyvenv.cfg"
    root = host["state"] / "sessions"
    cli = CliConfinement.find(root, host["config"], Path("/bin/true"), hidden=[host["state"], secret])
    base = root / "s1"
    cli.prepare("s1", host["mine"], private_directories(base), transcript_dir=host["config"] / "p", base=base)
    done = _sh(base / PROGRAMS / "cli.rules", f"cat {secret}; {sys.executable} -I -S -c 'print(2 + 2)'")
    assert "home" not in done.stdout and done.stdout.strip().endswith("4"), done.stdout + done.stderr


def test_a_kernel_with_landlock_abi_3_is_enough(
    host: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launcher, "abi", lambda: launcher.MIN_ABI)
    assert CliConfinement.find(host["state"], host["config"], Path("/bin/true")).abi == launcher.MIN_ABI


def test_what_a_session_s_cli_is_started_with(host: dict[str, Path]) -> None:
    root = host["state"] / "sessions"
    cli = CliConfinement.find(root, host["config"], Path("/bin/true"), hidden=[host["state"]])
    sandbox = CommandSandbox.find(root, need_socat=False, hidden=[host["state"]])
    base = root / "s1"
    own = sandbox.prepare("s1", host["mine"], proxy=False, programs=base / PROGRAMS)
    confined = cli.prepare("s1", host["mine"], own, transcript_dir=host["config"] / "p", base=base)
    assert confined.path == base / PROGRAMS / "cli" and os.access(confined.path, os.X_OK)
    assert confined.env["CLAUDE_CONFIG_DIR"] == str(base / "config")
    assert confined.env["HOME"] == str(base / "home")
    assert confined.env["CLAUDE_CODE_SHELL_PREFIX"] == str(base / PROGRAMS / "door")
    assert subprocess.run([confined.path, "--version"], capture_output=True, check=False).returncode == 0


def test_an_interpreter_path_too_long_for_a_shebang_line_is_run_by_a_shell(host: dict[str, Path]) -> None:
    deep = host["state"] / ("d" * 100) / ("e" * 100) / "python"
    deep.parent.mkdir(parents=True)
    deep.symlink_to(sys.executable)
    root = host["state"] / "sessions"
    cli = CliConfinement.find(root, host["config"], Path("/bin/echo"), hidden=[host["state"]])
    cli = dataclasses.replace(cli, python=str(deep))
    base = root / "s1"
    confined = cli.prepare(
        "s1", host["mine"], private_directories(base), transcript_dir=host["config"] / "p", base=base
    )
    assert confined.path.read_text().startswith("#!/bin/sh")
    done = subprocess.run([confined.path, "hello"], capture_output=True, text=True, check=False)
    assert done.stdout == "hello\n", done.stderr


def test_what_the_cli_put_in_place_of_its_config_links_is_moved_aside(host: dict[str, Path]) -> None:
    _confined(host)
    config = host["state"] / "sessions" / "s1" / "config"
    (config / "projects").unlink()
    (config / "projects").mkdir()
    (config / "projects" / "forged.jsonl").write_text("{}\n")
    (config / "file-history").unlink()
    (config / "file-history").symlink_to(host["theirs"])
    _confined(host)
    assert (config / "projects").resolve() == (host["config"] / "projects").resolve()
    assert (config / "file-history").resolve() == (host["config"] / "file-history").resolve()
    assert [p.name for p in config.glob("projects.replaced-*/*")] == ["forged.jsonl"]


def test_a_command_still_running_when_the_cli_exits_is_ended(host: dict[str, Path]) -> None:
    """Twice over: bwrap's --die-with-parent ends it when the door's process goes, and the door
    ends what it still runs before it goes (each alone passes this test)."""
    _, rules = _confined(host, door=True)
    door = host["state"] / "sessions" / "s1" / PROGRAMS / "door"
    started = time.monotonic()
    done = _sh(rules, f"{door} 'touch started; sleep 2; touch outlived' & sleep 0.5; exit 0")
    assert done.returncode == 0 and time.monotonic() - started < 2
    time.sleep(2.5)
    assert (host["mine"] / "started").exists(), "the command ran"
    assert not (host["mine"] / "outlived").exists(), "the command outlived its CLI"


def _niceness_of(output: str) -> int:
    """nice(1) with no command prints the niceness it runs at."""
    return int(output.strip().splitlines()[-1])


def test_a_confined_cli_and_what_it_runs_run_nicer_by_the_rules_nice(host: dict[str, Path]) -> None:
    root = host["state"] / "sessions"
    base = root / "s1"
    cli = CliConfinement.find(root, host["config"], Path("/bin/true"), hidden=[host["state"]], nice=7)
    cli.prepare("s1", host["mine"], private_directories(base), transcript_dir=host["config"] / "p", base=base)
    mine = os.nice(0)
    done = _sh(base / PROGRAMS / "cli.rules", "nice; sh -c nice")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split()
    assert [int(x) for x in lines] == [min(mine + 7, 19)] * 2, done.stdout
    _, plain = _confined(host)  # nice 0: the rules say nothing of it
    assert "nice" not in plain.read_bytes().split(b"\0")
    assert _niceness_of(_sh(plain, "nice").stdout) == mine


def test_an_unconfined_cli_s_program_runs_it_nicer(tmp_path: Path) -> None:
    program = niced(tmp_path / "s1", Path("/bin/sh"), 5)
    assert program == tmp_path / "s1" / PROGRAMS / "cli" and os.access(program, os.X_OK)
    done = subprocess.run(
        [program, "-c", "nice; echo $0 $1", "x", "arg"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(min(os.nice(0) + 5, 19)), "x", "arg"]


def test_an_unconfined_cli_that_cannot_be_started_says_so(tmp_path: Path) -> None:
    program = niced(tmp_path / "s1", tmp_path / "missing", 5)
    done = subprocess.run([program], capture_output=True, text=True, check=False)
    assert done.returncode == 126
    assert "the CLI could not be started" in done.stderr and "Traceback" not in done.stderr


def test_a_session_s_program_is_written_only_when_it_changes(tmp_path: Path) -> None:
    """Rewritten at every start, it would be refused at exec (ETXTBSY) whenever a process forked
    meanwhile still held the new file open for writing: unchanged, it is left as it is."""
    program = tmp_path / "cli"
    write_program(program, "#!/bin/sh\necho one\n")
    first = program.stat()
    assert first.st_mode & 0o777 == 0o700
    write_program(program, "#!/bin/sh\necho one\n")
    assert program.stat().st_ino == first.st_ino and program.stat().st_mtime_ns == first.st_mtime_ns
    program.chmod(0o755)
    write_program(program, "#!/bin/sh\necho one\n")
    assert program.stat().st_mode & 0o777 == 0o700 and program.stat().st_ino != first.st_ino
    write_program(program, "#!/bin/sh\necho two\n")
    assert subprocess.run([program], capture_output=True, text=True, check=True).stdout == "two\n"
