"""Benchmark 6: workspace snapshots, on generated workspaces of 1,000 and 20,000 files.

Each workspace is generated here: `.gitignore`, `README.md`, `package.json` and source files of
a few hundred bytes of code-like text, 20 to a directory, under `src/pkgNNN/modNNN/`, to the
size wanted (every one of them is what a snapshot holds); plus a `node_modules/` tree of
IGNORED files that the `.gitignore` names, so a snapshot must skip it. The same seed gives the
same content. Six rows, each measured side by side in one run:

1. `SnapshotStore.take()` after 3 files changed (rewritten, untimed), on the 1,000-file and the
   20,000-file workspace, interleaved round by round, by a store watching its workspace (as the
   server runs it, `--snapshot-watch`) and, side by side on the same changes, by one scanning it
   (`--no-snapshot-watch`, and what a take costs when the watch cannot say what changed); the
   first take of each size (it hashes every file) is timed once, untimed in the rounds.
   Checked: every take is complete, both stores record the same tree, and it holds the 3
   changes; the first one holds exactly the generated files.
2. A turn that writes 3 files (3 `write` lines, each file WRITE_BYTES bytes, new content every
   turn) through the real server, on a session with workspace snapshots on against one with
   them off, each with a 20,000-file workspace of its own, interleaved. The difference of the
   medians is what the turn's two snapshots (start and end, each recorded in the ledger) add.
3. The disk those turns added to the snapshot-on session's repository (`snapshot_bytes`, the
   repository's file sizes), per turn, against the bytes a turn wrote; split, from git's own
   listing, into blobs, trees and the rest (the private index), and what the same objects would
   take packed (`git pack-objects`, deltas among them).
4. A files `Rewind` to a turn that wrote 3 new files, served from a snapshot (a session with
   snapshots on) against one served from the CLI's checkpoints (snapshots off), on workspaces of
   the same 1,000-file content, interleaved; after each rewind the turn is run again (untimed),
   giving the next round its point. Every result must come from the source its row names.

5. The first snapshot of a 100,000-file workspace (FIRST files, each a new store's first
   `take()`, watching its workspace as the server runs it): a git checkout of it (committed and
   packed, as a clone is: the snapshot is seeded from its index and objects, `snapshots.seed`)
   against the same files without git (every file hashed, in parallel, into one pack),
   interleaved, side by side with row 1's first takes at 20,000 files. Two times per take:
   - "first git" / "first plain": until the take has read the workspace (`take`'s `on_read`),
     which is what the session's first turn waits for (`snapshots.taking`): the lstat of
     every file, the trust decision against the checkout's index, the hashing of the files it
     does not vouch for. The targets judge these.
   - "... complete": until `take()` returns, complete: the checkout's blobs copied and checked,
     the trees, the pack and the store's index written. Only then is the snapshot recorded, and
     the first point's `snapshot_available` true; the turn runs meanwhile.
   Checked: both are complete and record the same tree, holding exactly the generated files,
   and the checkout's was seeded. The two workspaces are generated once and kept under CACHE
   (only read here), as building the checkout takes a minute; every file of both is read once,
   untimed, before the rounds. Each take may run FIRST_TIMEOUT_S (not the default 30 s), so a
   slow one is measured rather than cut short.
6. A revert of one turn (`Rewind`, FILES, `REWIND_SCOPE_TURN`) against a files `Rewind` to the
   same point (`REWIND_SCOPE_SINCE`), on the same session and turn, at 1,000 and at 20,000 files
   (a session with snapshots on per size, a workspace of its own, interleaved by size). Each
   round runs two turns, untimed: the first rewrites the first line of 3 files far apart (LINES
   lines each, written by the session's first turn), the later one the last line of the first of
   them and of a fourth file. Then the revert of the first turn and the rewind to it, which goes
   first alternating; the first is undone (`UndoRewind`, untimed) before the second. Checked:
   both are served from snapshots, without conflicts, and change the files they should: the
   revert the first turn's 3, leaving its file that the later turn also changed with the later
   line kept (a `git merge-file`) and the fourth as the later turn left it; the rewind all 4, as
   they were before the first turn; the undo puts back the files as the later turn left them.

Set-up is untimed: the first turn with snapshots on (which hashes its whole workspace in the
server's snapshot threads) runs while the other workspaces are generated; row 1 runs with the
server up but idle. For what limits each row, the git processes one call starts (a take, a turn
with snapshots on, each kind of rewind, a revert and the rewind to its point at 20,000 files) are
counted once each, untimed, after the rounds.
"""

from __future__ import annotations

import asyncio
import functools
import math
import os
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from unittest import mock

from agent_rewind.api.v1 import rewind_pb2, rewind_service_pb2, session_service_pb2
from agent_rewind.snapshots import Limits, SnapshotStore
from agent_rewind.snapshots.git import Git
from benchmarks.common import (
    Measure,
    Report,
    Sample,
    Samples,
    Target,
    fmt_bytes,
    fmt_ratio,
    fmt_time,
    interleave,
    ratio_target,
    settle,
    timed,
)
from benchmarks.service import FILES, Client, bench_config, serve

T = TypeVar("T")

SMALL, LARGE = 1_000, 20_000  # files a snapshot holds
IGNORED = 3_000  # files under node_modules/, which the .gitignore names
PER_DIR = 20  # source files per directory
CHANGED = 3  # files changed before each take, written by each turn
WRITE_BYTES = 1024  # each file a turn writes (rows 2 and 3)
LINES = 16  # row 6: lines of each file its turns edit (the first and the last)

FIRST = 100_000  # row 5: files of the workspaces whose first snapshot is timed
FIRST_ROUNDS = 3  # row 5: first takes of each (a new store each)
FIRST_TIMEOUT_S = 300.0  # row 5's takes: measured past --snapshot-timeout, the target judges them
CACHE = Path(tempfile.gettempdir()) / "agent-rewind-bench-cache"  # row 5's workspaces, built once

