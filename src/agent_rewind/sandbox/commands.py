"""The command sandbox: every command a session's agent runs, confined with bubblewrap.

The CLI runs each shell command (a Bash call, a background task, a subagent's Bash, Monitor)
through `CLAUDE_CODE_SHELL_PREFIX`; this module writes, per session, the program it names: a
script that hands the command to `bwrap` with a view of the host built from an allowlist, not
by hiding what is known to be secret:

- read-only: `/usr` and the top-level links or directories into it (`/bin`, `/lib`, ...), and
  `/etc` with the service's own files hidden (access file, TLS keys, password files);
- read-write: the session's workspace, at its own path, and the session's private temporary
  directory (as `/tmp` and at its own path, where the CLI looks for what commands leave there);
- nothing else: not the state dir (ledger, transcripts, backups, snapshots), not another
  workspace, not the service's home or code, not `/run` or `/var` (no database or Docker socket);
- its own user, PID, IPC, UTS and network namespaces: a fresh `/proc` that shows only the
  command's own processes (not the server's or the CLI's environment or command line), no
  network interface but its own loopback, no nested user namespaces;
- an environment of its own: bwrap itself starts from an empty one (`env -i`), the command gets
  a fixed PATH, HOME and TMPDIR in the private temporary directory, and nothing of the CLI's (no
  model credential, no messaging socket, no trace context);
- nothing of the CLI or of bwrap inside: the command is the PID namespace's first process
  (`--as-pid-1`), so `/proc/1` is the command's own shell (its environment, argv and descriptors),
  never bwrap's with the CLI's environment and the sandbox's arguments; its standard input is
  /dev/null, not the CLI's end of a socket pair;
- bounded: at most `limits.processes` processes (threads count) and `limits.memory` bytes of
  data per process (RLIMIT_NPROC and RLIMIT_DATA, set inside the sandbox's own user namespace,
  so they count its processes only): a fork bomb fails there and leaves other sessions serving.
  RLIMIT_NPROC binds every user but root: a service run as root has only the pod's pids limit;
- with allowed hosts, an HTTP proxy on 127.0.0.1:3128 inside, bridged by socat to the service's
  egress proxy (sandbox/proxy.py), which lets through only those hosts.

A link the agent plants in its workspace resolves inside this view, so it leads nowhere outside.
CPU is not bounded here (the pod's limit is; docs/security.md).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# Inside every sandbox.
PROXY_PORT = 3128
_PROXY_SOCKET = "/run/agent-rewind/proxy.sock"
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The top-level entries of a Debian-like root that hold programs and libraries.
_SYSTEM = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
# Variables the CLI sets for a command that it, or tools, rely on, and that say nothing secret,
# with the value each has when the CLI did not set it.
_PASSED_ON = {
    "GIT_EDITOR": "true",
    "CLAUDECODE": "1",
    "COREPACK_ENABLE_AUTO_PIN": "0",
    "LANG": "C.UTF-8",
    "TERM": "dumb",
}
_GITCONFIG = """\
# Written by agent-rewind for commands in the sandbox (docs/security.md).
[user]
\tname = Claude (agent-rewind)
\temail = agent@agent-rewind.invalid
[init]
\tdefaultBranch = main
"""


@dataclass(frozen=True)  # gremlin: pardon[equivalent] nothing assigns to or hashes one
class CommandLimits:
    """What one sandboxed command (with everything it starts) may take."""

    # Processes and threads in the sandbox at once (RLIMIT_NPROC inside its user namespace).
    processes: int = 512
    # Bytes of data (heap and private writable mappings) one process may map (RLIMIT_DATA).
    memory: int = 4 << 30


class SandboxUnavailable(Exception):
    """Commands cannot be confined on this host; the message says what is missing."""


@dataclass(frozen=True)  # gremlin: pardon[equivalent] nothing assigns to or hashes one
class SessionSandbox:
    """A session's own directories for its CLI, and what runs its commands confined."""

    # The session's private temporary directory (the CLI's TMPDIR and scratch directory, the
    # commands' /tmp): erased with the session.
    tmp: Path
    # The CLI's XDG_RUNTIME_DIR (its messaging socket): private, and out of the commands' view.
    runtime: Path
    # The program CLAUDE_CODE_SHELL_PREFIX names; None with the sandbox off.
    command: Path | None = None

    def environment(self) -> dict[str, str]:
        """What the CLI's environment gets for this session."""
        env = {
            "TMPDIR": str(self.tmp),
            "CLAUDE_CODE_TMPDIR": str(self.tmp),
            "XDG_RUNTIME_DIR": str(self.runtime),
        }
        if self.command is not None:
            env["CLAUDE_CODE_SHELL_PREFIX"] = shlex.quote(str(self.command))
        return env


