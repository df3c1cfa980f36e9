"""What DeleteSession erases on disk: everything the Claude Code CLI keeps of a session under its
config dir, and the session's workspace when the caller asks. (The ledger's rows are the store's
to erase; the workspace snapshots are `snapshotting.Snapshots.delete`.)

What the CLI (2.1.x, run through the SDK) writes for a session under `$CLAUDE_CONFIG_DIR`, as
found by running sessions through the service and listing the directory (docs/sessions.md):

- `projects/<project>/<sid>.jsonl`: the transcript, every branch of it;
- `projects/<project>/<sid>/`: `subagents/agent-*.jsonl` and `.meta.json` (subagent
  transcripts), `tool-results/` (large tool outputs);
- `file-history/<sid>/`: the file backups its checkpoints restore from;
- `session-env/<sid>/`;
- `sessions/<pid>.json` (naming the session and its workspace) and `sessions/<pid>.*.key`
  while a process runs; the CLI removes them when it exits, a killed one leaves them.

Other files it names after the session in some configurations (a task list `tasks/<sid>/`,
`todos/<sid>-agent-*.json`, `debug/<sid>.txt`, `startup-perf/<sid>.*`, `uploads/<sid>/`,
`image-cache/<sid>/`) are found the same way: any entry of the config dir's top two levels (three
under `projects/`) whose name holds the session id is the session's, since ids are UUIDs. The
prompt history `history.jsonl` is written by the interactive CLI only, never through the SDK; a
line of it naming the session or its workspace is dropped all the same. Nothing else the CLI
writes (`.claude.json`, `backups/`, `shell-snapshots/`, `plugins/`) holds a session's content.

Symbolic links are never followed out of what is erased: a link is removed, not its target.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

# The CLI's directory of live processes: `<pid>.json` names the session a process runs.
_LIVE_PROCESSES = "sessions"
_PROMPT_HISTORY = "history.jsonl"


def remove_tree(path: Path) -> None:
    """Removes a file, a link (never its target) or a directory tree (links in it removed as links)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _entries(directory: Path) -> Iterator[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as found:
            yield from found
    except (FileNotFoundError, NotADirectoryError):
        return


def named_after(config_dir: Path, session_id: str) -> list[Path]:
    """Entries of the CLI's config dir that are the session's by name (see the module's docstring)."""
    out: list[Path] = []
    for top in _entries(config_dir):
        if session_id in top.name:
            out.append(Path(top.path))
            continue
        if not top.is_dir():  # follows a linked directory: the CLI writes through it too
            continue
        for entry in _entries(Path(top.path)):
            if session_id in entry.name:
                out.append(Path(entry.path))
            elif top.name == "projects" and entry.is_dir():
                out.extend(Path(e.path) for e in _entries(Path(entry.path)) if session_id in e.name)
    return out


def _live_process_files(config_dir: Path, session_id: str) -> list[Path]:
    """`sessions/<pid>.json` of processes that ran the session, and their `<pid>.*.key`."""
    out: list[Path] = []
    directory = config_dir / _LIVE_PROCESSES
    for entry in _entries(directory):
        if not entry.name.endswith(".json") or not entry.is_file(follow_symlinks=False):
            continue
        try:
            record = json.loads(Path(entry.path).read_text(errors="replace"))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("sessionId") == session_id:
            pid = entry.name.removesuffix(".json")
            out.append(Path(entry.path))
            out.extend(Path(e.path) for e in _entries(directory) if e.name.startswith(f"{pid}."))
    return out


def _belongs(line: str, session_id: str, cwd: str) -> bool:
    try:
        entry = json.loads(line)
    except ValueError:
        return session_id in line
    if not isinstance(entry, dict):
        return False
    return entry.get("sessionId") == session_id or bool(cwd and entry.get("project") == cwd)


def _drop_history_lines(config_dir: Path, session_id: str, cwd: str) -> int:
    """Rewrites the CLI's prompt history without the session's lines (atomically); how many."""
    path = config_dir / _PROMPT_HISTORY
    if path.is_symlink() or not path.is_file():
        return 0
    lines = path.read_text(errors="surrogateescape").splitlines(keepends=True)
    kept = [line for line in lines if not (line.strip() and _belongs(line, session_id, cwd))]
    if len(kept) == len(lines):
        return 0
    temporary = path.with_name(f".{path.name}.{session_id}.tmp")
    with open(temporary, "w", errors="surrogateescape") as out:
        out.writelines(kept)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)
    return len(lines) - len(kept)


def erase_cli_files(config_dir: Path, session_id: str, cwd: str = "") -> list[Path]:
    """Erases everything the CLI keeps of the session (no process of it may be running); what it
    removed. Raises OSError when something could not be removed (a retry goes on from there)."""
    if len(session_id) < 32:  # every name holds the empty string: only a full id is safe
        raise ValueError(f"not a session id: {session_id!r}")
    removed: list[Path] = []
    for path in [*named_after(config_dir, session_id), *_live_process_files(config_dir, session_id)]:
        remove_tree(path)
        removed.append(path)
        parent = path.parent
        if parent.parent.name == "projects" and parent.parent.parent == config_dir:
            with contextlib.suppress(OSError):  # not empty: another session's transcripts
                parent.rmdir()
    if _drop_history_lines(config_dir, session_id, cwd):
        removed.append(config_dir / _PROMPT_HISTORY)
    return removed


class WorkspaceRefused(Exception):
    """The workspace is not where the session had it: a component of its path became a link."""


def remove_workspace(cwd: str, roots: Iterable[Path]) -> bool:
    """Deletes the session's workspace directory; whether there was one.

    Only a directory strictly inside a workspace root, reached without any symbolic link: a
    workspace replaced by a link loses the link (its target is not the session's), and one whose
    parent became a link is refused (WorkspaceRefused). Links inside are removed as links.
    """
    path = Path(cwd)
    roots = tuple(roots)
    if not path.is_absolute() or not any(path.is_relative_to(r) and path != r for r in roots):
        raise WorkspaceRefused(f"{cwd} does not lie inside a workspace root")
    if path.is_symlink():
        path.unlink()
        return True
    if not path.exists():
        return False
    if path.resolve() != path:
        raise WorkspaceRefused(f"{cwd} is reached through a symbolic link now; it is left alone")
    if not path.is_dir():
        raise WorkspaceRefused(f"{cwd} is not a directory")
    shutil.rmtree(path)
    return True
