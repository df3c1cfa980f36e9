"""Comparing two snapshot trees: which paths changed, their patches, and their line counts.

Every comparison reads only objects (`diff-tree` over two tree ids), through a git that has no
index, so that none of them waits on a snapshot being taken. `SnapshotStore` offers them as
methods; they are here because they share nothing with taking or restoring.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from agent_rewind.snapshots.errors import GitFailed, SnapshotError
from agent_rewind.snapshots.git import Git

ChangeKind = Literal["added", "modified", "deleted"]

DEFAULT_DIFF_BYTES = 64 * 1024

_OID = re.compile(r"[0-9a-f]{40}")
_KINDS: dict[bytes, ChangeKind] = {b"A": "added", b"D": "deleted", b"M": "modified", b"T": "modified"}


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


def changes(reader: Git, a: str, b: str) -> list[Change]:
    """The paths whose content, mode or type differs from tree `a` to tree `b`."""
    out = reader.run("diff-tree", "-r", "-z", "--no-renames", tree_id(a), tree_id(b))
    fields = out.split(b"\0")
    changes: list[Change] = []
    for meta, path in zip(fields[0::2], fields[1::2], strict=False):
        if meta.startswith(b":"):
            changes.append(Change(os.fsdecode(path), _KINDS.get(meta.split()[-1][:1], "modified")))
    return changes


def changes_many(reader: Git, pairs: Sequence[tuple[str, str]]) -> list[list[Change]]:
    """`changes(a, b)` for every pair, in one git process (a rewind compares every interval
    of the history it covers: hundreds of pairs for a point hundreds of turns back)."""
    wanted = [(tree_id(a), tree_id(b)) for a, b in pairs]
    distinct = sorted({pair for pair in wanted if pair[0] != pair[1]})
    found: dict[tuple[str, str], list[Change]] = {pair: [] for pair in distinct}
    if distinct:
        stdin = "".join(f"{a} {b}\n" for a, b in distinct).encode()
        out = reader.run("diff-tree", "--stdin", "-r", "-z", "--no-renames", stdin=stdin)
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


def diff(
    reader: Git, a: str, b: str, paths: Iterable[str] | None = None, max_bytes: int = DEFAULT_DIFF_BYTES
) -> list[FileDiff]:
    """Git's patch per changed path from tree `a` to tree `b` (only `paths` when given), each
    cut at `max_bytes`; binary content is flagged, not shown. One git streams the patches of
    a batch of paths, and no more than `max_bytes` of a path's patch is ever kept."""
    a, b = tree_id(a), tree_id(b)
    changes = _typed_changes(reader, a, b)
    wanted = None if paths is None else set(paths)
    found: dict[str, FileDiff] = {}
    for batch in [[]] if wanted is None else _batches(sorted(wanted)):
        # A pathspec matches its path and everything under it. Git's patches come in the
        # order of its changes, two for a change of type (a file that became a symlink).
        spec = set(batch)
        matched = [(c, retyped) for c, retyped in changes if not spec or _under(c.path, spec)]
        if not matched:
            continue
        patches = iter(_patches(reader, a, b, batch, max_bytes, sum(1 + retyped for _, retyped in matched)))
        for change, retyped in matched:
            parts = [next(patches) for _ in range(1 + retyped)]
            if (wanted is None or change.path in wanted) and change.path not in found:
                found[change.path] = _file_diff(change, parts, max_bytes)
    return [found[c.path] for c, _ in changes if c.path in found]


def _typed_changes(reader: Git, a: str, b: str) -> list[tuple[Change, bool]]:
    """changes(a, b), each with whether the path changed type (file, symlink)."""
    out = reader.run("diff-tree", "-r", "-z", "--no-renames", a, b)
    fields = out.split(b"\0")
    typed: list[tuple[Change, bool]] = []
    for meta, path in zip(fields[0::2], fields[1::2], strict=False):
        if meta.startswith(b":"):
            old, new, *_, status = meta[1:].split()
            change = Change(os.fsdecode(path), _KINDS.get(status[:1], "modified"))
            typed.append((change, status[:1] == b"T" and int(old, 8) >> 12 != int(new, 8) >> 12))
    return typed


def _patches(reader: Git, a: str, b: str, pathspec: list[str], max_bytes: int, expected: int) -> list[_Patch]:
    proc = reader.popen(
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


def numstat(reader: Git, a: str, b: str, paths: Iterable[str] | None = None) -> tuple[int, int]:
    """Lines inserted and deleted from tree `a` to tree `b` in `paths` (all when None);
    binary files count none."""
    wanted = None if paths is None else set(paths)
    out = reader.run("diff-tree", "-r", "-z", "--numstat", "--no-renames", tree_id(a), tree_id(b))
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


def tree_id(value: str) -> str:
    """A full object id; anything else (an option, a ref name) is refused before reaching git."""
    if isinstance(value, str) and _OID.fullmatch(value):
        return value
    raise ValueError(f"not a tree id: {value!r}")
