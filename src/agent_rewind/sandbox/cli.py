"""The Claude Code CLI process itself, confined by the kernel to what its session needs.

The PreToolUse hook (sessions/policy.py) resolves a file tool's path and allows it when it lies
in the workspace; the CLI opens it later, so an agent that swaps a path for a link in between
(a background command can) reaches past a check made in user space. So every session's CLI runs
in a Landlock domain (sandbox/launcher.py) that the kernel enforces at every open, whatever the
hook allowed. Of the filesystem it may:

- read and run: the system (`/usr` and the links into it, `/etc` less the service's own files),
  the Python and the venv the service runs from (the CLI's binary, the launcher), `/proc` (with
  the service not root, Landlock refuses it another process's environment, memory and
  descriptors), a few devices (`/dev/null`, `/dev/zero`, `/dev/random`, `/dev/urandom`);
- also write: its workspace, its session's own directory (temporary files, runtime, and its own
  config dir: CLAUDE_CONFIG_DIR is per session, so `.claude.json`, its process keys and its
  plugins are no other session's), its transcript's directory and its file-history directory in
  the shared config dir (reached from its own config dir through links the service makes);
- nothing else: no other session's transcript, backups, workspace or keys, not the ledger, the
  snapshots, the state dir, the service's keys, `/tmp` or `/dev/shm`.

Its commands still run in the command sandbox (sandbox/commands.py), started for it from outside
the domain (bubblewrap mounts, which no process in a Landlock domain may), through the launcher's
door. The hook stays: it is the first, friendly refusal; the kernel is the boundary.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent_rewind.sandbox import launcher
from agent_rewind.sandbox.commands import SandboxUnavailable, SessionSandbox, existing, write_program

# What every CLI may read and run (the links among them lead into /usr).
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
_DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom", "/dev/full")
# What a runtime reads of the machine and of itself: the CPUs and memory it may use, and its own
# process's entries (`/proc/self`, taken by the CLI's process itself), never another process's.
_MACHINE = (
    "/proc/self",
    "/proc/cpuinfo",
    "/proc/meminfo",
    "/proc/stat",
    "/proc/loadavg",
    "/proc/uptime",
    "/proc/version",
    "/proc/filesystems",
    "/proc/sys/kernel",
    "/proc/sys/vm",
    "/sys/fs/cgroup",
    "/sys/devices/system/cpu",
)
# The service's programs and the CLI's rules, in the session's directory: read and run, never
# written by the CLI (the door's program runs outside its confinement).
PROGRAMS = "bin"
# What the CLI writes in the session's directory.
_OWN = ("tmp", "run", "config", "home")


@dataclass(frozen=True)  # gremlin: pardon[equivalent] nothing assigns to or hashes one
class ConfinedCli:
    """What a session's CLI is started with: the program the SDK runs as the CLI, and the
    environment it adds."""

    path: Path
    env: dict[str, str]


def _around(tree: Path, hidden: Sequence[Path]) -> list[Path]:
    """`tree`, or when one of `hidden` lies in it, everything in it but that (recursively)."""
    inside = [h for h in hidden if h.is_relative_to(tree)]
    if not inside:
        return [tree]
    if tree in inside or tree.is_symlink() or not tree.is_dir():
        return []
    out: list[Path] = []
    try:
        entries = sorted(tree.iterdir())
    except OSError:
        return []
    for entry in entries:
        out.extend(_around(entry, inside))
    return out


@dataclass(frozen=True)  # gremlin: pardon[equivalent] nothing assigns to or hashes one
class CliConfinement:
    """Writes each session's confined CLI under `root` (the state dir's `sessions/`); one per server."""

    root: Path
    # The shared config dir: every session's transcripts and file backups.
    config_dir: Path
    # The CLI binary the SDK would run.
    binary: Path
    hidden: tuple[Path, ...] = ()
    abi: int = 0
    python: str = field(default_factory=lambda: sys.executable)
    # Added to the CLI's niceness (--cli-nice), and so to its commands'.
    nice: int = 0

    @classmethod
    def find(
        cls, root: Path, config_dir: Path, binary: Path, *, hidden: Iterable[Path] = (), nice: int = 0
    ) -> CliConfinement:
        """The confinement of this host, or SandboxUnavailable naming what is missing."""
        version = launcher.abi()
        if version < launcher.MIN_ABI:
            found = f"Landlock ABI {version}" if version else "no Landlock"
            raise SandboxUnavailable(
                f"--cli-confinement landlock needs Landlock ABI {launcher.MIN_ABI} or later (Linux 6.2, "
                f"with landlock in the kernel's lsm= list) to confine the CLI's file tools; this host has "
                f"{found}: run on a newer kernel, or serve with --cli-confinement off"
            )
        return cls(root, config_dir, binary, tuple(existing(hidden)), version, nice=nice)

    def _read(self) -> list[Path]:
        """What every CLI may read and run; a tree that holds one of the service's own files (the
        state dir, a workspace root, a key) is granted around it."""
        runtime = [
            Path(sys.prefix),
            Path(sys.base_prefix),
            Path(self.python).resolve().parent,
            self.binary.parent,
            Path(launcher.__file__).parent,  # (outside the venv in a development install)
        ]
        out: list[Path] = []
        for tree in existing([*map(Path, _SYSTEM), *runtime]):
            out.extend(p for p in _around(tree, self.hidden) if p not in out)
        return out + [Path(p) for p in _MACHINE]

    def prepare(
        self, session_id: str, cwd: Path, own: SessionSandbox, *, transcript_dir: Path, base: Path
    ) -> ConfinedCli:
        """Writes the session's confinement (its own config dir, its rules, the program the SDK
        runs as its CLI) and returns it. `own.command`, when set, is the command sandbox's program:
        the CLI reaches it through the launcher's door."""
        own_dirs = [base / name for name in _OWN]
        programs = base / PROGRAMS
        history = self.config_dir / "file-history" / session_id
        for path in (*own_dirs, programs, transcript_dir, history):
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
        config, home = base / "config", base / "home"
        for name in ("projects", "file-history"):
            _link(config / name, self.config_dir / name)
        paths = [("read", str(p)) for p in (*self._read(), programs)]
        paths += [("device", p) for p in _DEVICES]
        paths += [("write", str(p)) for p in (cwd, *own_dirs, transcript_dir, history)]
        door: dict[str, str] = {}
        env = {"CLAUDE_CONFIG_DIR": str(config), "HOME": str(home)}
        if own.command is not None:
            socket = own.runtime / "door.sock"
            door = {"socket": str(socket), "program": str(own.command)}
            client = programs / "door"
            _launcher(self.python, client, ["run", str(socket)], "sys.argv[1:2]", '"$1"')
            env["CLAUDE_CODE_SHELL_PREFIX"] = shlex.quote(str(client))
        rules_path = programs / "cli.rules"
        launcher.write_rules(str(rules_path), paths, door, self.nice)
        program = programs / "cli"
        _launcher(
            self.python, program, ["cli", str(rules_path), "--", str(self.binary)], "sys.argv[1:]", '"$@"'
        )
        return ConfinedCli(program, env)

    def probe(self, workspace: Path, outside: Path) -> None:
        """Runs a program confined like a session's CLI; SandboxUnavailable unless it can write
        `workspace` and cannot read `outside`."""
        base = self.root / "probe-cli"
        own = SessionSandbox(tmp=base / "tmp", runtime=base / "run")
        self.prepare("probe", workspace, own, transcript_dir=base / "transcript", base=base)
        check = f"test -w {shlex.quote(str(workspace))} && ! cat {shlex.quote(str(outside))} >/dev/null 2>&1"
        rules = str(base / PROGRAMS / "cli.rules")
        try:
            done = subprocess.run(
                [self.python, "-I", "-S", launcher.__file__, "cli", rules, "--", "/bin/sh", "-c", check],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            raise SandboxUnavailable(f"the CLI could not be confined: {err}") from err
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip().splitlines()
            raise SandboxUnavailable(
                "the CLI could not be confined with Landlock"
                + (f" ({detail[-1]})" if detail else "")
                + ": serve with --cli-confinement off where the kernel cannot"
            )


def niced(base: Path, binary: Path, nice: int, python: str = sys.executable) -> Path:
    """The program that runs an unconfined CLI (--cli-confinement off) `nice` lower than the
    service (--cli-nice), in the session's own programs directory under `base`."""
    programs = base / PROGRAMS
    programs.mkdir(parents=True, exist_ok=True, mode=0o700)
    program = programs / "cli"
    _launcher(python, program, ["nice", str(nice), "--", str(binary)], "sys.argv[1:]", '"$@"')
    return program


def _launcher(python: str, path: Path, args: list[str], python_rest: str, shell_rest: str) -> None:
    """A program that runs the launcher with `args` and its own arguments: Python itself, the
    launcher imported (its compiled form cached, unlike a script's), a shell and a compile fewer
    on the way of every CLI start and every command; a shell script where the interpreter's path
    is too long for a `#!` line."""
    if len(python) < _SHEBANG_MAX:
        _write(
            path,
            f"#!{python} -IS\n{_HEADER}import sys\n"
            f"sys.path.insert(0, {os.path.dirname(launcher.__file__)!r})\n"
            f"import launcher\nsys.exit(launcher.main([*{args!r}, *{python_rest}]))\n",
        )
    else:
        quoted = " ".join(shlex.quote(a) for a in args)
        _write_program(
            path, f"exec {shlex.quote(python)} -I -S {shlex.quote(launcher.__file__)} {quoted} {shell_rest}"
        )


def _link(link: Path, target: Path) -> None:
    """`link` made a symlink to `target`, in the session's config dir, which the CLI may write:
    whatever it put there instead (another link, a file, a directory of its own) is moved aside
    (kept, for whoever wants to see what it did), so the CLI writes its transcript and backups where the service reads them again."""
    if link.is_symlink() and os.readlink(link) == str(target):
        return
    if os.path.lexists(link):
        link.rename(link.with_name(f"{link.name}.replaced-{os.urandom(4).hex()}"))
    link.symlink_to(target)


_HEADER = "# Written by agent-rewind (src/agent_rewind/sandbox/cli.py, docs/security.md).\n"
# The kernel reads at most 255 bytes of a `#!` line.
_SHEBANG_MAX = 240


def _write_program(path: Path, line: str) -> None:
    _write(path, f"#!/bin/sh\n{_HEADER}{line}\n")


def _write(path: Path, text: str) -> None:
    write_program(path, text)
