"""The Claude Code processes a server runs, as the operating system sees them.

Tests and benchmarks must not take the server's word for which processes it runs, nor pick
processes by what their command line happens to mention (a checkout path can contain anything).
A CLI process is one whose executable is the bundled Claude Code binary and that descends from
the server's process; a session's is the one whose command line names its id.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from agent_rewind.sessions.adapter import cli_binary

_PROC = Path("/proc")


@dataclass(frozen=True)
class CliProcess:
    pid: int
    ppid: int
    argv: tuple[str, ...]

    def environ(self) -> dict[str, str]:
        """The process's environment, {} once it is gone."""
        try:
            raw = (_PROC / str(self.pid) / "environ").read_bytes()
        except OSError:
            return {}
        pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
        return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}

    def names(self, session_id: str) -> bool:
        """Whether the command line starts or resumes this session (--session-id / --resume)."""
        return any(a == session_id or a.endswith("=" + session_id) for a in self.argv)


def _stat(pid: str) -> tuple[str, int] | None:
    """(state, ppid) of a process, None once it is gone."""
    try:
        stat = (_PROC / pid / "stat").read_text()
    except OSError:
        return None
    # The command name sits in parentheses and may hold spaces or parentheses itself.
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0], int(fields[1])


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in _PROC.iterdir():
        if entry.name.isdigit() and (st := _stat(entry.name)) is not None:
            children.setdefault(st[1], []).append(int(entry.name))
    return children


def descendants(root: int) -> list[int]:
    """Every process below `root`, its children's children included."""
    children = _children()
    out: list[int] = []
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _is_cli(pid: int, binary: Path) -> bool:
    try:
        exe = os.readlink(_PROC / str(pid) / "exe")
    except OSError:
        return False
    return exe == str(binary)


def cli_processes(root: int | None = None, *, config_dir: Path | None = None) -> list[CliProcess]:
    """Live Claude Code processes, oldest pid first: those below `root` (default: this process),
    or, with `config_dir`, every one on the machine that keeps its transcripts there (its
    CLAUDE_CONFIG_DIR, or its own config dir's `projects` link), whatever became of its parent (a server that died leaves its CLI processes to init)."""
    binary = cli_binary().resolve()
    if config_dir is not None:
        candidates = [int(e.name) for e in _PROC.iterdir() if e.name.isdigit()]
    else:
        candidates = descendants(os.getpid() if root is None else root)
    found = []
    for pid in candidates:
        st = _stat(str(pid))
        if st is None or st[0] in ("Z", "X") or not _is_cli(pid, binary):
            continue
        try:
            argv = (_PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        process = CliProcess(pid, st[1], tuple(a.decode(errors="replace") for a in argv if a))
        if config_dir is None or _serves(process, config_dir):
            found.append(process)
    # A CLI starting a program (a shell for Bash, git, ripgrep) forks first: until the child
    # execs, it is a copy of its parent, same binary and arguments. It is that CLI's, not another.
    pids = {p.pid for p in found}
    return sorted((p for p in found if p.ppid not in pids), key=lambda p: p.pid)


def _serves(process: CliProcess, config_dir: Path) -> bool:
    """Whether a CLI keeps its transcripts in `config_dir`: its CLAUDE_CONFIG_DIR, or a confined
    CLI's own config dir whose `projects` leads there (sandbox/cli.py)."""
    own = process.environ().get("CLAUDE_CONFIG_DIR")
    if own is None:
        return False
    if own == str(config_dir):
        return True
    return os.path.realpath(Path(own) / "projects") == os.path.realpath(config_dir / "projects")


def cli_pids(
    session_id: str | None = None, root: int | None = None, *, config_dir: Path | None = None
) -> list[int]:
    """Pids of the live CLI processes (see `cli_processes`); only the session's when given."""
    return [
        p.pid for p in cli_processes(root, config_dir=config_dir) if session_id is None or p.names(session_id)
    ]


def rss_kb(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in KB; (0, 0) once it is gone or a zombie."""
    try:
        status = (_PROC / str(pid) / "status").read_text()
    except OSError:
        return 0, 0
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    if fields.get("State", "").strip()[:1] in ("Z", "X"):
        return 0, 0

    def kb(name: str) -> int:
        return int(fields.get(name, "0 kB").split()[0])

    return kb("VmRSS"), kb("VmHWM")


def tree_rss_kb(pids: list[int]) -> int:
    """Resident memory of these processes and everything they started, in KB."""
    everything = set(pids)
    for pid in pids:
        everything.update(descendants(pid))
    return sum(rss_kb(p)[0] for p in everything)
