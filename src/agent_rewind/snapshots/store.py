"""Workspace snapshots on git's object store: take, compare, restore, forget.

A session's workspace is snapshotted when each turn starts and ends; a files rewind later makes
some paths equal to an earlier snapshot again. A snapshot is a git tree in a bare repository under
the service's state dir (never inside the workspace), written through a private index that keeps
every file's stat data, so a snapshot re-hashes only the files that changed since the last one.
Git runs sealed (`snapshots.git`): nothing in the workspace can configure it or make it run
anything. The API is synchronous; callers run it in a thread, one call at a time per store.

What a snapshot holds: every regular file and symlink git would add with `git add -A` (the
workspace's `.gitignore` files are honoured; a file once recorded stays recorded until deleted,
as in git), symlinks as links (never followed). Not held: `.git` entries (git never descends into
them), empty directories, FIFOs and other special files.

Decisions:
- A nested repository (a subdirectory with its own `.git`) would make git record a gitlink, i.e.
  just a commit id, and lose the files. The store adds its files instead: it walks the directory
  itself (without following symlinks, skipping `.git`), drops what `git check-ignore` says is
  ignored, and adds the rest. Once the directory has entries in the index, git descends into it
  by itself in later snapshots.
- Bounds make a snapshot incomplete, never silently partial: a file over `max_file_bytes` (the
  rest is still recorded, the file is not), and more than `max_total_bytes` in the files this
  snapshot would hash (nothing is hashed then). An incomplete snapshot's `reason` says why.
- `diff` compares two trees; to compare with the workspace as it is now, take a snapshot first.
- `restore` refuses to start when a path holds neither the rollback tree's content nor already
  the restored one: the rollback could not put it back (an ignored file no snapshot holds, or a
  change made after the rollback snapshot). A restore interrupted by a crash can be run again.
- The workspace can make snapshots slow but never wrong: a FIFO where git reads a `.gitignore`
  or a nested repository's HEAD blocks git until the timeout kills it (incomplete, "timeout").
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import structlog

from agent_rewind.snapshots.errors import (
    GitFailed,
    GitTimeout,
    RestoreError,
    SnapshotError,
    UnsafePath,
)
from agent_rewind.snapshots.files import (
    MODE_EXECUTABLE,
    MODE_FILE,
    MODE_SYMLINK,
    Entry,
    Workspace,
    split,
)
from agent_rewind.snapshots.git import Git
from agent_rewind.snapshots.objects import MODE_TREE, Objects
from agent_rewind.snapshots.watch import Unwatchable, Watch

ChangeKind = Literal["added", "modified", "deleted"]

KEEP_REF = "refs/agent-rewind/keep"
DEFAULT_DIFF_BYTES = 64 * 1024

log = structlog.get_logger(__name__)


_OID = re.compile(r"[0-9a-f]{40}")
_KINDS: dict[bytes, ChangeKind] = {b"A": "added", b"D": "deleted", b"M": "modified", b"T": "modified"}
_RESTORABLE = (MODE_FILE, MODE_EXECUTABLE, MODE_SYMLINK)


@dataclass(frozen=True)
class Limits:
    """Bounds of one snapshot. `max_total_bytes` counts the bytes a snapshot would hash: the
    files new or changed since the previous snapshot (all of them for the first)."""

    max_file_bytes: int = 10 * 1024 * 1024
    max_total_bytes: int = 1024 * 1024 * 1024
    timeout_s: float = 30.0


@dataclass(frozen=True)
class Snapshot:
    """`tree` is the git tree id, None when nothing could be recorded. Only a complete snapshot
    holds the whole workspace; `reason` says what an incomplete one misses."""

    tree: str | None
    complete: bool
    reason: str = ""
    seconds: float = 0.0
    # How it was taken: "unchanged" (the watch saw nothing change: the last tree), "watched"
    # (the changed files hashed here), "paths" (git scanned the changed directories), "scan"
    # (git scanned the whole workspace); "" when it failed before knowing.
    how: str = ""


@dataclass(frozen=True)
class Change:
    """A path that differs between two trees (workspace-relative, posix), from the first to the
    second."""

    path: str
    kind: ChangeKind


@dataclass(frozen=True)
class FileDiff:
    """Git's patch of one path (its `diff --git` header included), cut at the size bound."""

    path: str
    change: ChangeKind
    unified_diff: str
    binary: bool
    truncated: bool


@dataclass
class _Plan:
    """What one snapshot does to the index: `update` goes through `update-index --add --remove`
    (hashing files, dropping the missing ones), `drop` through `--force-remove` (paths that must
    not be recorded: behind a symlink, a FIFO, over the size bound)."""

    update: list[str] = field(default_factory=list)
    drop: list[str] = field(default_factory=list)
    added_bytes: int = 0
    problems: list[str] = field(default_factory=list)


