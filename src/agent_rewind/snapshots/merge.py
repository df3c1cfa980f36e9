"""Reverting what one turn changed, path by path, by a three-way merge of snapshot trees.

For each path the turn changed (`before` → `after`), the revert wants the workspace as it is now
(`now`) with the turn's change taken back: git's three-way merge with the file just after the turn
as the base, the file now as ours and the file just before the turn as theirs. So:

- unchanged since the turn (now is after): it is put back as it was before;
- already as it was before: nothing to do;
- changed since, a text file in all three, of a mode none of the three disagree on: merged by
  lines with `git merge-file` (its own diff3, the one `git revert` uses); a clean merge is the
  result, overlapping (or adjacent) changes are a conflict;
- anything else changed since is a conflict: a file created or deleted since (or by the turn, and
  changed since), a binary file (a NUL in its first 8,000 bytes, git's own test), a symbolic link,
  a directory where a file was, a path under a file.

A conflict is left as it is now, or (`overwrite`) put back as it was before the turn, except where
a directory stands now at the file's path or a file on its way (`Reverted.kept`): putting it back
would remove what is there, which the turn did not make. The result
is a tree: `now` with the merged paths set, written to the store, from which the rewind's
ordinary restore writes the workspace (all or nothing, rolled back on failure, idempotent).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agent_rewind.snapshots.files import MODE_EXECUTABLE, MODE_FILE
from agent_rewind.snapshots.objects import MODE_TREE, Objects

Entry = tuple[str, str] | None  # (mode, blob id), or nothing at the path

# What git reads to call a file binary, and the test it applies.
_BINARY_PROBE = 8000

_TEXT_MODES = (MODE_FILE, MODE_EXECUTABLE)

# Merges three versions of a file's bytes (ours, base, theirs): the merged bytes, or None when
# they conflict.
MergeText = Callable[[bytes, bytes, bytes], "bytes | None"]


@dataclass(frozen=True)  # gremlin: pardon[equivalent] nothing assigns to or hashes one
class Reverted:
    """What a revert leaves: `tree` is `now` with every path as the revert leaves it."""

    tree: str
    changed: tuple[str, ...]  # the paths whose entry differs between `now` and `tree`
    conflicts: tuple[str, ...]  # the paths changed since in a way the merge cannot take back
    kept: tuple[str, ...] = ()  # those left as they are even when overwriting (see above)


class _Conflict(Exception):
    pass


def revert(
    objects: Objects,
    merge_text: MergeText,
    before: str,
    after: str,
    now: str,
    paths: Sequence[str],
    *,
    overwrite: bool,
) -> Reverted:
    """The revert of the change `before` → `after` of `paths` (the paths it changed) in `now`."""
    results: dict[str, Entry] = {}
    conflicts, kept = [], []
    for path in sorted(set(paths)):
        was, turned, is_now = (objects.lookup(tree, path) for tree in (before, after, now))
        if is_now == was:
            continue  # as it was before the turn: nothing to take back
        if (is_now is not None and is_now[0] == MODE_TREE) or _under_file(objects, now, path):
            conflicts.append(path)
            kept.append(path)
            continue
        try:
            results[path] = was if is_now == turned else _merged(objects, merge_text, turned, is_now, was)
        except _Conflict:
            conflicts.append(path)
            if overwrite:
                results[path] = was
    tree = objects.edit(now, results) if results else now
    changed = tuple(path for path, entry in results.items() if entry != objects.lookup(now, path))
    return Reverted(tree, changed, tuple(conflicts), tuple(kept))


def _under_file(objects: Objects, root: str, path: str) -> bool:
    """Whether a directory on the way to `path` is a file (or a link) in tree `root`."""
    parts = path.split("/")
    oid = root
    for part in parts[:-1]:
        entry = objects.tree(oid).get(part)
        if entry is None:
            return False
        if entry[0] != MODE_TREE:
            return True
        oid = entry[1]
    return False


def _merged(objects: Objects, merge_text: MergeText, base: Entry, ours: Entry, theirs: Entry) -> Entry:
    """The three-way merge of one path (all three differ from one another, or ours from both)."""
    if base is None or ours is None or theirs is None:
        raise _Conflict  # created or deleted on one side, changed on the other
    if any(entry[0] not in _TEXT_MODES for entry in (base, ours, theirs)):
        raise _Conflict  # a link, a directory: only whole, and it changed on both sides
    mode = _three_way(base[0], ours[0], theirs[0])
    oid = _three_way(base[1], ours[1], theirs[1])
    if oid is None:
        texts = [objects.read(entry[1], b"blob") for entry in (ours, base, theirs)]
        if any(b"\0" in text[:_BINARY_PROBE] for text in texts):
            raise _Conflict
        merged = merge_text(*texts)
        if merged is None:
            raise _Conflict
        oid = objects.write(b"blob", merged)
    if mode is None:
        raise _Conflict  # made executable on one side, and not on the other
    return (mode, oid)


def _three_way(base: str, ours: str, theirs: str) -> str | None:
    """The merge of one value changed on either side; None when both changed it differently."""
    if ours in (base, theirs):
        return theirs
    if theirs == base:
        return ours
    return None  # gremlin: pardon[equivalent] a mutant's "return None" is this line