# The targets.
MAX_TAKE_S = 0.050  # 1. a take at LARGE files, 3 changed
MAX_TAKE_GROWTH = 2.0  # 1. take at LARGE / take at SMALL
MAX_TURN_COST_S = 2 * MAX_TAKE_S  # 2. what a turn's two snapshots add
MAX_DISK_RATIO = 4.0  # 3. disk added per turn / bytes the turn wrote
MAX_REWIND_RATIO = 2.0  # 4. files Rewind from a snapshot / from a CLI checkpoint
MAX_REVERT_RATIO = 2.0  # 6. revert of one turn / files Rewind to the same point, at each size
MAX_FIRST_GIT_S = 1.0  # 5. first take of a FIRST-file git checkout, until the turn may start
MAX_FIRST_PLAIN_S = 10.0  # 5. first take of FIRST files without git, until the turn may start

TIMEOUT_S = 600.0  # with row 5, whose workspaces take a minute to build the first time
SNAPSHOT = rewind_pb2.FILES_SOURCE_SNAPSHOT
CHECKPOINT = rewind_pb2.FILES_SOURCE_CHECKPOINT
REWIND_SCOPE_TURN = rewind_pb2.REWIND_SCOPE_TURN
REWIND_SCOPE_SINCE = rewind_pb2.REWIND_SCOPE_SINCE
TOP = {
    ".gitignore": "node_modules/\n*.log\n",
    "README.md": "# generated workspace\n\nA benchmark's workspace: source files under src/.\n",
    "package.json": '{"name": "bench", "version": "1.0.0", "private": true}\n',
}


@dataclass(frozen=True)
class Plan:
    take_rounds: int
    takes: int  # per size per round
    turn_rounds: int
    turns: int  # per side per round
    rewind_rounds: int  # rows 4 and 6
    budget_s: float  # each phase stops after this once 3 rounds are done
    quick: bool = False

    @classmethod
    def of(cls, quick: bool) -> Plan:
        if quick:
            return cls(4, 2, 3, 2, 3, 8.0, quick=True)
        return cls(15, 3, 10, 3, 15, 45.0)


# --- generated workspaces -------------------------------------------------------------------------

_VOCABULARY = (
    "def", "return", "import", "from", "class", "self", "value", "result", "index", "items",
    "config", "=", "(", ")", ":", "if", "else", "for", "in", "not", "None", "True", "False",
    "raise", "with", "as", "async", "await", "path", "name", "data", "error", "count", "size",
    "node", "tree", "+", "-", "0", "1", "2", "42", "len", "str", "int", "list", "dict", "key",
    "line", "text", "file", "#", "TODO", "the", "a", "of", "to", "request", "session", "cache",
)  # fmt: skip


@functools.cache
def _corpus() -> str:
    """About 1 MB of code-like text, 10 words a line, from a fixed seed."""
    words = random.Random(0).choices(_VOCABULARY, k=250_000)
    return "\n".join(" ".join(words[i : i + 10]) for i in range(0, len(words), 10))


def _text(rng: random.Random, size: int) -> str:
    corpus = _corpus()
    start = rng.randrange(len(corpus) - size)
    return corpus[start : start + size]


@dataclass
class Workspace:
    root: Path
    files: list[str]  # what a snapshot holds: relative paths, the top files then src/ in order

    def spread(self, count: int, n: int = CHANGED) -> list[str]:
        """`n` source files far apart (different directories), a different set for each count."""
        sources = self.files[len(TOP) :]
        third = len(sources) // n
        return [sources[k * third + count % third] for k in range(n)]

    def new_paths(self, n: int = CHANGED) -> list[str]:
        """`n` paths no generated file has, in directories far apart."""
        return [f"{Path(p).parent.as_posix()}/written{k}.py" for k, p in enumerate(self.spread(0, n))]


