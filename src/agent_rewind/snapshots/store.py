"""Workspace snapshots on git's object store: take, compare, restore, forget.

A session's workspace is snapshotted when each turn starts and ends; a files rewind later makes
some paths equal to an earlier snapshot again. A snapshot is a git tree in a bare repository under
the service's state dir (never inside the workspace), written through a private index that keeps
every file's stat data, so a snapshot re-hashes only the files that changed since the last one.
Git runs sealed (`snapshots.git`): nothing in the workspace can configure it or make it run
anything. The API is synchronous; callers run it in a thread, one call at a time per store.

`SnapshotStore` holds the index, the watch and the lock, and takes snapshots; what a take records
of the paths it is told changed is decided in `scan`, a take of just the paths the watch saw
change is `watched`, comparing two trees is `compare`, reading and making trees is `trees`,
writing a restore (and rolling it back) is `restore`, collecting what is no longer kept is
`keeping`.

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
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import structlog

from agent_rewind.snapshots import compare, gitindex, keeping, merge, trees
from agent_rewind.snapshots.bulk import hash_files
from agent_rewind.snapshots.compare import DEFAULT_DIFF_BYTES, Change, ChangeKind, FileDiff, tree_id
from agent_rewind.snapshots.errors import GitFailed, GitTimeout, RestoreError, SnapshotError, UnsafePath
from agent_rewind.snapshots.files import Workspace, split
from agent_rewind.snapshots.git import Git
from agent_rewind.snapshots.gitindex import IndexEntry, Stat
from agent_rewind.snapshots.keeping import KEEP_REF, directory_bytes
from agent_rewind.snapshots.objects import Objects
from agent_rewind.snapshots.packs import PackWriter, write_trees
from agent_rewind.snapshots.restore import restore_paths
from agent_rewind.snapshots.scan import (
    Plan,
    gc_paused,
    ignored,
    index_plan,
    listed_paths,
    nested_files,
    nul_joined,
    scan_workspace,
)
from agent_rewind.snapshots.seed import Known, NotSeedable, copy, known, pin, read_index, trusted_files
from agent_rewind.snapshots.watch import Unwatchable, Watch
from agent_rewind.snapshots.watched import sync_index, take_known

# Defined with the comparisons and the keeping, and importable from here as before.
__all__ = [
    "DEFAULT_DIFF_BYTES",
    "KEEP_REF",
    "Change",
    "ChangeKind",
    "FileDiff",
    "Limits",
    "Snapshot",
    "SnapshotStore",
    "directory_bytes",
]

# The store's directory a first take pins the workspace's object files in (`seed.pin`), until
# their blobs are copied; one a killed take left is removed by the next first take.
_PINNED = "seed-objects"

T = TypeVar("T")

log = structlog.get_logger(__name__)


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
    # (git scanned the whole workspace), "seeded" (a first snapshot that took files from the
    # workspace's own git: `seed`); "" when it failed before knowing.
    how: str = ""


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
        # Paths a take recorded without git (`watched.take_known`) since the index was last
        # brought up to date: the index still holds what they were until `_sync_index`.
        self._unsynced: set[str] = set()
        self._written: str | None = None  # the tree `take_known` wrote last
        self._how = ""  # how the current take goes (Snapshot.how)
        self._watch: Watch | None = Watch(workspace) if watch else None
        # A first take reads the workspace's own git index while git lists the workspace.
        self._workspace_index: Future[tuple[dict[str, IndexEntry], int]] | None = None
        # The tree the index held after the last complete snapshot, while the watch has seen
        # every change since; None when the next snapshot must scan the whole workspace.
        self._tree: str | None = None
        # The current take's `on_read` until it is called; whether it was; whether the watch
        # had seen nothing change when the last take had read the workspace.
        self._on_read: Callable[[], None] | None = None
        self._released = False
        self._read_quiet = False

    def close(self) -> None:
        """Stops watching the workspace (the next snapshot scans it; the store stays usable)."""
        with self._lock:
            self._tree = None
            if self._watch is not None:
                self._watch.close()

    # Taking

    @property
    def first(self) -> bool:
        """Whether the next take is a first one: nothing is known of any file, it reads them all
        (or takes them from the workspace's own git)."""
        return not self._git.index.exists()

    def take(self, timeout_s: float | None = None, on_read: Callable[[], None] | None = None) -> Snapshot:
        """Records the workspace as it is now. Never raises for the workspace's content: a
        failure, a bound or the timeout (`timeout_s`, else the limits') gives an incomplete
        snapshot saying why.

        `on_read` is called (once, in this thread, under the store's lock) when the take has read
        the workspace: what it records no longer depends on the workspace's files, which may
        change from then on (the caller's turn may start). A first take then goes on copying
        the blobs the workspace's own git vouched for (`seed`) and writing its trees and index:
        a file whose blob turns out lost meanwhile is hashed from disk only if the watch saw it
        unchanged and its stat data are still those vouched for; else the snapshot is
        incomplete. Any other take calls it as it ends."""
        started = time.monotonic()
        bound = self.limits.timeout_s if timeout_s is None else timeout_s
        tree: str | None = None
        with self._lock:
            self._how = ""
            self._tree, last = None, self._tree  # until this snapshot is known to be complete
            self._on_read, self._released, self._read_quiet = on_read, False, False
            try:
                tree, problems = self._take(started + bound, last)
            except GitTimeout:
                problems = [f"timeout: the snapshot took over {bound:g} s"]
            except (SnapshotError, OSError) as err:
                problems = [f"error: {err}"]
            finally:
                self._read()
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

    def quiet(self) -> bool:
        """Whether the watch vouches that nothing in the workspace changed while the last take
        read it: that take was complete and the watch had seen nothing from its start until it
        had read the workspace (`take`'s `on_read`). A snapshot that went on while the agent ran
        is the workspace as it was at its start only then. False without a watch."""
        with self._lock:
            return self._tree is not None and self._read_quiet

    def _read(self) -> None:
        """The current take has read the workspace: notes whether the watch saw it unchanged
        meanwhile, and tells the caller (`on_read`), once."""
        done, self._on_read = self._on_read, None
        if done is None:
            return
        self._read_quiet = self._watch is not None and self._watch.quiet()
        self._released = True
        try:
            done()
        except Exception as err:  # the caller's (a closed event loop): the take goes on
            log.warning("a snapshot's on_read failed", error=str(err))

    def _take(self, deadline: float, last: str | None) -> tuple[str | None, list[str]]:
        self._git.init()
        self._git.clear_stale_locks()  # a take killed at its deadline may have left one
        fresh = not self._git.index.exists()  # the first take: nothing is known of any file
        self._workspace_index = _background(read_index, self.workspace) if fresh else None
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
                bounds = self.limits
                known = take_known(
                    self._objects,
                    self._reader,
                    self.workspace,
                    last,
                    paths,
                    deadline,
                    max_file_bytes=bounds.max_file_bytes,
                    max_total_bytes=bounds.max_total_bytes,
                )
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
            changed, others = scan_workspace(self._git, deadline, paths)
        except GitFailed:
            if not self.workspace.is_dir():
                raise
            # The index cannot be read (a disk fault, a crash mid-write): it is only a cache of
            # stat data, so start over from none, hashing every file once more.
            self._git.drop_index()
            self._unsynced.clear()
            self._how = "scan"
            fresh = True
            changed, others = scan_workspace(self._git, deadline)
        return self._record(changed, others, deadline, fresh)

    def _sync_index(self, deadline: float | None) -> None:
        """Gives the index the entries `take_known` recorded without it (`watched.sync_index`)."""
        if not self._unsynced:
            return
        assert self._written is not None
        sync_index(self._git, self._objects, self._written, self._unsynced, deadline)
        self._unsynced.clear()

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
        excluded = ignored(self._reader, [p for p in listed_paths(listed) if p.endswith("/")], deadline)
        try:
            self._watch.start(excluded)
        except Unwatchable as err:
            log.warning(
                "workspace cannot be watched; its snapshots scan it",
                workspace=str(self.workspace),
                error=str(err),
            )
            self._watch = None
        return None

    def _record(
        self, changed: bytes, others: bytes, deadline: float, fresh: bool = False
    ) -> tuple[str | None, list[str]]:
        """Adds what the scan found to the index, and writes its tree. `fresh`: the index held
        nothing: every file is new (`_record_first`)."""
        untracked: list[str] = []
        nested: list[str] = []
        with gc_paused() if fresh else contextlib.nullcontext():  # an object or two per file
            for path in listed_paths(others):
                (nested if path.endswith("/") else untracked).append(path)
            if nested:
                untracked += nested_files(self._git, self.workspace, nested, deadline)
            plan = index_plan(self.workspace, listed_paths(changed), untracked, self.limits.max_file_bytes)
        if fresh and not plan.drop:
            return self._record_first(plan, deadline)
        if plan.added_bytes > self.limits.max_total_bytes:
            return None, [
                f"total over {self.limits.max_total_bytes} bytes: {plan.added_bytes} bytes changed",
                *plan.problems,
            ]
        if plan.drop:
            self._git.run(
                "update-index",
                "--force-remove",
                "-z",
                "--stdin",
                stdin=nul_joined(plan.drop),
                deadline=deadline,
            )
        if plan.update:
            said = self._git.run_with_stderr(
                "update-index", "--add", "--remove", "--replace", "-z", "--stdin",
                stdin=nul_joined(plan.update), deadline=deadline,
            )  # fmt: skip
            if said.strip():  # "Ignoring path ...": git refused a name the plan let through
                plan.problems.append(f"git: {said.strip()[:300]}")
        tree = self._git.run("write-tree", deadline=deadline).decode().strip()
        with contextlib.suppress(SnapshotError, OSError):  # tidying only: the tree is written
            self._git.drop_unused_shared_indexes()
        return tree, plan.problems

    def _record_first(self, plan: Plan, deadline: float) -> tuple[str | None, list[str]]:
        """The first snapshot: the index is written here, whole. Files the workspace's own git
        knows unchanged are taken from it (`seed`); the others are hashed into one pack
        (`bulk`), rather than one loose object each. The index gets every file's stat data, so
        the next scan hashes only what changed since.

        Only what depends on the files comes before `on_read` (`take`): their lstat (the scan),
        which the workspace's index vouches for, the hashing of the others, and the workspace's
        object files hard-linked into the store (`pin`: the agent, which may run from then on,
        cannot swap what the copy reads). The copy of the vouched-for blobs from those, the
        trees, the pack and the index come after, while the files may change. Objects that
        cannot be pinned are copied before `on_read`."""
        parsed, self._workspace_index = self._workspace_index, None
        shutil.rmtree(self._git.repo / _PINNED, ignore_errors=True)  # a killed take's
        with gc_paused():
            vouched = trusted_files(self.workspace, plan.stats, parsed)
        pinned: Path | None = None
        if vouched:
            try:
                pinned = pin(self.workspace, self._git.repo / _PINNED)
            except NotSeedable as err:
                log.info("first snapshot not seeded from git", workspace=str(self.workspace), why=str(err))
                vouched = {}
        rest = [path for path in plan.update if path not in vouched]
        hashing = sum(plan.stats[path].st_size for path in rest)
        if hashing > self.limits.max_total_bytes:
            if pinned is not None:
                shutil.rmtree(pinned, ignore_errors=True)
            return None, [
                f"total over {self.limits.max_total_bytes} bytes: {hashing} bytes changed",
                *plan.problems,
            ]
        copied: set[str] = set()
        with PackWriter(self._git) as pack:
            with gc_paused():
                found, problems = hash_files(pack, self.workspace, rest, self.limits.max_file_bytes, deadline)
            if vouched and pinned is None:  # from the workspace's own git, then, while no agent runs
                copied = copy(self._git, self.workspace / ".git" / "objects", vouched, plan.stats, deadline)
            self._read()
            if vouched:
                if pinned is not None:
                    try:
                        copied = copy(self._git, pinned, vouched, plan.stats, deadline)
                    finally:
                        shutil.rmtree(pinned, ignore_errors=True)
                if copied:
                    self._how = "seeded"
                lost = {path: known(entry) for path, entry in vouched.items() if path not in copied}
                if lost:
                    rehashed, more = self._rehash(pack, lost, deadline)
                    found.update(rehashed)
                    problems += more
                with gc_paused():
                    found.update((path, known(vouched[path])) for path in copied)
            with gc_paused():
                tree = write_trees(pack, {path: (k.mode, k.oid) for path, k in found.items()})
            pack.finish(deadline)
        with gc_paused():
            index = gitindex.write((os.fsencode(path), k.oid, k.stat) for path, k in found.items())
        scratch = self._git.index.with_name(f".{self._git.index.name}.{secrets.token_hex(4)}.tmp")
        scratch.write_bytes(index)
        scratch.replace(self._git.index)
        return tree, [*plan.problems, *problems]

    def _rehash(
        self, pack: PackWriter, lost: dict[str, Known], deadline: float
    ) -> tuple[dict[str, Known], list[str]]:
        """The vouched-for files whose blob did not arrive from the workspace's git (missing,
        damaged, or the git unusable now), hashed from disk. Once the caller went on
        (`on_read`), a file may be kept only if the watch saw no change to it and the stat data
        it was read with are those vouched for: any other makes the snapshot incomplete."""
        hashed, problems = hash_files(pack, self.workspace, list(lost), self.limits.max_file_bytes, deadline)
        if not self._released:
            return hashed, problems
        watch = self._watch
        for path, vouched in lost.items():
            found = hashed.get(path)
            if (
                found is None
                or not _same_stat(found.stat, vouched.stat)
                or watch is None
                or not watch.unchanged(path)
            ):
                hashed.pop(path, None)
                problems.append(
                    f"changed meanwhile: {path} (its blob was not in the workspace's git, and it "
                    "may have changed since it was read)"
                )
        return hashed, problems

    # Reading

    def changes(self, a: str, b: str) -> list[Change]:
        """The paths whose content, mode or type differs from tree `a` to tree `b`."""
        return compare.changes(self._reader, a, b)

    def capture(self, paths: Iterable[str]) -> str:
        """A tree holding just `paths` as they are in the workspace now (a path that is missing,
        a directory, or behind a symlink is absent from it). Cheap, unlike `take`: a rewind uses
        it to keep what it is about to change, so it can be undone. No git process runs: the
        blobs and trees are hashed here and written as loose objects, as git writes them. Ignore
        rules do not apply (every path named is kept); a file over `max_file_bytes` raises."""
        with self._lock:
            self._git.init()
            return trees.capture(self._objects, self.workspace, paths, self.limits.max_file_bytes)

    def overlay(self, base: str, source: str, paths: Iterable[str]) -> str:
        """The tree `base` with each of `paths` as it is in `source` (a path absent there is
        absent here): what the workspace holds after `restore(source, paths)` when it held `base`.
        Computed from the trees alone, without scanning the workspace."""
        wanted = sorted(set(paths))
        if not wanted:
            return tree_id(base)
        with self._lock, self._objects:
            return trees.overlay(self._objects, base, source, wanted)

    def changes_many(self, pairs: Sequence[tuple[str, str]]) -> list[list[Change]]:
        """`changes(a, b)` for every pair, in one git process (a rewind compares every interval
        of the history it covers: hundreds of pairs for a point hundreds of turns back)."""
        return compare.changes_many(self._reader, pairs)

    def files(self, tree: str) -> list[str]:
        """Every path tree `tree` holds (to restore all of it, e.g. into a forked workspace)."""
        return sorted(trees.entries(self._reader, tree))

    def diff(
        self, a: str, b: str, paths: Iterable[str] | None = None, max_bytes: int = DEFAULT_DIFF_BYTES
    ) -> list[FileDiff]:
        """Git's patch per changed path from tree `a` to tree `b` (only `paths` when given), each
        cut at `max_bytes`; binary content is flagged, not shown (`compare.diff`)."""
        return compare.diff(self._reader, a, b, paths, max_bytes)

    def numstat(self, a: str, b: str, paths: Iterable[str] | None = None) -> tuple[int, int]:
        """Lines inserted and deleted from tree `a` to tree `b` in `paths` (all when None);
        binary files count none."""
        return compare.numstat(self._reader, a, b, paths)

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
            want = trees.entries_at(blobs, tree, targets)
            before = trees.entries_at(blobs, rollback, targets)
            restore_paths(workspace, blobs, targets, want=want, before=before)

    # Reverting

    def revert(
        self, before: str, after: str, now: str, paths: Iterable[str], *, overwrite: bool
    ) -> merge.Reverted:
        """The tree `now` with the change of `paths` from `before` to `after` taken back, each
        path by a three-way merge (`snapshots.merge`); the paths changed since in a way the merge
        cannot take back are conflicts, left as they are now or (`overwrite`) put back as they
        were in `before`. Only objects are written: the workspace is untouched."""
        wanted = sorted(set(paths))
        with self._lock, self._objects as objects, contextlib.ExitStack() as stack:
            scratch: list[Path] = []

            def merge_text(ours: bytes, base: bytes, theirs: bytes) -> bytes | None:
                if not scratch:  # a directory of the store's own, never the workspace
                    scratch.append(Path(stack.enter_context(tempfile.TemporaryDirectory(dir=self.repo))))
                ours_file, base_file, theirs_file = (scratch[0] / name for name in ("ours", "base", "theirs"))
                for file, text in ((ours_file, ours), (base_file, base), (theirs_file, theirs)):
                    file.write_bytes(text)
                deadline = time.monotonic() + self.limits.timeout_s
                return self._reader.merge_file(ours_file, base_file, theirs_file, deadline)

            return merge.revert(objects, merge_text, before, after, now, wanted, overwrite=overwrite)

    # Keeping

    def keep_only(self, trees: Iterable[str]) -> None:
        """Deletes every object not reachable from `trees` (nor from the private index, which the
        next snapshot builds on). The kept trees hang under one ref, as entries of a tree."""
        oids = sorted({tree_id(t) for t in trees})
        if not self.repo.is_dir():
            return
        with self._lock:
            self._keep_only(oids)

    def _keep_only(self, oids: list[str]) -> None:
        self._git.clear_stale_locks()
        self._sync_index(None)  # what the index holds is kept: let it hold the newest entries
        keeping.keep_only(self._git, oids)

    def disk_bytes(self) -> int:
        """Bytes the repository's files take (their sizes, not the blocks they occupy)."""
        return directory_bytes(self.repo)

    def delete(self) -> None:
        """Removes the repository and every snapshot in it."""
        keeping.delete(self.repo)


def _background(work: Callable[[Path], T], arg: Path) -> Future[T]:
    """`work(arg)` in a thread of its own (it mostly waits on the disk or parses while a git
    process runs); the future holds its result or its exception."""
    future: Future[T] = Future()

    def run() -> None:
        try:
            future.set_result(work(arg))
        except BaseException as err:  # handed to whoever asks for the result
            future.set_exception(err)

    threading.Thread(target=run, name="snapshot-read-index", daemon=True).start()
    return future


def _same_stat(a: Stat, b: Stat) -> bool:
    """The stat data git compares (all but the device) are equal."""
    return a._replace(dev=0) == b._replace(dev=0)


def _summary(problems: Sequence[str], shown: int = 3) -> str:
    more = f"; and {len(problems) - shown} more" if len(problems) > shown else ""
    return "; ".join(problems[:shown]) + more