class SnapshotStore:
    """The snapshots of one workspace, in the bare repository `repo` (created on first use)."""

    def __init__(
        self, repo: Path, workspace: Path, limits: Limits | None = None, *, watch: bool = False
    ) -> None:
        """`watch`: follow the workspace with inotify between snapshots, so that a snapshot asks
        git about the paths that changed rather than scanning the workspace (`snapshots.watch`);
        `close()` stops it."""
        repo, workspace = Path(repo).absolute(), Path(workspace).absolute()
        real_repo, real_workspace = repo.resolve(), workspace.resolve()
        if real_repo.is_relative_to(real_workspace) or real_workspace.is_relative_to(real_repo):
            raise ValueError(f"the snapshot repository {repo} and the workspace {workspace} overlap")
        self.repo = repo
        self.workspace = workspace
        self.limits = limits or Limits()
        self._git = Git(repo, workspace)
        self._lock = threading.Lock()  # one take at a time: they share the index
        # Commands that only read objects run without the index (an empty one): a damaged index,
        # which the next scan rebuilds, never stops them; and they never wait on its lock.
        self._reader = self._git.with_index(repo / "no-index")
        self._objects = Objects(repo, self._reader)  # for the take of a few paths, and capture
        # Paths a take recorded without git (`_take_known`) since the index was last brought up
        # to date: the index still holds what they were until `_sync_index`.
        self._unsynced: set[str] = set()
        self._written: str | None = None  # the tree `_take_known` wrote last
        self._how = ""  # how the current take goes (Snapshot.how)
        self._watch: Watch | None = Watch(workspace) if watch else None
        # The tree the index held after the last complete snapshot, while the watch has seen
        # every change since; None when the next snapshot must scan the whole workspace.
        self._tree: str | None = None

    def close(self) -> None:
        """Stops watching the workspace (the next snapshot scans it; the store stays usable)."""
        with self._lock:
            self._tree = None
            if self._watch is not None:
                self._watch.close()

    # Taking

    def take(self) -> Snapshot:
        """Records the workspace as it is now. Never raises for the workspace's content: a
        failure, a bound or the timeout gives an incomplete snapshot saying why."""
        started = time.monotonic()
        tree: str | None = None
        with self._lock:
            self._how = ""
            self._tree, last = None, self._tree  # until this snapshot is known to be complete
            try:
                tree, problems = self._take(started + self.limits.timeout_s, last)
            except GitTimeout:
                problems = [f"timeout: the snapshot took over {self.limits.timeout_s:g} s"]
            except (SnapshotError, OSError) as err:
                problems = [f"error: {err}"]
            if tree is not None and not problems and self._watch is not None and self._watch.watching:
                self._tree = tree
            how = self._how
        return Snapshot(
            tree=tree,
            complete=tree is not None and not problems,
            reason=_summary(problems),
            seconds=time.monotonic() - started,
            how=how,
        )

    def _take(self, deadline: float, last: str | None) -> tuple[str | None, list[str]]:
        self._git.init()
        self._git.clear_stale_locks()  # a take killed at its deadline may have left one
        try:
            paths = self._changed(last, deadline)
        except GitFailed:  # the index cannot be read: the scan below finds so, and rebuilds it
            paths = None
        if paths is not None:
            assert last is not None
            if not paths:
                self._how = "unchanged"
                return last, []  # nothing changed since the last snapshot
            try:
                known = self._take_known(last, paths, deadline)
            finally:
                self._objects.close()
            if known is not None:
                self._how = "watched"
                if known[0] is not None:
                    self._unsynced |= paths
                    self._written = known[0]
                return known
        self._how = "scan" if paths is None else "paths"
        try:
            self._sync_index(deadline)
            changed, others = self._scan(deadline, paths)
        except GitFailed:
            if not self.workspace.is_dir():
                raise
            # The index cannot be read (a disk fault, a crash mid-write): it is only a cache of
            # stat data, so start over from none, hashing every file once more.
            self._git.drop_index()
            self._unsynced.clear()
            self._how = "scan"
            changed, others = self._scan(deadline)
        return self._record(changed, others, deadline)

    def _sync_index(self, deadline: float | None) -> None:
        """Gives the index the entries `_take_known` recorded without it (from the tree it wrote
        last), before git scans: a file recorded once stays recorded, ignored or not, as in git.
        Without stat data, git hashes those files again when it next looks at them."""
        if not self._unsynced:
            return
        assert self._written is not None
        lines = []
        for path in sorted(self._unsynced):
            entry = self._objects.lookup(self._written, path) if _capturable(path) else None
            if entry is None or entry[0] == MODE_TREE:
                lines.append(b"0 " + b"0" * 40 + b"\t" + os.fsencode(path) + b"\0")
            else:
                lines.append(f"{entry[0]} {entry[1]}\t".encode() + os.fsencode(path) + b"\0")
        try:
            self._git.run(
                "update-index", "-z", "--replace", "--index-info", stdin=b"".join(lines), deadline=deadline
            )
        finally:
            self._objects.close()
        self._unsynced.clear()

    def _take_known(self, last: str, paths: set[str], deadline: float) -> tuple[str | None, list[str]] | None:
        """The snapshot `last` with `paths` (all that changed since, as the watch saw it) as they
        are now, written without git: the blobs and the trees on the way to them are hashed here
        (`Objects.edit`), and only a new file asks git whether it is ignored (`check-ignore`, which
        reads no index). None when git must do it: a directory was made or removed.

        The same rules as a scan: a path behind a symlink, missing, or neither a file nor a
        symlink is not recorded; a name git refuses, or a file over the size bound, makes the
        snapshot incomplete; over the total bound nothing is written. The index is left as it
        was: the caller remembers the paths, for `_sync_index` before git next reads it."""
        objects = self._objects
        changes: dict[str, tuple[str, str] | None] = {}
        write: list[tuple[str, bool]] = []  # (path, tracked), to hash once the bounds are checked
        problems: list[str] = []
        total = 0
        real_dirs: dict[str, bool] = {"": True}
        for path in sorted(paths):
            if time.monotonic() > deadline:
                raise GitTimeout("the deadline passed while reading the changed files")
            if not _capturable(path):
                continue  # in a .git directory: git never records it
            old = objects.lookup(last, path)
            if old is not None and old[0] == MODE_TREE:
                return None
            gone = old is not None  # what the snapshot records for a path it must not hold
            if not self._real_dir(path.rpartition("/")[0], real_dirs):
                if gone:
                    changes[path] = None
                continue
            try:
                info = os.lstat(self.workspace / path)
            except (FileNotFoundError, NotADirectoryError):
                if gone:
                    changes[path] = None
                continue
            if stat.S_ISDIR(info.st_mode):
                return None
            problem = self._unrecordable(path, info)
            if problem is None:
                write.append((path, old is not None))
                total += info.st_size
                continue
            if problem:
                problems.append(problem)
            if gone:
                changes[path] = None
        if total > self.limits.max_total_bytes:
            return None, [f"total over {self.limits.max_total_bytes} bytes: {total} bytes changed", *problems]
        ignored = self._ignored([path for path, tracked in write if not tracked], deadline)
        with Workspace(self.workspace) as files:
            for path, tracked in write:
                if path in ignored:
                    continue
                try:
                    found = files.content(path, self.limits.max_file_bytes)
                except OSError as err:  # grew past the bound since its lstat, or unreadable
                    problems.append(f"{path}: {err.strerror or err}")
                    found = None
                if found is None:
                    if tracked:
                        changes[path] = None
                    continue
                mode, data = found
                changes[path] = (mode, objects.write(b"blob", data))
        try:
            return objects.edit(last, changes), problems
        except SnapshotError:
            return None  # a file became a directory's parent meanwhile: let git write it

    def _ignored(self, paths: list[str], deadline: float) -> set[str]:
        """Which of the untracked `paths` the workspace's ignore rules exclude."""
        if not paths:
            return set()
        # `:/:` turns off pathspec magic in a name; check-ignore refuses the literal flag.
        out = self._reader.run(
            "check-ignore", "--no-index", "-z", "--stdin",
            stdin=b"".join(b":/:" + os.fsencode(p) + b"\0" for p in paths),
            deadline=deadline, ok=(0, 1), literal=False,
        )  # fmt: skip
        return {p.removeprefix(":/:") for p in _paths(out)}

    def _changed(self, last: str | None, deadline: float) -> set[str] | None:
        """What the watch saw change since the snapshot whose tree is `last`, or None to scan
        everything (no watch, none trusted yet, or it may have missed something): then the
        watch is started over first, so that what changes during the scan is seen next time."""
        if self._watch is None:
            return None
        found = self._watch.changed() if last is not None else None
        if found is not None:
            return found
        # Not the directories git ignores: a `node_modules/` would cost watches, not snapshots.
        # The listing also names a directory that merely holds nothing but ignored files (a new
        # file there is not ignored): only those an ignore rule names themselves are skipped.
        listed = self._git.run(
            "ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--directory", deadline=deadline
        )
        ignored = self._ignored([p for p in _paths(listed) if p.endswith("/")], deadline)
        try:
            self._watch.start(ignored)
        except Unwatchable as err:
            log.warning(
                "workspace cannot be watched; its snapshots scan it",
                workspace=str(self.workspace),
                error=str(err),
            )
            self._watch = None
        return None

    def _record(self, changed: bytes, others: bytes, deadline: float) -> tuple[str | None, list[str]]:
        """Adds what the scan found to the index, and writes its tree."""
        untracked: list[str] = []
        nested: list[str] = []
        for path in _paths(others):
            (nested if path.endswith("/") else untracked).append(path)
        if nested:
            untracked += self._nested_files(nested, deadline)
        plan = self._plan(_paths(changed), untracked)
        if plan.added_bytes > self.limits.max_total_bytes:
            return None, [
                f"total over {self.limits.max_total_bytes} bytes: {plan.added_bytes} bytes changed",
                *plan.problems,
            ]
        if plan.drop:
            self._git.run(
                "update-index", "--force-remove", "-z", "--stdin", stdin=_nul(plan.drop), deadline=deadline
            )
        if plan.update:
            said = self._git.run_with_stderr(
                "update-index", "--add", "--remove", "--replace", "-z", "--stdin",
                stdin=_nul(plan.update), deadline=deadline,
            )  # fmt: skip
            if said.strip():  # "Ignoring path ...": git refused a name the plan let through
                plan.problems.append(f"git: {said.strip()[:300]}")
        tree = self._git.run("write-tree", deadline=deadline).decode().strip()
        with contextlib.suppress(SnapshotError, OSError):  # tidying only: the tree is written
            self._git.drop_unused_shared_indexes()
        return tree, plan.problems

    def _scan(self, deadline: float, paths: Iterable[str] | None = None) -> tuple[bytes, bytes]:
        """The tracked paths whose stat data changed, and the untracked ones (not ignored): of
        the whole workspace, or of `paths` (a directory stands for everything below it)."""
        if paths is None:
            spec: tuple[str, ...] = ()
            preload: tuple[str, ...] = ()
        else:
            spec = ("--", *sorted(paths))
            preload = ("-c", "core.preloadIndex=false")  # its threads would stat every file
        changed, others = self._git.run_parallel(
            [
                (*preload, "diff-files", "--name-only", "-z", *spec),
                ("ls-files", "-z", "--others", "--exclude-standard", *spec),
            ],
            deadline,
        )
        return changed, others

    def _plan(self, changed: list[str], untracked: list[str]) -> _Plan:
        """Sorts the paths git reported by what is there now, checking each file's size (lstat:
        a symlink's size is its target's length) before anything is hashed."""
        plan = _Plan()
        tracked = set(changed)
        real_dirs: dict[str, bool] = {"": True}
        for path in [*changed, *untracked]:
            if not self._real_dir(path.rpartition("/")[0], real_dirs):
                if path in tracked:  # behind a symlink now: update-index would refuse it
                    plan.drop.append(path)
                continue
            try:
                info = os.lstat(self.workspace / path)
            except (FileNotFoundError, NotADirectoryError):
                if path in tracked:
                    plan.update.append(path)  # deleted: --remove drops it
                continue
            if stat.S_ISDIR(info.st_mode):
                if path in tracked:
                    plan.update.append(path)  # a file became a directory: --remove drops it
                continue
            problem = self._unrecordable(path, info)
            if problem is None:
                plan.update.append(path)
                plan.added_bytes += info.st_size
                continue
            if problem:
                plan.problems.append(problem)
            if path in tracked:  # the snapshot must not claim the old content
                plan.drop.append(path)
        return plan

    def _unrecordable(self, path: str, info: os.stat_result) -> str | None:
        """None when a snapshot records the path (a file or symlink within the size bound); else
        why not: "" for what git never records (a FIFO, socket or device), or the problem that
        makes the snapshot incomplete (a name git refuses, a file over the bound)."""
        if not (stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode)):
            return ""
        if refused := _refused_by_git(path, stat.S_ISLNK(info.st_mode)):
            return f"unsupported path ({refused}): {path}"
        if info.st_size > self.limits.max_file_bytes:
            return f"file over {self.limits.max_file_bytes} bytes: {path}"
        return None

    def _real_dir(self, path: str, real_dirs: dict[str, bool]) -> bool:
        """Whether `path` and each of its parents is a directory, not a symlink to one."""
        known = real_dirs.get(path)
        if known is not None:
            return known
        real = self._real_dir(path.rpartition("/")[0], real_dirs)
        if real:
            try:
                real = stat.S_ISDIR(os.lstat(self.workspace / path).st_mode)
            except OSError:
                real = False
        real_dirs[path] = real
        return real

    def _nested_files(self, directories: list[str], deadline: float) -> list[str]:
        """The files of nested repositories, as git would add them were the `.git` not there."""
        found: list[str] = []
        pending = [d.rstrip("/") for d in directories]
        while pending:
            if time.monotonic() > deadline:
                raise GitTimeout("the deadline passed while listing a nested repository")
            directory = pending.pop()
            try:
                entries = list(os.scandir(self.workspace / directory))
            except OSError:
                continue  # vanished or unreadable: git would not list it either
            for entry in entries:
                if entry.name == ".git":
                    continue
                path = f"{directory}/{entry.name}"
                if entry.is_dir(follow_symlinks=False):
                    pending.append(path)
                elif entry.is_file(follow_symlinks=False) or entry.is_symlink():
                    found.append(path)
        if not found:
            return []
        # `:/:` turns off pathspec magic in a name; check-ignore refuses the literal flag.
        out = self._git.run(
            "check-ignore", "-z", "--stdin",
            stdin=b"".join(b":/:" + os.fsencode(p) + b"\0" for p in found),
            deadline=deadline, ok=(0, 1), literal=False,
        )  # fmt: skip
        ignored = {p.removeprefix(":/:") for p in _paths(out)}
        return [p for p in found if p not in ignored]

    # Reading

    def changes(self, a: str, b: str) -> list[Change]:
        """The paths whose content, mode or type differs from tree `a` to tree `b`."""
        out = self._reader.run("diff-tree", "-r", "-z", "--no-renames", _oid(a), _oid(b))
        fields = out.split(b"\0")
        changes: list[Change] = []
        for meta, path in zip(fields[0::2], fields[1::2], strict=False):
            if meta.startswith(b":"):
                changes.append(Change(os.fsdecode(path), _KINDS.get(meta.split()[-1][:1], "modified")))
        return changes

    def capture(self, paths: Iterable[str]) -> str:
        """A tree holding just `paths` as they are in the workspace now (a path that is missing,
        a directory, or behind a symlink is absent from it). Cheap, unlike `take`: a rewind uses
        it to keep what it is about to change, so it can be undone. No git process runs: the
        blobs and trees are hashed here and written as loose objects, as git writes them. Ignore
        rules do not apply (every path named is kept); a file over `max_file_bytes` raises."""
        with self._lock:
            return self._capture(paths)

    def _capture(self, paths: Iterable[str]) -> str:
        self._git.init()
        tree: dict[str, Any] = {}
        with Workspace(self.workspace) as files:
            for path in sorted({p for p in paths if _capturable(p)}):
                found = files.content(path, self.limits.max_file_bytes)
                if found is None:
                    continue
                mode, data = found
                *dirs, name = path.split("/")
                node = tree
                for part in dirs:
                    child = node.setdefault(part, {})
                    if not isinstance(child, dict):  # a file where a directory is: keep the file
                        break
                    node = child
                else:
                    node[name] = (mode, self._objects.write(b"blob", data))
        return self._write_tree(tree)

    def _write_tree(self, node: dict[str, Any]) -> str:
        entries: dict[str, tuple[str, str]] = {}
        for name, value in node.items():
            entries[name] = (MODE_TREE, self._write_tree(value)) if isinstance(value, dict) else value
        return self._objects.write_tree(entries)

    def overlay(self, base: str, source: str, paths: Iterable[str]) -> str:
        """The tree `base` with each of `paths` as it is in `source` (a path absent there is
        absent here): what the workspace holds after `restore(source, paths)` when it held `base`.
        Computed from the trees alone, without scanning the workspace."""
        wanted = sorted(set(paths))
        if not wanted:
            return _oid(base)
        with self._lock, self._objects:
            entries = self._entries_at(source, wanted)
            changes = {p: (entries[p].mode, entries[p].oid) if p in entries else None for p in wanted}
            return self._objects.edit(_oid(base), changes)

    def changes_many(self, pairs: Sequence[tuple[str, str]]) -> list[list[Change]]:
        """`changes(a, b)` for every pair, in one git process (a rewind compares every interval
        of the history it covers: hundreds of pairs for a point hundreds of turns back)."""
        wanted = [(_oid(a), _oid(b)) for a, b in pairs]
        distinct = sorted({pair for pair in wanted if pair[0] != pair[1]})
        found: dict[tuple[str, str], list[Change]] = {pair: [] for pair in distinct}
        if distinct:
            stdin = "".join(f"{a} {b}\n" for a, b in distinct).encode()
            out = self._reader.run("diff-tree", "--stdin", "-r", "-z", "--no-renames", stdin=stdin)
            current: list[Change] | None = None
            at = 0
            while at < len(out):
                if out[at : at + 1] == b":":  # a record: ":meta\0path\0"
                    meta_end = out.index(b"\0", at)
                    path_end = out.index(b"\0", meta_end + 1)
                    meta, path = out[at:meta_end], out[meta_end + 1 : path_end]
                    assert current is not None
                    current.append(Change(os.fsdecode(path), _KINDS.get(meta.split()[-1][:1], "modified")))
                    at = path_end + 1
                else:  # a pair's header: "<a> <b>\n"
                    line_end = out.index(b"\n", at)
                    a, _, b = out[at:line_end].decode().partition(" ")
                    current = found[(a, b)]
                    at = line_end + 1
        return [found.get(pair, []) for pair in wanted]

    def files(self, tree: str) -> list[str]:
        """Every path tree `tree` holds (to restore all of it, e.g. into a forked workspace)."""
        return sorted(self._entries(tree))

    def diff(
        self, a: str, b: str, paths: Iterable[str] | None = None, max_bytes: int = DEFAULT_DIFF_BYTES
    ) -> list[FileDiff]:
        """Git's patch per changed path from tree `a` to tree `b` (only `paths` when given), each
        cut at `max_bytes`; binary content is flagged, not shown. One git streams the patches of
        a batch of paths, and no more than `max_bytes` of a path's patch is ever kept."""
        a, b = _oid(a), _oid(b)
        changes = self._typed_changes(a, b)
        wanted = None if paths is None else set(paths)
        found: dict[str, FileDiff] = {}
        for batch in [[]] if wanted is None else _batches(sorted(wanted)):
            # A pathspec matches its path and everything under it. Git's patches come in the
            # order of its changes, two for a change of type (a file that became a symlink).
            spec = set(batch)
            matched = [(c, retyped) for c, retyped in changes if not spec or _under(c.path, spec)]
            if not matched:
                continue
            patches = iter(self._patches(a, b, batch, max_bytes, sum(1 + retyped for _, retyped in matched)))
            for change, retyped in matched:
                parts = [next(patches) for _ in range(1 + retyped)]
                if (wanted is None or change.path in wanted) and change.path not in found:
                    found[change.path] = _file_diff(change, parts, max_bytes)
        return [found[c.path] for c, _ in changes if c.path in found]

    def _typed_changes(self, a: str, b: str) -> list[tuple[Change, bool]]:
        """changes(a, b), each with whether the path changed type (file, symlink)."""
        out = self._reader.run("diff-tree", "-r", "-z", "--no-renames", a, b)
        fields = out.split(b"\0")
        typed: list[tuple[Change, bool]] = []
        for meta, path in zip(fields[0::2], fields[1::2], strict=False):
            if meta.startswith(b":"):
                old, new, *_, status = meta[1:].split()
                change = Change(os.fsdecode(path), _KINDS.get(status[:1], "modified"))
                typed.append((change, status[:1] == b"T" and int(old, 8) >> 12 != int(new, 8) >> 12))
        return typed

    def _patches(self, a: str, b: str, pathspec: list[str], max_bytes: int, expected: int) -> list[_Patch]:
        proc = self._reader.popen(
            "diff-tree", "-r", "-p", "--no-renames", "--no-ext-diff", "--no-textconv", "--no-color",
            a, b, "--", *pathspec,
        )  # fmt: skip
        patches: list[_Patch] = []
        try:
            assert proc.stdin is not None and proc.stdout is not None  # both are pipes
            proc.stdin.close()
            for line in proc.stdout:
                if line.startswith(b"diff --git "):
                    patches.append(_Patch())
                if patches:
                    patches[-1].add(line, max_bytes)
            if proc.wait() != 0:
                raise GitFailed("diff-tree", proc.returncode, "")
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()
        if len(patches) != expected:
            raise SnapshotError(f"git gave {len(patches)} patches for {expected} changes")
        return patches

    def numstat(self, a: str, b: str, paths: Iterable[str] | None = None) -> tuple[int, int]:
        """Lines inserted and deleted from tree `a` to tree `b` in `paths` (all when None);
        binary files count none."""
        wanted = None if paths is None else set(paths)
        out = self._reader.run("diff-tree", "-r", "-z", "--numstat", "--no-renames", _oid(a), _oid(b))
        insertions = deletions = 0
        for record in out.split(b"\0"):
            added, _, rest = record.partition(b"\t")
            removed, _, path = rest.partition(b"\t")
            if not path or (wanted is not None and os.fsdecode(path) not in wanted):
                continue
            if added.isdigit() and removed.isdigit():  # "-" for binary
                insertions += int(added)
                deletions += int(removed)
        return insertions, deletions

    def _entries_at(self, tree: str, paths: Iterable[str]) -> dict[str, Entry]:
        """What `tree` holds at each of `paths` that is a file or a symlink there, read without
        git while its trees are loose (the store's own, until a collection packs them)."""
        root = _oid(tree)
        found: dict[str, Entry] = {}
        for path in paths:
            entry = self._objects.lookup(root, path)
            if entry is not None and entry[0] != MODE_TREE:
                found[path] = Entry(*entry)
        return found

    def _entries(self, tree: str) -> dict[str, Entry]:
        out = self._reader.run("ls-tree", "-r", "-z", "--full-tree", _oid(tree))
        entries: dict[str, Entry] = {}
        for record in out.split(b"\0"):
            if record:
                meta, _, path = record.partition(b"\t")
                mode, _kind, oid = meta.split()
                entries[os.fsdecode(path)] = Entry(mode.decode(), oid.decode())
        return entries

    # Restoring

    def restore(self, tree: str, paths: Iterable[str], *, rollback: str) -> None:
        """Makes each path in the workspace what it is in `tree`: a file with its mode, a symlink,
        or nothing. All or nothing: on a failure every path restored is put back as it is in
        `rollback` (a snapshot taken just before) and RestoreError is raised.

        Each file is written beside its target and renamed over it. No parent that is a symlink
        is ever followed (such a path fails the restore), and no path outside the workspace is
        accepted. A path must hold what `rollback` holds, or already what `tree` holds (a restore
        interrupted by a crash is simply run again); any other content is refused before anything
        is touched, as the rollback could not put it back."""
        targets = sorted(set(paths))
        for path in targets:
            split(path)  # UnsafePath before anything is touched
        try:
            opened = Workspace(self.workspace)
        except UnsafePath as err:
            raise RestoreError(f"nothing was changed: {err}", rolled_back=True) from err
        with self._lock, self._objects as blobs, opened as workspace:
            want = self._entries_at(tree, targets)
            before = self._entries_at(rollback, targets)
            now = {p: workspace.entry(p) for p in targets}
            differs = [p for p in targets if now[p] not in (before.get(p), want.get(p))]
            if differs:
                raise RestoreError(
                    f"{len(differs)} path(s) hold neither the rollback snapshot's content nor the "
                    f"restored one; nothing was changed: {_listing(differs)}",
                    path=differs[0],
                    rolled_back=True,
                )
            # Paths an interrupted restore already wrote are rolled back with the rest.
            touched = [p for p in targets if now[p] == want.get(p) != before.get(p)]
            todo = [p for p in targets if now[p] == before.get(p) != want.get(p)]
            try:
                _apply(workspace, blobs, want, todo, touched)
            except Exception as err:
                path = touched[-1] if touched else ""
                failed = _roll_back(workspace, blobs, before, touched)
                if failed:
                    raise RestoreError(
                        f"restoring {path!r} failed ({err}); the rollback failed too for {_listing(failed)}",
                        path=path,
                        rolled_back=False,
                    ) from err
                raise RestoreError(
                    f"restoring {path!r} failed ({err}); the {len(touched)} path(s) touched were put back",
                    path=path,
                    rolled_back=True,
                ) from err
            finally:
                workspace.sync()

    # Keeping

    def keep_only(self, trees: Iterable[str]) -> None:
        """Deletes every object not reachable from `trees` (nor from the private index, which the
        next snapshot builds on). The kept trees hang under one ref, as entries of a tree."""
        oids = sorted({_oid(t) for t in trees})
        if not self.repo.is_dir():
            return
        with self._lock:
            self._keep_only(oids)

    def _keep_only(self, oids: list[str]) -> None:
        self._git.clear_stale_locks()
        self._sync_index(None)  # what the index holds is kept: let it hold the newest entries
        if oids:
            listing = b"".join(f"040000 tree {oid}\t{oid}\0".encode() for oid in oids)
            keep = self._git.run("mktree", "-z", stdin=listing).decode().strip()
            self._git.run("update-ref", KEEP_REF, keep)
        else:
            self._git.run("update-ref", "-d", KEEP_REF)
        self._git.run("repack", "-a", "-d", "-q")
        self._git.run("prune", "--expire=now")

    def disk_bytes(self) -> int:
        """Bytes the repository's files take (their sizes, not the blocks they occupy)."""
        return directory_bytes(self.repo)

    def delete(self) -> None:
        """Removes the repository and every snapshot in it."""
        if self.repo.is_symlink():
            raise SnapshotError(f"{self.repo} is a symbolic link; not deleting through it")
        if self.repo.exists():
            shutil.rmtree(self.repo)