def generate(root: Path, files: int, seed: int) -> Workspace:
    """A workspace of `files` files a snapshot holds (a few hundred bytes each) and IGNORED that it
    must skip; the same seed, the same content."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    root = root.resolve()  # as the server resolves a session's cwd
    top = str(root)

    def write(path: str, text: str) -> None:  # plain os calls: 20,000 files in a few seconds
        fd = os.open(os.path.join(top, path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)

    for name, content in TOP.items():
        write(name, content)
    paths = list(TOP)
    sources = files - len(TOP)
    side = math.ceil(math.sqrt(math.ceil(sources / PER_DIR)))
    for i in range(sources):
        leaf, j = divmod(i, PER_DIR)
        directory = f"src/pkg{leaf // side:03d}/mod{leaf % side:03d}"
        if j == 0:
            os.makedirs(os.path.join(top, directory), exist_ok=True)
        path = f"{directory}/file{j:02d}.py"
        write(path, _text(rng, rng.randint(100, 500)) + "\n")
        paths.append(path)
    for i in range(IGNORED):
        lib, j = divmod(i, 50)
        directory = f"node_modules/lib{lib:03d}/dist"
        if j == 0:
            os.makedirs(os.path.join(top, directory), exist_ok=True)
        write(f"{directory}/chunk{j:02d}.js", _text(rng, rng.randint(100, 500)) + "\n")
    return Workspace(root, paths)


# --- row 1: the store ----------------------------------------------------------------------------


@dataclass
class StoreSide:
    size: int
    workspace: Workspace
    store: SnapshotStore  # as the server runs it: watching the workspace
    scanning: SnapshotStore  # with --no-snapshot-watch: every take scans the workspace
    tree: str
    first_s: float
    rng: random.Random
    count: int = 0


def _store_side(work: Path, workspace: Workspace) -> StoreSide:
    """A store on a generated workspace, after its first take (timed: it hashes every file), and
    one that scans the same workspace, after its own first take (untimed)."""
    size = len(workspace.files)
    store = SnapshotStore(work / f"snapshots-{size}.git", workspace.root, Limits(), watch=True)
    start = time.perf_counter()
    first = store.take()
    seconds = time.perf_counter() - start
    if not first.complete or first.tree is None:
        raise RuntimeError(f"the first snapshot of {size:,} files is incomplete: {first.reason}")
    held = store.files(first.tree)
    if sorted(held) != sorted(workspace.files):
        raise RuntimeError(
            f"the first snapshot holds {len(held):,} files, not the {size:,} generated "
            f"(node_modules/ among them: {any(p.startswith('node_modules/') for p in held)})"
        )
    scanning = SnapshotStore(work / f"scanning-{size}.git", workspace.root, Limits())
    if scanning.take().tree != first.tree:
        raise RuntimeError("the scanning store's first snapshot differs from the watching store's")
    return StoreSide(size, workspace, store, scanning, first.tree, seconds, random.Random(size + 1))


def _change(side: StoreSide) -> list[str]:
    """Rewrites 3 files far apart (a few hundred bytes each, new content); returns them."""
    side.count += 1
    changed = side.workspace.spread(side.count)
    for path in changed:
        text = f"take {side.count}\n{_text(side.rng, side.rng.randint(100, 500))}\n"
        (side.workspace.root / path).write_text(text)
    return changed


def _take_measure(side: StoreSide, takes: int) -> Measure:
    """Each change is taken by both stores, in turn order alternating: the same work, side by
    side. Both must give the same tree, holding exactly the 3 changes."""

    async def measure() -> Sample:
        watched: list[float] = []
        scanned: list[float] = []
        for i in range(takes):
            changed = _change(side)  # untimed
            order = [(side.store, watched), (side.scanning, scanned)]
            trees = {}
            for store, out in order if i % 2 == 0 else order[::-1]:
                start = time.perf_counter()
                snap = store.take()
                out.append(time.perf_counter() - start)
                if not snap.complete or snap.tree is None:
                    raise RuntimeError(f"a snapshot of {side.size:,} files is incomplete: {snap.reason}")
                trees[id(store)] = snap.tree
            tree = trees[id(side.store)]
            if trees[id(side.scanning)] != tree:
                raise RuntimeError("the watching and the scanning store recorded different trees")
            seen = sorted(c.path for c in side.store.changes(side.tree, tree))
            if seen != sorted(changed):
                raise RuntimeError(f"the snapshot holds changes to {seen}, not to {sorted(changed)}")
            side.tree = tree
        return {f"take {side.size}": watched, f"scan {side.size}": scanned}

    return measure


async def _store_rows(sides: Sequence[StoreSide], plan: Plan) -> Samples:
    measures: dict[str, Measure] = {}
    for side in sides:
        measures[f"take {side.size}"] = _take_measure(side, plan.takes)
    return await interleave(measures, plan.take_rounds, budget_s=plan.budget_s, between=settle)


# --- row 5: first snapshots of big workspaces --------------------------------------------------

# Bump when `generate` or the checkout's making changes: the cache is rebuilt.
_CACHE_VERSION = 1


def _git_build(root: Path, *args: str) -> None:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(root / ".no-home"),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_AUTHOR_NAME": "bench",
        "GIT_AUTHOR_EMAIL": "bench@example.invalid",
        "GIT_COMMITTER_NAME": "bench",
        "GIT_COMMITTER_EMAIL": "bench@example.invalid",
    }
    subprocess.run(["git", "-c", "gc.auto=0", *args], cwd=root, env=env, check=True, capture_output=True)


def cached(files: int, seed: int, checkout: bool) -> Workspace:
    """A generated workspace kept under CACHE (made on first use; a `ready` file says it is
    whole): with `checkout`, committed in a git repository of its own and packed, as a clone."""
    name = f"v{_CACHE_VERSION}-{files}-{seed}-{'git' if checkout else 'plain'}"
    home = CACHE / name
    ready = home / "ready"
    if not ready.exists():
        shutil.rmtree(home, ignore_errors=True)
        workspace = generate(home / "ws", files, seed)
        if checkout:
            _git_build(workspace.root, "init", "-q")
            _git_build(workspace.root, "add", "-A")
            _git_build(workspace.root, "commit", "-q", "-m", "generated")
            _git_build(workspace.root, "repack", "-a", "-d", "-q")
            _git_build(workspace.root, "prune-packed")
        (home / "paths").write_bytes(b"".join(os.fsencode(p) + b"\0" for p in workspace.files))
        ready.write_text("")
    paths = [os.fsdecode(p) for p in (home / "paths").read_bytes().split(b"\0") if p]
    return Workspace((home / "ws").resolve(), paths)


def _first_measure(work: Path, workspace: Workspace, name: str, seeded: bool, trees: set[str]) -> Measure:
    """One first take of the workspace by a new store (deleted after): complete, holding the
    generated files, seeded from git or not as the row says."""
    count = 0

    async def measure() -> Sample:
        nonlocal count
        count += 1
        repo = work / f"first-{name}-{count}.git"
        # As the server runs it (watching), with room to measure past the 30 s default timeout.
        store = SnapshotStore(repo, workspace.root, Limits(timeout_s=FIRST_TIMEOUT_S), watch=True)
        try:
            read: list[float] = []
            start = time.perf_counter()
            snap = store.take(on_read=lambda: read.append(time.perf_counter()))
            seconds = time.perf_counter() - start
            if not snap.complete or snap.tree is None:
                raise RuntimeError(f"{name}: the first snapshot is incomplete: {snap.reason}")
            if (snap.how == "seeded") != seeded:
                raise RuntimeError(f"{name}: the first snapshot was taken by {snap.how!r}")
            if snap.tree not in trees:
                if sorted(store.files(snap.tree)) != sorted(workspace.files):
                    raise RuntimeError(f"{name}: the first snapshot does not hold the generated files")
                trees.add(snap.tree)
        finally:
            store.close()
            shutil.rmtree(repo, ignore_errors=True)
        return {name: read[0] - start, f"{name} complete": seconds}

    return measure


def _warm(workspace: Workspace) -> None:
    """Reads every file once (untimed), so row 5 starts with the page cache as warm as row 1's
    freshly generated workspaces (the cached ones may have been evicted since they were made)."""
    for directory, _dirs, names in os.walk(workspace.root):
        for name in names:
            with open(os.path.join(directory, name), "rb") as f:
                f.read()


async def _first_rows(work: Path, checkout: Workspace, plain: Workspace, rounds: int) -> Samples:
    await asyncio.to_thread(lambda: (_warm(checkout), _warm(plain)))
    trees: set[str] = set()
    samples = await interleave(
        {
            "first git": _first_measure(work, checkout, "first git", True, trees),
            "first plain": _first_measure(work, plain, "first plain", False, trees),
        },
        rounds,
        min_rounds=rounds,
        between=settle,
    )
    if len(trees) != 1:
        raise RuntimeError(f"the checkout and the same files without git gave {len(trees)} trees, not one")
    return samples


# --- rows 2 to 4: the service ---------------------------------------------------------------------


@dataclass
class Served:
    """A session of the server on a generated workspace, the 3 paths its turns write, and the
    prompt of its newest turn (the point row 4 rewinds to)."""

    c: Client
    session_id: str
    workspace: Workspace
    paths: list[str]
    rng: random.Random
    count: int = 0
    target: str = ""
    written: dict[str, str] = field(default_factory=dict)

    @property
    def cwd(self) -> Path:
        return self.workspace.root

    async def turn(self) -> float:
        """One turn writing the 3 paths, WRITE_BYTES each, new content; the seconds it took to
        the end of its Prompt stream (the turn-end snapshot is taken before the stream ends)."""
        self.count += 1
        self.written = {}
        for k, path in enumerate(self.paths):
            head = f"turn {self.count} file {k} "
            body = _text(self.rng, WRITE_BYTES).replace("\n", " ")
            # The model strips the line and adds a newline: no space at either end.
            self.written[path] = (head + body)[: WRITE_BYTES - 2] + "."
        text = "\n".join(f"write {p} {t}" for p, t in self.written.items())
        self.target, seconds = await timed(self.c.prompt(self.session_id, text))
        for path, content in self.written.items():
            on_disk = (self.cwd / path).read_bytes()
            if on_disk != (content + "\n").encode() or len(on_disk) != WRITE_BYTES:
                raise RuntimeError(f"turn {self.count} did not write {path} as asked")
        return seconds


async def _served(c: Client, workspace: Workspace, snapshots: bool, paths: list[str], seed: int) -> Served:
    session = await c.sessions.CreateSession(
        session_service_pb2.CreateSessionRequest(cwd=str(workspace.root), workspace_snapshots=snapshots)
    )
    if session.workspace_snapshots != snapshots or session.cwd != str(workspace.root):
        raise RuntimeError(f"the session was not created as asked: {session}")
    return Served(c, session.session_id, workspace, paths, random.Random(seed))


def _turn_measure(s: Served, name: str, turns: int) -> Measure:
    async def measure() -> Sample:
        return {name: [await s.turn() for _ in range(turns)]}

    return measure


def _rewind_measure(s: Served, name: str, source: rewind_pb2.FilesSource.ValueType) -> Measure:
    async def measure() -> Sample:
        result, seconds = await timed(s.c.rewind(s.session_id, s.target, FILES))
        got = result.files.source
        if got != source:
            raise RuntimeError(
                f"{name}: the files rewind was served from {rewind_pb2.FilesSource.Name(got)}, "
                f"not {rewind_pb2.FilesSource.Name(source)}"
            )
        left = [p for p in s.paths if (s.cwd / p).exists()]
        if not result.files.can_rewind or left:
            raise RuntimeError(f"{name}: the files rewind did not remove {left}: {result}")
        await s.turn()  # untimed: the files again, and the next round's point
        return {name: seconds}

    return measure


# --- row 6: a revert of one turn against a files rewind to the same point -------------------------


def _line(rng: random.Random, head: str = "") -> str:
    """A line of code-like text, no space at either end (the model strips a `write` line)."""
    return head + " ".join(rng.choices(_VOCABULARY, k=10))


def _relined(text: str, index: int, line: str) -> str:
    """`text` with its line `index` (0: the first, -1: the last) replaced by `line`."""
    lines = text.splitlines()
    lines[index] = line
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class RevertRound:
    """One round's two turns: the first one's prompt (the point), the files as they were before
    it and after the second, and what a revert of the first must leave."""

    point: str
    before: dict[str, str]
    now: dict[str, str]
    reverted: dict[str, str]


@dataclass
class Reverting:
    """Row 6: a session with snapshots on, of `size` files, and the 4 it edits: each round, a
    turn rewrites the first line of the first 3, then a later turn the last line of the first of
    them and of the fourth. Reverting the first turn takes back its lines and keeps the later
    turn's, in the same file (a three-way merge) and in the other."""

    s: Served
    size: int

    @property
    def edited(self) -> list[str]:
        return self.s.paths[:CHANGED]

    @property
    def later(self) -> str:
        return self.s.paths[CHANGED]

    def files(self) -> dict[str, str]:
        return {p: (self.s.cwd / p).read_text() for p in self.s.paths}

    async def write(self, files: dict[str, str]) -> str:
        """A turn that reads each file, then writes it whole as given (the CLI writes no file the
        conversation has not read as it is now); its prompt's id."""
        lines = []
        for path, text in files.items():
            escaped = text.removesuffix("\n").replace("\n", "\\n")
            lines += [f"read {path}", f"write {path} {escaped}"]
        point = await self.s.c.prompt(self.s.session_id, "\n".join(lines))
        wrong = [p for p, text in files.items() if (self.s.cwd / p).read_text() != text]
        if wrong:
            raise RuntimeError(f"{self.size:,} files: a turn did not write {wrong} as asked")
        return point

    async def turns(self) -> RevertRound:
        """The round's two turns (untimed)."""
        self.s.count += 1
        rng, n = self.s.rng, self.s.count
        before = self.files()
        first = {p: _relined(before[p], 0, _line(rng, f"first turn {n}: ")) for p in self.edited}
        point = await self.write(first)
        after = {**before, **first}
        later = {
            p: _relined(after[p], -1, _line(rng, f"later turn {n}: ")) for p in (self.edited[0], self.later)
        }
        await self.write(later)
        kept = self.edited[0]
        reverted = {
            **before,
            kept: _relined(before[kept], -1, later[kept].splitlines()[-1]),
            self.later: later[self.later],
        }
        return RevertRound(point, before, {**after, **later}, reverted)