def session_dir(root: Path, session_id: str) -> Path:
    """Where a session's own directories are (`root`: the state dir's `sessions/`)."""
    return root / session_id


def write_program(path: Path, text: str) -> None:
    """Makes `path` a program (mode 0700) of `text`, atomically, and only when it is not that
    already: a program rewritten at every start of a session's CLI would be refused at exec
    (ETXTBSY) whenever a process forked meanwhile still holds the new file open for writing."""
    try:
        if path.read_text() == text and path.stat().st_mode & 0o777 == 0o700:
            return
    except (OSError, UnicodeDecodeError):
        pass
    staged = path.with_suffix(".new")
    staged.write_text(text)
    staged.chmod(0o700)
    os.replace(staged, path)


def private_directories(base: Path) -> SessionSandbox:
    """The session's temporary and runtime directories under `base`, made if missing."""
    tmp, runtime = base / "tmp", base / "run"
    for path in (tmp / "home", runtime):
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return SessionSandbox(tmp=tmp, runtime=runtime)


@dataclass(frozen=True)  # gremlin: pardon[equivalent] nothing assigns to or hashes one
class CommandSandbox:
    """Writes each session's sandbox under `root` (the state dir's `sessions/`); one per server."""

    root: Path
    bwrap: str
    socat: str | None = None
    # Paths of the service's own that must not show inside, wherever they are.
    hidden: tuple[Path, ...] = ()
    # The egress proxy's socket, when hosts are allowed.
    proxy_socket: Path | None = None
    # Extra environment for the proxy's credentials, per session: set by the server.
    proxy_url: Mapping[str, str] = field(default_factory=dict)
    limits: CommandLimits = field(default_factory=CommandLimits)

    @classmethod
    def find(cls, root: Path, *, need_socat: bool, hidden: Iterable[Path] = ()) -> CommandSandbox:
        """The sandbox of this host, or SandboxUnavailable naming what to install."""
        bwrap = shutil.which("bwrap")
        socat = shutil.which("socat")
        missing = [name for name, path in (("bubblewrap (bwrap)", bwrap), ("socat", socat)) if not path]
        if not need_socat:
            missing = [m for m in missing if m != "socat"]
        if missing:
            raise SandboxUnavailable(
                f"--sandbox on needs {' and '.join(missing)} to confine the agent's commands: "
                "install them (Debian: apt-get install bubblewrap socat), or serve with --sandbox off"
            )
        assert bwrap is not None
        return cls(root=root, bwrap=bwrap, socat=socat, hidden=tuple(existing(hidden)))

    def probe(self) -> None:
        """Runs one command in a sandbox like a session's; raises SandboxUnavailable if it cannot."""
        probe = self.root / "probe"
        workspace = probe / "workspace"
        workspace.mkdir(parents=True, exist_ok=True)
        # gremlin: pardon[equivalent] the probe checks the sandbox, not egress: with a proxy the same checks hold
        sandbox = self.prepare("probe", workspace, proxy=False, directory=probe)
        assert sandbox.command is not None
        try:
            # The workspace is writable, the sandbox's own program (in the state dir) is not
            # there, and /proc is the sandbox's own.
            hidden = shlex.quote(str(sandbox.command))
            check = f"test -w . && test ! -e {hidden} && test ! -e /proc/{os.getpid()}/environ"
            done = subprocess.run(
                [str(sandbox.command), check],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            raise SandboxUnavailable(f"bubblewrap could not run a command: {err}") from err
        finally:
            # gremlin: pardon[untestable] the service's own directory, removed by its owner, fails only on a broken disk
            shutil.rmtree(probe, ignore_errors=True)
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip().splitlines()
            if detail and "mount proc" in detail[-1]:
                raise SandboxUnavailable(
                    f"bubblewrap cannot confine commands here ({detail[-1]}): the container's /proc "
                    "is masked, so no sandbox may mount a /proc of its own; run the pod with "
                    "procMount: Unmasked and hostUsers: false (deploy/base does; podman: --userns "
                    "with --security-opt unmask=ALL), or serve with --sandbox off"
                )
            raise SandboxUnavailable(
                "bubblewrap cannot confine commands on this host"
                + (f" ({detail[-1]})" if detail else "")
                + ": it needs unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, "
                "user.max_user_namespaces > 0; in a container, a seccomp profile that allows them: "
                "docs/security.md), or serve with --sandbox off"
            )

    def _empty_file(self) -> Path:
        empty = self.root / "empty"
        if not empty.exists():  # the root exists: a session's own directories are in it
            empty.write_bytes(b"")
        return empty

    def prepare(
        self,
        session_id: str,
        workspace: Path,
        *,
        proxy: bool,
        directory: Path | None = None,
        proxy_url: str = "",
        programs: Path | None = None,
    ) -> SessionSandbox:
        """Writes the session's sandbox (its directories and the command program, in `programs`
        when given, else in the session's directory) and returns it."""
        base = directory or session_dir(self.root, session_id)
        dirs = private_directories(base)
        tmp = dirs.tmp
        if tmp.is_relative_to("/tmp"):
            # Inside, the directory's own path lies in the /tmp it is: the link that leads back
            # lives in the directory itself (a state dir under /tmp: tests, a developer's machine).
            link = tmp / tmp.relative_to("/tmp")
            if not link.is_symlink():
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to("/tmp")
        gitconfig = tmp / "home" / ".gitconfig"
        if not gitconfig.exists():
            gitconfig.write_text(_GITCONFIG)
        command = (programs or base) / "command"
        command.parent.mkdir(exist_ok=True, mode=0o700)  # the session's directory or its bin/
        text = _script(
            self._arguments(
                workspace, tmp, proxy=proxy and self.proxy_socket is not None, proxy_url=proxy_url
            ),
            proxy=proxy and self.proxy_socket is not None and self.socat is not None,
            limits=self.limits,
        )
        write_program(command, text)
        return dataclasses.replace(dirs, command=command)

    def _arguments(self, workspace: Path, tmp: Path, *, proxy: bool, proxy_url: str) -> list[str]:
        args = [
            self.bwrap,
            "--die-with-parent",
            "--new-session",
            "--unshare-user",
            "--unshare-ipc",
            "--unshare-pid",
            # The command is the namespace's first process: no bwrap reaper in there whose
            # /proc/1 shows bwrap's argv, environment and descriptors (the shell reaps orphans).
            "--as-pid-1",
            "--unshare-net",
            # A UTS namespace of its own, but no --hostname: sethostname is refused by the
            # seccomp profiles of containers without CAP_SYS_ADMIN (it failed so in the image test),
            # and the container's hostname (a pod name) tells the agent nothing it may not know.
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--disable-userns",
            "--ro-bind",
            "/usr",
            "/usr",
        ]
        for name in _SYSTEM:
            path = Path("/") / name
            if path.is_symlink():
                args += ["--symlink", os.readlink(path), str(path)]
            elif path.is_dir():
                args += ["--ro-bind", str(path), str(path)]
        args += ["--ro-bind", "/etc", "/etc"]
        args += _hide(self.hidden, self._empty_file())
        args += ["--proc", "/proc", "--dev", "/dev"]
        # The CLI names paths in its TMPDIR in the commands it runs (where a command leaves its
        # working directory, a background task's output): they lead to the same directory.
        args += ["--bind", str(tmp), "/tmp"]
        if not tmp.is_relative_to("/tmp"):
            args += ["--symlink", "/tmp", str(tmp)]
        if not any(p.is_relative_to("/var/tmp") for p in (workspace, tmp)):
            args += ["--symlink", "/tmp", "/var/tmp"]
        args += ["--bind", str(workspace), str(workspace), "--chdir", str(workspace)]
        if proxy and self.proxy_socket is not None:
            args += ["--ro-bind", str(self.proxy_socket), _PROXY_SOCKET]
        # The view's own root (the directories on the way to what is bound) is read-only too:
        # only the workspace and the private /tmp take writes.
        args += ["--remount-ro", "/"]
        args += ["--clearenv", "--setenv", "PATH", _PATH, "--setenv", "HOME", "/tmp/home"]
        args += ["--setenv", "TMPDIR", "/tmp", "--setenv", "AGENT_SANDBOX", "1"]
        if proxy and proxy_url:
            for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
                args += ["--setenv", name, proxy_url]
        return args


def existing(paths: Iterable[Path]) -> list[Path]:
    """Those of `paths` that exist, resolved (links followed to what they name)."""
    out = []
    for path in paths:
        try:
            out.append(path.resolve(strict=True))
        except (OSError, RuntimeError):
            continue
    return out


def _hide(paths: Sequence[Path], empty: Path) -> list[str]:
    """bwrap arguments that hide the service's own files inside the trees bound into the view:
    a directory (or the directory holding a file, when it is not the tree's root) gets an empty
    tmpfs over it, a file directly in a tree's root the empty file `empty`."""
    args: list[str] = []
    for path in paths:
        if not any(path.is_relative_to(tree) for tree in (Path("/etc"), Path("/usr"))):
            continue  # not in the view at all
        if path.is_dir():
            args += ["--tmpfs", str(path)]
        elif path.parent in (Path("/etc"), Path("/usr")):
            args += ["--ro-bind", str(empty), str(path)]
        else:
            args += ["--tmpfs", str(path.parent)]
    return args


def _script(args: list[str], *, proxy: bool, limits: CommandLimits) -> str:
    """The program CLAUDE_CODE_SHELL_PREFIX names: its one argument is the command's text.
    bwrap starts from an empty environment and /dev/null as its input; inside, the limits are set
    (in the sandbox's own user namespace, where RLIMIT_NPROC counts the sandbox's processes
    alone) before the command runs."""
    passed = " ".join(f'--setenv {name} "${{{name}:-{default}}}"' for name, default in _PASSED_ON.items())
    bwrap = " ".join(shlex.quote(a) for a in args)
    # A limit is only ever lowered here: one already lower (set by the operator) stays.
    bound = f"ulimit -u {limits.processes} 2>/dev/null; ulimit -d {limits.memory // 1024} 2>/dev/null"
    if not proxy:
        inner = f'{bound}; exec /bin/bash -c "$0"'
    else:
        # socat bridges the proxy's socket to a TCP port inside; the command starts once it listens.
        inner = (
            f"{bound}; "
            f"socat TCP-LISTEN:{PROXY_PORT},bind=127.0.0.1,fork,reuseaddr UNIX-CONNECT:{_PROXY_SOCKET} & "
            "i=0; while ! grep -qi ':0C38 00000000:0000 0A' /proc/net/tcp && [ $i -lt 500 ]; do "
            'sleep 0.01; i=$((i+1)); done; exec /bin/bash -c "$0"'
        )
    return (
        "#!/bin/sh\n"
        "# Written by agent-rewind: runs one command of the agent's in the command sandbox\n"
        "# (src/agent_rewind/sandbox/commands.py, docs/security.md).\n"
        f'exec env -i {bwrap} {passed} -- /bin/bash -c {shlex.quote(inner)} "$1" </dev/null\n'
    )