class _Patch:
    """The start of one `diff --git` section of a patch stream, and its whole length."""

    __slots__ = ("binary", "in_header", "size", "text")

    def __init__(self) -> None:
        self.text = bytearray()
        self.size = 0
        self.binary = False
        self.in_header = True

    def add(self, line: bytes, max_bytes: int) -> None:
        if self.in_header:
            if line.startswith(b"@@"):
                self.in_header = False
            elif line.startswith(b"Binary files ") and line.rstrip(b"\n").endswith(b" differ"):
                self.binary = True
        room = max_bytes - len(self.text)
        if room > 0:
            self.text += line[:room]
        self.size += len(line)


def _file_diff(change: Change, parts: list[_Patch], max_bytes: int) -> FileDiff:
    text = b"".join(bytes(part.text) for part in parts)[:max_bytes]
    return FileDiff(
        path=change.path,
        change=change.kind,
        unified_diff=text.decode("utf-8", errors="replace"),
        binary=any(part.binary for part in parts),
        truncated=sum(part.size for part in parts) > max_bytes,
    )


def _batches(paths: list[str], max_bytes: int = 64 * 1024) -> Iterator[list[str]]:
    """Paths in groups small enough for one command line."""
    batch: list[str] = []
    size = 0
    for path in paths:
        if batch and size + len(path) > max_bytes:
            yield batch
            batch, size = [], 0
        batch.append(path)
        size += len(path) + 1
    if batch:
        yield batch