async def _reverting(c: Client, workspace: Workspace, seed: int) -> Reverting:
    """A session on `workspace` (snapshots on) whose first turn (untimed; its snapshot hashes
    every file) writes the 4 files it edits, LINES lines each, so a turn's first and last line
    are far apart."""
    paths = workspace.spread(0, CHANGED + 1)
    r = Reverting(await _served(c, workspace, True, paths, seed), len(workspace.files))
    await r.write({p: "\n".join(_line(r.s.rng) for _ in range(LINES)) + "\n" for p in paths})
    return r


async def _files_rewind(
    r: Reverting, point: str, scope: rewind_pb2.RewindScope.ValueType
) -> rewind_pb2.RewindResult:
    result: rewind_pb2.RewindResult = await r.s.c.rewinds.Rewind(
        rewind_service_pb2.RewindRequest(session_id=r.s.session_id, message_id=point, mode=FILES, scope=scope)
    )
    return result


async def _undo(r: Reverting, rewind_id: str) -> None:
    await r.s.c.rewinds.UndoRewind(
        rewind_service_pb2.UndoRewindRequest(session_id=r.s.session_id, rewind_id=rewind_id)
    )


def _revert_measure(r: Reverting) -> Measure:
    """Per round, on the round's two turns: the revert of the first (REWIND_SCOPE_TURN) and the
    files rewind to the same point (REWIND_SCOPE_SINCE), which goes first alternating, the first
    one undone (untimed) before the second. Each must come from the snapshots and leave the files
    as its row says: the revert the later turn's lines, the rewind none of either turn's."""
    revert_name, rewind_name = f"revert {r.size}", f"rewind {r.size}"

    async def measure() -> Sample:
        turns = await r.turns()
        times: dict[str, float] = {}
        # The revert changes the first turn's 3 files; the rewind those and the later turn's fourth.
        sides = [
            (revert_name, REWIND_SCOPE_TURN, turns.reverted, r.edited),
            (rewind_name, REWIND_SCOPE_SINCE, turns.before, r.s.paths),
        ]
        for k, (name, scope, want, changed) in enumerate(sides if r.s.count % 2 else sides[::-1]):
            if k:
                settle()  # as `interleave` does before each measure
            result, times[name] = await timed(_files_rewind(r, turns.point, scope))
            got = result.files.source
            if got != SNAPSHOT:
                raise RuntimeError(
                    f"{name}: served from {rewind_pb2.FilesSource.Name(got)}, not from snapshots"
                )
            wrote = sorted(str(Path(p).relative_to(r.s.cwd)) for p in result.files.files_changed)
            if not result.files.can_rewind or result.files.conflicts or wrote != sorted(changed):
                raise RuntimeError(f"{name}: changed {wrote}, not {sorted(changed)}: {result}")
            files = r.files()
            wrong = [p for p, text in want.items() if files[p] != text]
            if wrong:
                raise RuntimeError(
                    f"{name}: left {wrong} not as it should (the later turn's lines kept or not)"
                )
            if k == 0:
                await _undo(r, result.rewind_id)  # untimed: back to after the later turn
                if r.files() != turns.now:
                    raise RuntimeError(f"{name}: its undo did not put the files back")
        return times

    return measure


