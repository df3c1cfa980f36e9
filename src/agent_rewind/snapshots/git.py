"""Sealed git: how the snapshot store runs git on a workspace it must not trust.

The workspace is written by the agent, so it may hold anything git would otherwise obey: a
`.git/config` naming an fsmonitor or a filter program, hooks, a `.gitattributes` asking for a
clean filter, textconv or re-encoding. None of it may configure git or make it run a program:

- The environment starts empty (never `os.environ`): only PATH, a HOME that does not exist, and
  the GIT_* variables below. No system, global or XDG config, attributes or excludes file is read.
- `GIT_DIR` is the snapshot repository under the state dir, so git never discovers (nor reads
  the config of) the workspace's own `.git`; git skips every `.git` entry of the work tree.
- Every call passes `CONFIG` on the command line, and the repository's own config holds the same.
- `info/attributes` (which outranks every `.gitattributes`) unsets `filter`, `text`, `ident` and
  `working-tree-encoding` for every path, and resets `diff` to git's own binary detection.
"""

from __future__ import annotations

import copy
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from agent_rewind.snapshots.errors import GitFailed, GitTimeout, SnapshotError

# The object id of the empty tree (SHA-1 repositories, which are the only ones the store makes).
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"

CONFIG: tuple[tuple[str, str], ...] = (
    # Nothing runs: no hooks, no fsmonitor daemon, no pager, no network.
    ("core.hooksPath", "/dev/null"),
    ("core.fsmonitor", "false"),
    ("core.pager", "cat"),
    ("protocol.allow", "never"),
    ("submodule.recurse", "false"),
    # Bytes in, bytes out: no line-ending conversion; symlinks are stored as links.
    ("core.autocrlf", "false"),
    ("core.safecrlf", "false"),
    ("core.symlinks", "true"),
    ("core.filemode", "true"),
    ("core.attributesFile", "/dev/null"),
    ("core.excludesFile", "/dev/null"),
    # Git refuses some names only to protect checkouts on Windows and macOS (a backslash, `git~1`).
    # Nothing checks these objects out there: the store writes restored files itself.
    ("core.protectNTFS", "false"),
    ("core.protectHFS", "false"),
    ("core.quotepath", "false"),
    ("core.preloadIndex", "true"),
    # `ls-files -o` does not use the untracked cache; keeping one would only cost index writes.
    ("core.untrackedCache", "false"),
    # A snapshot rewrites the index twice (update-index, then write-tree saving its cache-tree):
    # with a split index that writes the few changed entries, not every entry of a big workspace.
    # Git never expires a shared part itself: it would delete the old one before the index that
    # replaces it is in place, and a git killed in between would leave an index pointing at
    # nothing. The store deletes the parts its index no longer uses after each snapshot.
    ("core.splitIndex", "true"),
    ("splitIndex.sharedIndexExpire", "never"),
    ("core.logAllRefUpdates", "false"),
    # Objects go away only when keep_only says so.
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
    ("repack.writeBitmaps", "false"),
    ("diff.renames", "false"),
    ("diff.noprefix", "false"),
    ("diff.mnemonicPrefix", "false"),
    ("color.ui", "false"),
)

ATTRIBUTES = "* -text !eol -filter -ident -working-tree-encoding !diff -merge\n"

_CONFIG_ARGS: tuple[str, ...] = tuple(arg for key, value in CONFIG for arg in ("-c", f"{key}={value}"))


def _config_text() -> str:
    """CONFIG as a config file: `[section]` headers with their keys (every key is `section.key`)."""
    sections: dict[str, list[str]] = {}
    for key, value in CONFIG:
        section, name = key.split(".", 1)
        sections.setdefault(section, []).append(f"\t{name} = {value}\n")
    return "".join(f"[{section}]\n" + "".join(lines) for section, lines in sections.items())


def available() -> str | None:
    """Why workspace snapshots cannot work on this host (git missing), or None when they can."""
    search_path = os.environ.get("PATH") or SAFE_PATH
    if shutil.which("git", path=search_path) is None:
        return f"git is not installed (searched {search_path}); install git for workspace snapshots"
    return None


def _executable(search_path: str) -> str:
    found = shutil.which("git", path=search_path)
    if found is None:
        raise SnapshotError(f"git is not installed (searched {search_path})")
    return found


