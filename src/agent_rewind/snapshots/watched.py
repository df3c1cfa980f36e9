"""A snapshot of just the paths the watch saw change since the last one, written without git
(`take_known`), and the index given those paths afterwards (`sync_index`), before git next reads it.

`SnapshotStore` takes this way when its watch vouches for every change since its last complete
snapshot (`snapshots.watch`); else git scans (`scan`). Neither function locks: the store calls
them under its lock.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterable
from pathlib import Path

from agent_rewind.snapshots.errors import GitTimeout, SnapshotError
from agent_rewind.snapshots.files import Workspace
from agent_rewind.snapshots.git import Git
from agent_rewind.snapshots.objects import MODE_TREE, Objects
from agent_rewind.snapshots.scan import capturable, ignored, real_dir, unrecordable


def take_known(
    objects: Objects,
    reader: Git,
    workspace: Path,
    last: str,
    paths: set[str],
    deadline: float,
    *,
    max_file_bytes: int,
    max_total_bytes: int,
) -> tuple[str | None, list[str]] | None:
    """The snapshot `last` with `paths` (all that changed since, as the watch saw it) as they
    are now, written without git: the blobs and the trees on the way to them are hashed here
    (`Objects.edit`), and only a new file asks git whether it is ignored (`check-ignore`, which
    reads no index: `reader` runs it). None when git must do it: a directory was made or removed.

    The same rules as a scan: a path behind a symlink, missing, or neither a file nor a
    symlink is not recorded; a name git refuses, or a file over the size bound, makes the
    snapshot incomplete; over the total bound nothing is written. The index is left as it
    was: the caller remembers the paths, for `sync_index` before git next reads it."""
    changes: dict[str, tuple[str, str] | None] = {}
    write: list[tuple[str, bool]] = []  # (path, tracked), to hash once the bounds are checked
    problems: list[str] = []
    total = 0
    real_dirs: dict[str, bool] = {"": True}
    for path in sorted(paths):
        if time.monotonic() > deadline:
            raise GitTimeout("the deadline passed while reading the changed files")
        if not capturable(path):
            continue  # in a .git directory: git never records it
        old = objects.lookup(last, path)
        if old is not None and old[0] == MODE_TREE:
            return None
        gone = old is not None  # what the snapshot records for a path it must not hold
        if not real_dir(workspace, path.rpartition("/")[0], real_dirs):
            if gone:
                changes[path] = None
            continue
        try:
            info = os.lstat(workspace / path)
        except (FileNotFoundError, NotADirectoryError):
            if gone:
                changes[path] = None
            continue
        if stat.S_ISDIR(info.st_mode):
            return None
        problem = unrecordable(path, info, max_file_bytes)
        if problem is None:
            write.append((path, old is not None))
            total += info.st_size
            continue
        if problem:
            problems.append(problem)
        if gone:
            changes[path] = None
    if total > max_total_bytes:
        return None, [f"total over {max_total_bytes} bytes: {total} bytes changed", *problems]
    excluded = ignored(reader, [path for path, tracked in write if not tracked], deadline)
    with Workspace(workspace) as files:
        for path, tracked in write:
            if path in excluded:
                continue
            try:
                found = files.content(path, max_file_bytes)
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


def sync_index(
    git: Git, objects: Objects, written: str, paths: Iterable[str], deadline: float | None
) -> None:
    """Gives the index the entries of `paths` that `take_known` recorded without it, from the
    tree it wrote last (`written`), before git scans: a file recorded once stays recorded,
    ignored or not, as in git. Without stat data, git hashes those files again when it next
    looks at them."""
    lines = []
    for path in sorted(paths):
        entry = objects.lookup(written, path) if capturable(path) else None
        if entry is None or entry[0] == MODE_TREE:
            lines.append(b"0 " + b"0" * 40 + b"\t" + os.fsencode(path) + b"\0")
        else:
            lines.append(f"{entry[0]} {entry[1]}\t".encode() + os.fsencode(path) + b"\0")
    try:
        git.run("update-index", "-z", "--replace", "--index-info", stdin=b"".join(lines), deadline=deadline)
    finally:
        objects.close()