async def _revert_rows(reverting: Sequence[Reverting], plan: Plan) -> Samples:
    return await interleave(
        {f"revert {r.size}": _revert_measure(r) for r in reverting},
        plan.rewind_rounds,
        budget_s=plan.budget_s,
        between=settle,
    )


async def _revert_git(r: Reverting) -> dict[str, int]:
    """The git processes a revert of one turn starts, and a files rewind to the same point, on a
    round's two turns (untimed); the revert is undone (untimed) before the rewind."""
    turns = await r.turns()
    counts: dict[str, int] = {}
    results: dict[str, rewind_pb2.RewindResult] = {}
    for name, scope in (
        (f"revert of one turn from snapshots, {r.size:,} files", REWIND_SCOPE_TURN),
        (f"files Rewind to the same point, {r.size:,} files", REWIND_SCOPE_SINCE),
    ):

        async def call(name: str = name, scope: rewind_pb2.RewindScope.ValueType = scope) -> None:
            results[name] = await _files_rewind(r, turns.point, scope)

        counts[name] = await _git_processes(call)
        result = results[name]
        if result.files.source != SNAPSHOT or not result.files.can_rewind:
            raise RuntimeError(f"{name}: not served from snapshots: {result}")
        if scope == REWIND_SCOPE_TURN:
            await _undo(r, result.rewind_id)
    return counts


@dataclass
class Disk:
    """Row 3: the snapshot-on session's repository before and after row 2's turns."""

    turns: int = 0
    before: int = 0
    after: int = 0
    kinds: dict[str, tuple[int, int]] = field(default_factory=dict)  # type: (objects, bytes) added
    packed: int = 0  # the added objects in one pack (deltas among them)

    @property
    def per_turn(self) -> float:
        return (self.after - self.before) / self.turns if self.turns else math.nan

    def kind_per_turn(self, kind: str) -> tuple[float, float]:
        count, size = self.kinds.get(kind, (0, 0))
        return count / self.turns, size / self.turns