class Git:
    """Runs git on one snapshot repository and one workspace, sealed (see the module docstring).

    `deadline` arguments are `time.monotonic()` values: a command still running then is killed
    and `GitTimeout` raised. The private index lives inside the repository.
    """

    def __init__(self, repo: Path, workspace: Path) -> None:
        self.repo = repo
        self.workspace = workspace
        self.index = repo / "snapshot.index"
        search_path = os.environ.get("PATH") or SAFE_PATH
        self._base_env = {
            "PATH": search_path,
            "HOME": str(repo / "no-home"),  # never created: no ~/.gitconfig, ~/.config/git/*
            "LC_ALL": "C",
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_SYSTEM": "/dev/null",
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_ATTR_NOSYSTEM": "1",
            "GIT_NO_REPLACE_OBJECTS": "1",
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_OPTIONAL_LOCKS": "0",
            "GIT_PAGER": "cat",
        }
        self._env = {
            **self._base_env,
            "GIT_DIR": str(repo),
            "GIT_WORK_TREE": str(workspace),
            "GIT_INDEX_FILE": str(self.index),
            # A path is a path: `*` or `:(glob)` in a file name is not pathspec syntax.
            "GIT_LITERAL_PATHSPECS": "1",
        }
        self._search_path = search_path
        self._git: str | None = None

    def with_index(self, index: Path) -> Git:
        """The same sealed git on the same repository, with another index file (a scratch one)."""
        other = copy.copy(self)
        other.index = index
        other._env = {**self._env, "GIT_INDEX_FILE": str(index)}
        return other

    def with_env(self, **extra: str) -> Git:
        """The same sealed git with more variables set, for one use (an alternate object
        directory to copy from: `seed`). Only GIT_ALTERNATE_OBJECT_DIRECTORIES is accepted."""
        if set(extra) - {"GIT_ALTERNATE_OBJECT_DIRECTORIES"}:
            raise ValueError(f"not a variable the sealed git takes: {sorted(extra)}")
        other = copy.copy(self)
        other._env = {**self._env, **extra}
        return other

    def _argv(self, args: Sequence[str]) -> list[str]:
        if self._git is None:
            self._git = _executable(self._search_path)
        return [self._git, *_CONFIG_ARGS, *args]

    def _environment(self, literal: bool) -> dict[str, str]:
        if literal:
            return self._env
        # check-ignore refuses the literal magic; its callers mark paths with `:/:` instead.
        return {k: v for k, v in self._env.items() if k != "GIT_LITERAL_PATHSPECS"}

    def _complete(
        self, args: Sequence[str], stdin: bytes, deadline: float | None, literal: bool = True
    ) -> subprocess.CompletedProcess[bytes]:
        timeout = _remaining(deadline, args)
        try:
            return subprocess.run(
                self._argv(args),
                input=stdin,
                capture_output=True,
                env=self._environment(literal),
                cwd=self.workspace,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as err:  # run() has killed and reaped it
            raise GitTimeout(f"git {args[0]} ran past the deadline") from err

    def run(
        self,
        *args: str,
        stdin: bytes = b"",
        deadline: float | None = None,
        ok: tuple[int, ...] = (0,),
        literal: bool = True,
    ) -> bytes:
        """Runs one git command to its end and returns its stdout; another exit code than `ok`
        raises GitFailed."""
        done = self._complete(args, stdin, deadline, literal)
        if done.returncode not in ok:
            raise GitFailed(args[0], done.returncode, done.stderr.decode(errors="replace"))
        return done.stdout

    def run_with_stderr(self, *args: str, stdin: bytes = b"", deadline: float | None = None) -> str:
        """Runs a command for its effect and returns what it said on stderr while succeeding
        (update-index reports the paths it skipped only there)."""
        done = self._complete(args, stdin, deadline)
        stderr = done.stderr.decode(errors="replace")
        if done.returncode != 0:
            raise GitFailed(args[0], done.returncode, stderr)
        return stderr

    def merge_file(self, ours: Path, base: Path, theirs: Path, deadline: float | None = None) -> bytes | None:
        """`git merge-file` of three files (its own three-way merge by lines): the merged bytes,
        or None when the changes of ours and theirs overlap. No file is changed."""
        args = ("merge-file", "-p", "-q", str(ours), str(base), str(theirs))
        done = self._complete(args, b"", deadline)
        if done.returncode == 0:
            return done.stdout
        if 0 < done.returncode < 128:  # the number of conflicts
            return None
        raise GitFailed("merge-file", done.returncode, done.stderr.decode(errors="replace"))

    def run_parallel(self, commands: Sequence[Sequence[str]], deadline: float | None) -> list[bytes]:
        """Runs read-only commands at once (two cores halve a snapshot's scan); all or none
        succeed, and on the deadline every one of them is killed."""
        procs = [
            subprocess.Popen(
                self._argv(args),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self._env,
                cwd=self.workspace,
            )
            for args in commands
        ]
        try:
            outputs: list[bytes] = []
            for args, proc in zip(commands, procs, strict=True):
                try:
                    out, err = proc.communicate(timeout=_remaining(deadline, args))
                except subprocess.TimeoutExpired as error:
                    raise GitTimeout(f"git {args[0]} ran past the deadline") from error
                if proc.returncode != 0:
                    raise GitFailed(args[0], proc.returncode, err.decode(errors="replace"))
                outputs.append(out)
            return outputs
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                proc.communicate()

    def popen(self, *args: str) -> subprocess.Popen[bytes]:
        """A long-running command (cat-file --batch) the caller feeds and must reap."""
        return subprocess.Popen(
            self._argv(args),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=self._env,
            cwd=self.workspace,
        )

    def popen_io(self, *args: str, stdin: IO[bytes] | int = subprocess.PIPE) -> subprocess.Popen[bytes]:
        """A command the caller feeds (or pipes another into) and reaps, with its stdout and
        stderr as pipes."""
        return subprocess.Popen(
            self._argv(args),
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self._env,
            cwd=self.workspace,
        )

    def init(self) -> None:
        """Creates the repository if it does not exist: bare, without templates (no sample
        hooks), with CONFIG and ATTRIBUTES. It is built beside its path and renamed into place,
        so a crash never leaves a half-made repository behind."""
        if self.repo.is_dir():
            return
        self.repo.parent.mkdir(parents=True, exist_ok=True)
        scratch = self.repo.with_name(f".{self.repo.name}.init-{secrets.token_hex(6)}")
        try:
            subprocess.run(
                [_executable(self._search_path), "init", "--bare", "--quiet", "--template=", str(scratch)],
                capture_output=True,
                env=self._base_env,
                cwd=self.repo.parent,
                check=True,
            )
            with (scratch / "config").open("a", encoding="utf-8") as config:
                config.write(_config_text())
            (scratch / "info").mkdir(exist_ok=True)
            (scratch / "info" / "attributes").write_text(ATTRIBUTES, encoding="utf-8")
            # The workspace's own .gitignore files are honoured; nothing is added to them.
            (scratch / "info" / "exclude").write_text("", encoding="utf-8")
            try:
                scratch.rename(self.repo)
            except OSError:
                if not self.repo.is_dir():  # else another store made it first: use that one
                    raise
        except subprocess.CalledProcessError as err:
            raise GitFailed("init", err.returncode, err.stderr.decode(errors="replace")) from err
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def clear_stale_locks(self) -> None:
        """Removes lock files a killed or crashed git left behind. Safe only because one store
        instance serves one session at a time and every git it starts has ended by now."""
        for lock in (
            self.index.with_name(self.index.name + ".lock"),
            self.repo / "packed-refs.lock",
            self.repo / "refs" / "agent-rewind" / "keep.lock",
            *self.repo.glob("sharedindex_*"),  # a shared index being written
        ):
            lock.unlink(missing_ok=True)

    def drop_unused_shared_indexes(self) -> None:
        """Deletes the shared index parts the index does not stand on (replaced ones, or one
        whose index was never put in place). Same safety as clear_stale_locks."""
        shared = list(self.repo.glob("sharedindex.*"))
        if len(shared) > 1:
            used = Path(os.fsdecode(self.run("rev-parse", "--shared-index-path").strip())).name
            for part in shared:
                if part.name != used:
                    part.unlink(missing_ok=True)

    def drop_index(self) -> None:
        """Forgets the index (and its shared parts): the next snapshot hashes every file again."""
        for path in (self.index, *self.repo.glob("sharedindex.*")):
            path.unlink(missing_ok=True)


def _remaining(deadline: float | None, args: Sequence[str]) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise GitTimeout(f"the deadline passed before git {args[0]} could start")
    return left
