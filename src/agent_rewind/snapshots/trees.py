"""What a snapshot's trees hold, read with git (`entries`) or, while they are loose, without
(`entries_at`); and trees made here, without git: of a few named paths as they are in the
workspace (`capture`), or of one tree with some paths taken from another (`overlay`).

Nothing here locks: `SnapshotStore` calls these under its lock.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from agent_rewind.snapshots.compare import tree_id
from agent_rewind.snapshots.files import Entry, Workspace
from agent_rewind.snapshots.git import Git
from agent_rewind.snapshots.objects import MODE_TREE, Objects
from agent_rewind.snapshots.scan import capturable


def entries(reader: Git, tree: str) -> dict[str, Entry]:
    """Every file and symlink `tree` holds, by path (`git ls-tree -r`)."""
    out = reader.run("ls-tree", "-r", "-z", "--full-tree", tree_id(tree))
    found: dict[str, Entry] = {}
    for record in out.split(b"\0"):
        if record:
            meta, _, path = record.partition(b"\t")
            mode, _kind, oid = meta.split()
            found[os.fsdecode(path)] = Entry(mode.decode(), oid.decode())
    return found


def entries_at(objects: Objects, tree: str, paths: Iterable[str]) -> dict[str, Entry]:
    """What `tree` holds at each of `paths` that is a file or a symlink there, read without
    git while its trees are loose (the store's own, until a collection packs them)."""
    root = tree_id(tree)
    found: dict[str, Entry] = {}
    for path in paths:
        entry = objects.lookup(root, path)
        if entry is not None and entry[0] != MODE_TREE:
            found[path] = Entry(*entry)
    return found


def capture(objects: Objects, workspace: Path, paths: Iterable[str], max_file_bytes: int) -> str:
    """A tree holding just `paths` as they are in `workspace` now (a path that is missing, a
    directory, or behind a symlink is absent from it), its blobs and trees written as loose
    objects. Ignore rules do not apply; a file over `max_file_bytes` raises."""
    tree: dict[str, Any] = {}
    with Workspace(workspace) as files:
        for path in sorted({p for p in paths if capturable(p)}):
            found = files.content(path, max_file_bytes)
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
                node[name] = (mode, objects.write(b"blob", data))
    return _write_tree(objects, tree)


def _write_tree(objects: Objects, node: dict[str, Any]) -> str:
    written: dict[str, tuple[str, str]] = {}
    for name, value in node.items():
        written[name] = (MODE_TREE, _write_tree(objects, value)) if isinstance(value, dict) else value
    return objects.write_tree(written)


def overlay(objects: Objects, base: str, source: str, paths: Sequence[str]) -> str:
    """The tree `base` with each of `paths` as it is in `source` (a path absent there is
    absent here), computed from the trees alone."""
    held = entries_at(objects, source, paths)
    changes = {p: (held[p].mode, held[p].oid) if p in held else None for p in paths}
    return objects.edit(tree_id(base), changes)