def _git_env(repo: Path) -> dict[str, str]:
    """Plain git reading the store's own repository: no system or user config."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(repo / "no-home"),
        "LC_ALL": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
    }


def _objects(repo: Path) -> dict[str, tuple[str, int]]:
    """Every object of the repository: its type and the bytes it takes on disk."""
    out = subprocess.run(
        ["git", "--git-dir", str(repo), "cat-file", "--batch-all-objects",
         "--batch-check=%(objectname) %(objecttype) %(objectsize:disk)"],
        capture_output=True, check=True, env=_git_env(repo),
    ).stdout  # fmt: skip
    objects = {}
    for line in out.decode().splitlines():
        oid, kind, size = line.split()
        objects[oid] = (kind, int(size))
    return objects


def _packed(repo: Path, oids: Sequence[str]) -> int:
    """The bytes of a pack of these objects, deltas among them (what `git gc` or `repack` would
    make of them)."""
    out = subprocess.run(
        ["git", "--git-dir", str(repo), "pack-objects", "--stdout", "-q", "--window=50"],
        input="".join(f"{oid}\n" for oid in oids).encode(),
        capture_output=True, check=True, env=_git_env(repo),
    ).stdout  # fmt: skip
    return len(out)


@dataclass
class Results:
    sides: list[StoreSide]
    store: Samples  # row 1
    turns: Samples  # row 2
    disk: Disk  # row 3
    rewinds: Samples  # row 4
    first: Samples  # row 5
    reverts: Samples  # row 6
    git: dict[str, int] = field(default_factory=dict)  # git processes started by one call, by name
    phases: dict[str, float] = field(default_factory=dict)  # seconds spent, by phase


async def _run(work: Path, plan: Plan) -> Results:
    phases: dict[str, float] = {}
    t0 = time.monotonic()
    state = work / "service"
    root = bench_config(state).default_workspace_root
    big_on_ws = generate(root / f"on-{LARGE}", LARGE, seed=LARGE)
    async with serve(state) as c:
        assert c.running.snapshots is not None, "the benchmark server runs with snapshots"
        # Set-up, untimed. The first turn with snapshots on hashes its whole workspace (in the
        # server's snapshot threads) while the other workspaces are generated.
        big_on = await _served(c, big_on_ws, True, big_on_ws.new_paths(), seed=1)
        hashing = asyncio.ensure_future(big_on.turn())
        big = await asyncio.to_thread(lambda: (cached(FIRST, FIRST, True), cached(FIRST, FIRST, False)))
        others = await asyncio.to_thread(
            lambda: [
                generate(root / f"off-{LARGE}", LARGE, seed=LARGE + 1),
                generate(root / f"on-{SMALL}", SMALL, seed=SMALL),
                generate(root / f"off-{SMALL}", SMALL, seed=SMALL),  # the same content
                generate(work / "store" / f"workspace-{SMALL}", SMALL, seed=SMALL + 2),
                generate(work / "store" / f"workspace-{LARGE}", LARGE, seed=LARGE + 2),
            ]
        )
        revert_ws = await asyncio.to_thread(
            lambda: [generate(root / f"revert-{n}", n, seed=n + 3) for n in (SMALL, LARGE)]
        )
        big_off_ws, small_on_ws, small_off_ws = others[:3]
        big_off, small_on, small_off = await asyncio.gather(
            _served(c, big_off_ws, False, big_off_ws.new_paths(), seed=2),
            _served(c, small_on_ws, True, small_on_ws.new_paths(), seed=3),
            _served(c, small_off_ws, False, small_off_ws.new_paths(), seed=4),
        )
        # The row-6 sessions' first turns (each hashing its workspace) run with the others.
        *_, reverting = await asyncio.gather(
            hashing,
            big_off.turn(),
            small_on.turn(),
            small_off.turn(),
            asyncio.gather(*(_reverting(c, w, seed=5 + k) for k, w in enumerate(revert_ws))),
        )
        phases["set-up (7 workspaces generated, 6 sessions and their first turns)"] = time.monotonic() - t0

        # Row 1, the server idle: each store's first take alone, then the rounds.
        t0 = time.monotonic()
        sides = [_store_side(work / "store", w) for w in others[3:]]
        store = await _store_rows(sides, plan)
        phases["row 1 (with the first takes)"] = time.monotonic() - t0

        # Row 5, the server idle too.
        t0 = time.monotonic()
        first = await _first_rows(work / "first", *big, rounds=1 if plan.quick else FIRST_ROUNDS)
        phases["row 5"] = time.monotonic() - t0

        # Row 2, and the turns row 3 counts.
        t0 = time.monotonic()
        worker = c.running.registry.get(big_on.session_id)
        repo = c.running.snapshots.root / f"{big_on.session_id}.git"
        disk = Disk(before=await worker.snapshot_bytes())
        objects = _objects(repo)
        turns = await interleave(
            {
                "turn off": _turn_measure(big_off, "turn off", plan.turns),
                "turn on": _turn_measure(big_on, "turn on", plan.turns),
            },
            plan.turn_rounds,
            budget_s=plan.budget_s,
            between=settle,
        )
        disk.turns = turns.n("turn on")
        disk.after = await worker.snapshot_bytes()
        added = {oid: found for oid, found in _objects(repo).items() if oid not in objects}
        for kind, size in added.values():
            count, total = disk.kinds.get(kind, (0, 0))
            disk.kinds[kind] = (count + 1, total + size)
        disk.packed = _packed(repo, sorted(added))
        phases["rows 2, 3"] = time.monotonic() - t0

        # Row 4.
        t0 = time.monotonic()
        rewinds = await interleave(
            {
                "rewind snapshot": _rewind_measure(small_on, "rewind snapshot", SNAPSHOT),
                "rewind checkpoint": _rewind_measure(small_off, "rewind checkpoint", CHECKPOINT),
            },
            plan.rewind_rounds,
            budget_s=plan.budget_s,
            between=settle,
        )
        phases["row 4"] = time.monotonic() - t0

        # Row 6.
        t0 = time.monotonic()
        reverts = await _revert_rows(reverting, plan)
        phases["row 6"] = time.monotonic() - t0

        # What limits them: the git processes one call starts (counted once each, untimed).
        _change(sides[-1])
        git = {
            f"take() after 3 changes, {LARGE:,} files": await _git_processes(
                lambda: _now(sides[-1].store.take)
            ),
            "turn, snapshots on": await _git_processes(big_on.turn),
            "files Rewind from a snapshot": await _git_processes(lambda: _one_rewind(small_on)),
            "files Rewind from a CLI checkpoint": await _git_processes(lambda: _one_rewind(small_off)),
            **await _revert_git(reverting[-1]),
        }
        return Results(sides, store, turns, disk, rewinds, first, reverts, git, phases)


async def _now(call: Callable[[], object]) -> object:
    return call()


async def _one_rewind(s: Served) -> None:
    await s.c.rewind(s.session_id, s.target, FILES)


async def _git_processes(call: Callable[[], Awaitable[object]]) -> int:
    """The git processes the snapshot stores start while `call` runs (a command each; the
    parallel scan two)."""
    with (
        mock.patch.object(Git, "_complete", autospec=True, side_effect=Git._complete) as complete,
        mock.patch.object(Git, "run_parallel", autospec=True, side_effect=Git.run_parallel) as parallel,
        mock.patch.object(Git, "popen", autospec=True, side_effect=Git.popen) as popen,
    ):
        await call()
        return complete.call_count + popen.call_count + sum(len(c.args[1]) for c in parallel.call_args_list)


# --- the run -------------------------------------------------------------------------------------


async def _bounded(work: Awaitable[T], seconds: float) -> T:
    async with asyncio.timeout(seconds):
        return await work


def run(work: Path, quick: bool = False) -> Report:
    started = time.monotonic()
    plan = Plan.of(quick)
    results = asyncio.run(_bounded(_run(work, plan), TIMEOUT_S))
    report = _report(results, plan)
    report.notes.append(
        "time spent: " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in results.phases.items())
    )
    report.seconds = time.monotonic() - started
    return report


def _report(results: Results, plan: Plan) -> Report:
    sides, store, turns, disk, rewinds = (
        results.sides,
        results.store,
        results.turns,
        results.disk,
        results.rewinds,
    )
    report = Report(
        "6. Workspace snapshots",
        ["row", "measure", "n", "median (or per turn)", "min - max"],
    )

    def row(number: str, title: str, s: Samples, name: str) -> None:
        report.rows.append([number, title, str(s.n(name)), fmt_time(s.med(name)), s.spread(name)])

    for side in sides:
        row("1", f"take(), 3 files changed, {side.size:,} files", store, f"take {side.size}")
    for side in sides:
        row(
            "1",
            f"take() without the watch (scans the workspace), {side.size:,} files",
            store,
            f"scan {side.size}",
        )
    for side in sides:
        report.rows.append(
            ["1", f"first take (hashes every file), {side.size:,} files", "1", fmt_time(side.first_s), ""]
        )
    row("2", f"turn writing 3 files, snapshots off, {LARGE:,} files", turns, "turn off")
    row("2", f"turn writing 3 files, snapshots on, {LARGE:,} files", turns, "turn on")
    written = CHANGED * WRITE_BYTES
    blobs, trees = disk.kind_per_turn("blob"), disk.kind_per_turn("tree")
    objects = sum(size for _, size in disk.kinds.values()) / disk.turns if disk.turns else math.nan
    report.rows += [
        ["3", f"disk added per turn (repository files), {LARGE:,} files", str(disk.turns), fmt_bytes(disk.per_turn), ""],
        ["3", f"  of which blobs ({blobs[0]:.1f} per turn)", str(disk.turns), fmt_bytes(blobs[1]), ""],
        ["3", f"  of which trees ({trees[0]:.1f} per turn)", str(disk.turns), fmt_bytes(trees[1]), ""],
        ["3", "  the rest (index, refs: rewritten in place)", str(disk.turns), fmt_bytes(disk.per_turn - objects), ""],
        ["3", "the same objects in one pack (deltas among them)", str(disk.turns), fmt_bytes(disk.packed / disk.turns if disk.turns else math.nan), ""],
        ["3", "bytes a turn wrote (3 files)", str(disk.turns), fmt_bytes(written), ""],
    ]  # fmt: skip
    row("4", f"files Rewind from a snapshot, {SMALL:,} files", rewinds, "rewind snapshot")
    row("4", f"files Rewind from a CLI checkpoint, {SMALL:,} files", rewinds, "rewind checkpoint")
    first = results.first
    row(
        "5",
        f"first take, a git checkout of {FIRST:,} files (seeded), until the turn may start",
        first,
        "first git",
    )
    row("5", "  the same take until complete (recorded; snapshot_available)", first, "first git complete")
    row(
        "5",
        f"first take, the same {FIRST:,} files without git (all hashed), until the turn may start",
        first,
        "first plain",
    )
    row("5", "  the same take until complete (recorded; snapshot_available)", first, "first plain complete")
    reverts = results.reverts
    for size in (SMALL, LARGE):
        row("6", f"revert of one turn (3 files, 1 merged), {size:,} files", reverts, f"revert {size}")
        row("6", f"files Rewind to the same point (4 files), {size:,} files", reverts, f"rewind {size}")

    small, large = sides[0], sides[-1]
    take_large, take_small = store.med(f"take {large.size}"), store.med(f"take {small.size}")
    report.targets.append(
        Target(
            f"1. take() at {large.size:,} files, 3 changed: median at most {fmt_time(MAX_TAKE_S)}",
            take_large <= MAX_TAKE_S,
            f"{fmt_time(take_large)} over {store.n(f'take {large.size}')} takes",
        )
    )
    report.targets.append(
        ratio_target(
            f"1. take() at {large.size:,} files / at {small.size:,} files",
            take_large,
            take_small,
            at_most=MAX_TAKE_GROWTH,
        )
    )
    on, off = turns.med("turn on"), turns.med("turn off")
    report.targets.append(
        Target(
            f"2. what a turn's two snapshots add, {LARGE:,} files: at most 2 x {fmt_time(MAX_TAKE_S)}",
            on - off <= MAX_TURN_COST_S,
            f"{fmt_time(on)} - {fmt_time(off)} = {fmt_time(on - off)} (medians, snapshots on - off)",
        )
    )
    report.targets.append(
        ratio_target(
            "3. disk added per turn / bytes the turn wrote",
            disk.per_turn,
            written,
            at_most=MAX_DISK_RATIO,
            fmt=fmt_bytes,
        )
    )
    report.targets.append(
        ratio_target(
            "4. files Rewind: from a snapshot / from a CLI checkpoint",
            rewinds.med("rewind snapshot"),
            rewinds.med("rewind checkpoint"),
            at_most=MAX_REWIND_RATIO,
        )
    )

    first_git, first_plain = first.med("first git"), first.med("first plain")
    report.targets.append(
        Target(
            f"5. first take of a {FIRST:,}-file git checkout, until the turn may start: median at most "
            f"{fmt_time(MAX_FIRST_GIT_S)}",
            first_git <= MAX_FIRST_GIT_S,
            f"{fmt_time(first_git)} over {first.n('first git')} takes",
        )
    )
    report.targets.append(
        Target(
            f"5. first take of {FIRST:,} files without git, until the turn may start: median at most "
            f"{fmt_time(MAX_FIRST_PLAIN_S)}",
            first_plain <= MAX_FIRST_PLAIN_S,
            f"{fmt_time(first_plain)} over {first.n('first plain')} takes",
        )
    )
    for size in (SMALL, LARGE):
        report.targets.append(
            ratio_target(
                f"6. revert of one turn / files Rewind to the same point, {size:,} files",
                reverts.med(f"revert {size}"),
                reverts.med(f"rewind {size}"),
                at_most=MAX_REVERT_RATIO,
            )
        )

    git = results.git
    for side in sides:
        take, scan = store.med(f"take {side.size}"), store.med(f"scan {side.size}")
        report.infos.append(
            f"1. {side.size:,} files: first take (hashes every file) {fmt_time(side.first_s)}; a take without "
            f"the watch / with it: {fmt_time(scan)} / {fmt_time(take)} = {fmt_ratio(scan / take)}"
        )
    report.infos.append(
        f"2. the turn itself (snapshots off) {fmt_time(off)}; snapshots on / off: {fmt_ratio(on / off)}; "
        f"two row-1 takes at {large.size:,} files: {fmt_time(2 * take_large)}"
    )
    report.infos.append(
        f"3. per turn: blobs {fmt_bytes(blobs[1])}, trees {fmt_bytes(trees[1])} ({trees[0]:.1f} tree objects), "
        f"the rest {fmt_bytes(disk.per_turn - objects)}; the same objects packed: "
        f"{fmt_bytes(disk.packed / disk.turns if disk.turns else math.nan)} per turn "
        f"({fmt_ratio(disk.packed / disk.turns / written if disk.turns else math.nan)} the bytes written); "
        f"trees alone {fmt_ratio(trees[1] / written)} the bytes written (they do not shrink with smaller edits)"
    )
    report.infos.append(
        f"4. a files Rewind from a snapshot takes one (before; the tree after is computed from trees): a row-1 "
        f"take at {small.size:,} files {fmt_time(take_small)}, of its {fmt_time(rewinds.med('rewind snapshot'))}"
    )
    report.infos.append(
        f"5. first takes: {FIRST:,} files, git checkout / without git: {fmt_time(first_git)} / "
        f"{fmt_time(first_plain)} until the turn may start, {fmt_time(first.med('first git complete'))} / "
        f"{fmt_time(first.med('first plain complete'))} until complete (the turn runs meanwhile; the point "
        f"has its snapshot from then); at {large.size:,} files without git {fmt_time(large.first_s)} "
        f"({fmt_time(large.first_s * FIRST / large.size)} scaled to {FIRST:,}, until complete)"
    )
    report.infos.append(
        f"6. {LARGE:,} files / {SMALL:,} files: a revert of one turn "
        f"{fmt_ratio(reverts.med(f'revert {LARGE}') / reverts.med(f'revert {SMALL}'))}, a files Rewind to the "
        f"same point {fmt_ratio(reverts.med(f'rewind {LARGE}') / reverts.med(f'rewind {SMALL}'))}"
    )
    if git:
        report.infos.append(
            "git processes started by one call: " + "; ".join(f"{name}: {n}" for name, n in git.items())
        )
    report.notes += [
        f"workspaces generated here: {SMALL:,} or {LARGE:,} files a snapshot holds (source files of 100 to 500 "
        f"bytes of code-like text, {PER_DIR} to a directory under src/pkgNNN/modNNN/), plus {IGNORED:,} files under "
        "a node_modules/ that the .gitignore names; each session has a workspace of its own",
        f"row 1: {store.n(f'take {large.size}')} takes per size ({plan.takes} per round, at most {plan.take_rounds} "
        f"rounds), interleaved with the scan alone, a garbage collection before each measure; the store "
        "called directly (SnapshotStore, default Limits) on workspaces of its own, the server of rows 2 to 4 "
        "up but idle; the first take of each timed once, alone",
        f"rows 2, 3: the real server in process, {plan.turns} turns per side per round; each turn writes "
        f"{CHANGED} files of {WRITE_BYTES:,} bytes in 3 directories far apart, new content every turn; "
        "row 3 counts the turns of row 2 on the session with snapshots on, from after its first turn (whose "
        "snapshot stored every file) on",
        f"row 4: a {SMALL:,}-file workspace of the same content per session; each round rewinds to the turn that "
        f"wrote {CHANGED} new files, then runs that turn again, untimed",
        f"row 5: {first.n('first git')} first takes of each (a new store each, deleted after), interleaved, the "
        f"server idle; the {FIRST:,}-file workspaces (plus {IGNORED:,} ignored files) are generated once under "
        f"{CACHE} (the checkout committed and packed, as a clone), and stay in the page cache between takes",
        f"row 6: a session with snapshots on per size, its workspace of its own; each round runs two turns "
        f"(untimed): the first rewrites the first line of {CHANGED} files far apart ({LINES} lines each), the "
        "later one the last line of the first of them and of a fourth; then the revert of the first turn and the files "
        "Rewind to it, which goes first alternating, the first undone (untimed); the revert must keep the later "
        f"turn's lines (one file merged by git merge-file); {reverts.n(f'revert {LARGE}')} rounds",
    ]
    return report
