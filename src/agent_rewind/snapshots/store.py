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
import hashlib
import os
import re
import secrets
import shutil
import stat
import subprocess
import time
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

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

ChangeKind = Literal["added", "modified", "deleted"]

KEEP_REF = "refs/agent-rewind/keep"
DEFAULT_DIFF_BYTES = 64 * 1024

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

    def __init__(self, repo: Path, workspace: Path, limits: Limits | None = None) -> None:
        repo, workspace = Path(repo).absolute(), Path(workspace).absolute()
        real_repo, real_workspace = repo.resolve(), workspace.resolve()
        if real_repo.is_relative_to(real_workspace) or real_workspace.is_relative_to(real_repo):
            raise ValueError(f"the snapshot repository {repo} and the workspace {workspace} overlap")
        self.repo = repo
        self.workspace = workspace
        self.limits = limits or Limits()
        self._git = Git(repo, workspace)

    # Taking

    def take(self) -> Snapshot:
        """Records the workspace as it is now. Never raises for the workspace's content: a
        failure, a bound or the timeout gives an incomplete snapshot saying why."""
        started = time.monotonic()
        tree: str | None = None
        try:
            tree, problems = self._take(started + self.limits.timeout_s)
        except GitTimeout:
            problems = [f"timeout: the snapshot took over {self.limits.timeout_s:g} s"]
        except (SnapshotError, OSError) as err:
            problems = [f"error: {err}"]
        return Snapshot(
            tree=tree,
            complete=tree is not None and not problems,
            reason=_summary(problems),
            seconds=time.monotonic() - started,
        )

    def _take(self, deadline: float) -> tuple[str | None, list[str]]:
        self._git.init()
        self._git.clear_stale_locks()  # a take killed at its deadline may have left one
        try:
            changed, others = self._scan(deadline)
        except GitFailed:
            if not self.workspace.is_dir():
                raise
            # The index cannot be read (a disk fault, a crash mid-write): it is only a cache of
            # stat data, so start over from none, hashing every file once more.
            self._git.drop_index()
            changed, others = self._scan(deadline)
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

    def _scan(self, deadline: float) -> tuple[bytes, bytes]:
        """The tracked paths whose stat data changed, and the untracked ones (not ignored)."""
        changed, others = self._git.run_parallel(
            [("diff-files", "--name-only", "-z"), ("ls-files", "-z", "--others", "--exclude-standard")],
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
            problem = ""
            if not (stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode)):
                pass  # a FIFO, socket or device: git records none
            elif refused := _refused_by_git(path, stat.S_ISLNK(info.st_mode)):
                problem = f"unsupported path ({refused}): {path}"
            elif info.st_size > self.limits.max_file_bytes:
                problem = f"file over {self.limits.max_file_bytes} bytes: {path}"
            else:
                plan.update.append(path)
                plan.added_bytes += info.st_size
                continue
            if problem:
                plan.problems.append(problem)
            if path in tracked:  # the snapshot must not claim the old content
                plan.drop.append(path)
        return plan

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
        out = self._git.run("diff-tree", "-r", "-z", "--no-renames", _oid(a), _oid(b))
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
                    node[name] = (mode, self._write_object(b"blob", data))
        return self._write_tree(tree)

    def _write_tree(self, node: dict[str, Any]) -> str:
        entries = []
        for name, value in node.items():
            if isinstance(value, dict):
                entries.append((name + "/", b"40000 " + name.encode(), self._write_tree(value)))
            else:
                mode, oid = value
                entries.append((name, f"{mode} ".encode() + name.encode(), oid))
        entries.sort(key=lambda e: e[0].encode())  # git's order: a directory as its name + "/"
        body = b"".join(head + b"\0" + bytes.fromhex(oid) for _, head, oid in entries)
        return self._write_object(b"tree", body)

    def _write_object(self, kind: bytes, body: bytes) -> str:
        """Writes a loose object (zlib of `kind size\0body`) unless it exists; its id."""
        raw = kind + b" %d\0" % len(body) + body
        oid = hashlib.sha1(raw, usedforsecurity=False).hexdigest()
        target = self.repo / "objects" / oid[:2] / oid[2:]
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            scratch = target.with_name(f".{oid[2:]}.{secrets.token_hex(4)}.tmp")
            scratch.write_bytes(zlib.compress(raw, 1))
            scratch.chmod(0o444)
            scratch.replace(target)
        return oid

    def overlay(self, base: str, source: str, paths: Iterable[str]) -> str:
        """The tree `base` with each of `paths` as it is in `source` (a path absent there is
        absent here): what the workspace holds after `restore(source, paths)` when it held `base`.
        Computed from the trees alone, without scanning the workspace."""
        wanted = sorted(set(paths))
        if not wanted:
            return _oid(base)
        entries = self._entries(source)
        lines = []
        for path in wanted:
            entry = entries.get(path)
            if entry is None:
                lines.append(f"0 {'0' * 40}\t{path}\0")
            else:
                lines.append(f"{entry.mode} {entry.oid}\t{path}\0")
        scratch = self.repo / f"overlay-{secrets.token_hex(6)}.index"
        git = self._git.with_index(scratch)
        unsplit = ("-c", "core.splitIndex=false", "-c", "splitIndex.sharedIndexExpire=never")
        try:
            git.run(*unsplit, "read-tree", _oid(base))
            git.run(*unsplit, "update-index", "-z", "--index-info", stdin="".join(lines).encode())
            return git.run(*unsplit, "write-tree").decode().strip()
        finally:
            scratch.unlink(missing_ok=True)
            scratch.with_name(scratch.name + ".lock").unlink(missing_ok=True)

    def changes_many(self, pairs: Sequence[tuple[str, str]]) -> list[list[Change]]:
        """`changes(a, b)` for every pair, in one git process (a rewind compares every interval
        of the history it covers: hundreds of pairs for a point hundreds of turns back)."""
        wanted = [(_oid(a), _oid(b)) for a, b in pairs]
        distinct = sorted({pair for pair in wanted if pair[0] != pair[1]})
        found: dict[tuple[str, str], list[Change]] = {pair: [] for pair in distinct}
        if distinct:
            stdin = "".join(f"{a} {b}\n" for a, b in distinct).encode()
            out = self._git.run("diff-tree", "--stdin", "-r", "-z", "--no-renames", stdin=stdin)
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
        out = self._git.run("diff-tree", "-r", "-z", "--no-renames", a, b)
        fields = out.split(b"\0")
        typed: list[tuple[Change, bool]] = []
        for meta, path in zip(fields[0::2], fields[1::2], strict=False):
            if meta.startswith(b":"):
                old, new, *_, status = meta[1:].split()
                change = Change(os.fsdecode(path), _KINDS.get(status[:1], "modified"))
                typed.append((change, status[:1] == b"T" and int(old, 8) >> 12 != int(new, 8) >> 12))
        return typed

    def _patches(self, a: str, b: str, pathspec: list[str], max_bytes: int, expected: int) -> list[_Patch]:
        proc = self._git.popen(
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
        out = self._git.run("diff-tree", "-r", "-z", "--numstat", "--no-renames", _oid(a), _oid(b))
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

    def _entries(self, tree: str) -> dict[str, Entry]:
        out = self._git.run("ls-tree", "-r", "-z", "--full-tree", _oid(tree))
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
        want = self._entries(tree)
        before = self._entries(rollback)
        with Workspace(self.workspace) as workspace, _Blobs(self._git) as blobs:
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
        self._git.clear_stale_locks()
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
        total = 0
        for directory, _dirs, names in os.walk(self.repo):
            for name in names:
                try:
                    total += os.lstat(os.path.join(directory, name)).st_size
                except FileNotFoundError:
                    continue
        return total

    def delete(self) -> None:
        """Removes the repository and every snapshot in it."""
        if self.repo.is_symlink():
            raise SnapshotError(f"{self.repo} is a symbolic link; not deleting through it")
        if self.repo.exists():
            shutil.rmtree(self.repo)


class _Blobs:
    """Reads blobs through one `git cat-file --batch`, started on first use (no filters apply)."""

    def __init__(self, git: Git) -> None:
        self._git = git
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> _Blobs:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.communicate()
            self._proc = None

    def read(self, oid: str) -> bytes:
        if self._proc is None:
            self._proc = self._git.popen("cat-file", "--batch")
        stdin, stdout = self._proc.stdin, self._proc.stdout
        assert stdin is not None and stdout is not None  # both are pipes
        stdin.write(oid.encode() + b"\n")
        stdin.flush()
        header = stdout.readline().split()
        if len(header) != 3 or header[1] != b"blob":
            raise SnapshotError(f"object {oid} is not a blob in the snapshot repository")
        size = int(header[2])
        data = stdout.read(size)
        stdout.read(1)  # the newline after the content
        if len(data) != size:
            raise SnapshotError(f"blob {oid} was cut short")
        return data


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
    workspace: Workspace, blobs: _Blobs, entries: dict[str, Entry], paths: Sequence[str], touched: list[str]
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
        workspace.write(path, entry.mode, [blobs.read(entry.oid)])


def _roll_back(
    workspace: Workspace, blobs: _Blobs, before: dict[str, Entry], touched: list[str]
) -> list[str]:
    """Puts every touched path back as `before` holds it, going on past failures; returns the
    paths it could not."""
    failed: list[str] = []
    for path in sorted(touched, key=lambda p: (p in before, -p.count("/") if p not in before else 0, p)):
        try:
            if path in before:
                workspace.write(path, before[path].mode, [blobs.read(before[path].oid)])
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