def _under(path: str, spec: set[str]) -> bool:
    """Whether a pathspec of `spec` matches `path`: the path itself or one of its directories."""
    while True:
        if path in spec:
            return True
        path, slash, _ = path.rpartition("/")
        if not slash:
            return False


def _apply(
    workspace: Workspace, blobs: Objects, entries: dict[str, Entry], paths: Sequence[str], touched: list[str]
) -> None:
    """Removals first, deepest first (a directory may be in the way of a file), then writes."""
    for path in sorted((p for p in paths if p not in entries), key=lambda p: (-p.count("/"), p)):
        touched.append(path)
        workspace.remove(path)
    for path in sorted(p for p in paths if p in entries):
        touched.append(path)
        entry = entries[path]
        if entry.mode not in _RESTORABLE:
            raise SnapshotError(f"{path!r} has mode {entry.mode}, which a restore cannot write")
        workspace.write(path, entry.mode, [blobs.read(entry.oid, b"blob")])


def _roll_back(
    workspace: Workspace, blobs: Objects, before: dict[str, Entry], touched: list[str]
) -> list[str]:
    """Puts every touched path back as `before` holds it, going on past failures; returns the
    paths it could not."""
    failed: list[str] = []
    for path in sorted(touched, key=lambda p: (p in before, -p.count("/") if p not in before else 0, p)):
        try:
            if path in before:
                workspace.write(path, before[path].mode, [blobs.read(before[path].oid, b"blob")])
            else:
                workspace.remove(path)
        except Exception:
            failed.append(path)
    return failed


def _refused_by_git(path: str, is_link: bool) -> str:
    """Why git's verify_path would skip this path (it only says so on stderr), or ''."""
    parts = path.split("/")
    if any(part.lower() == ".git" for part in parts):
        return "a .git component"
    if is_link and any(part.lower() == ".gitmodules" for part in parts):
        return "a symlink named .gitmodules"
    return ""


def _capturable(path: str) -> bool:
    try:
        split(path)
    except UnsafePath:
        return False
    return True


def _oid(value: str) -> str:
    """A full object id; anything else (an option, a ref name) is refused before reaching git."""
    if isinstance(value, str) and _OID.fullmatch(value):
        return value
    raise ValueError(f"not a tree id: {value!r}")


def _paths(out: bytes) -> list[str]:
    return [os.fsdecode(p) for p in out.split(b"\0") if p]


def _nul(paths: Sequence[str]) -> bytes:
    return b"".join(os.fsencode(p) + b"\0" for p in paths)


def _listing(paths: Sequence[str], shown: int = 5) -> str:
    return ", ".join(paths[:shown]) + (f" and {len(paths) - shown} more" if len(paths) > shown else "")


def _summary(problems: Sequence[str], shown: int = 3) -> str:
    more = f"; and {len(problems) - shown} more" if len(problems) > shown else ""
    return "; ".join(problems[:shown]) + more


def directory_bytes(path: Path) -> int:
    """Bytes the files under `path` take (their sizes, not the blocks they occupy); 0 if none."""
    total = 0
    for directory, _dirs, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(directory, name)).st_size
            except FileNotFoundError:
                continue
    return total
