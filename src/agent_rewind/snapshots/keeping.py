"""Which snapshots a store's repository keeps, the rest collected (`keep_only`); the bytes it
takes (`directory_bytes`); and its deletion (`delete`).

Nothing here locks: `SnapshotStore` calls these under its lock.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from agent_rewind.snapshots.errors import SnapshotError
from agent_rewind.snapshots.git import Git

# The ref the kept trees hang under, as entries of one tree.
KEEP_REF = "refs/agent-rewind/keep"


def keep_only(git: Git, oids: list[str]) -> None:
    """Deletes every object not reachable from the trees `oids` (nor from the index, which the
    caller has brought up to date), packing the rest."""
    if oids:
        listing = b"".join(f"040000 tree {oid}\t{oid}\0".encode() for oid in oids)
        keep = git.run("mktree", "-z", stdin=listing).decode().strip()
        git.run("update-ref", KEEP_REF, keep)
    else:
        git.run("update-ref", "-d", KEEP_REF)
    git.run("repack", "-a", "-d", "-q")
    git.run("prune", "--expire=now")


def delete(repo: Path) -> None:
    """Removes the repository `repo` and every snapshot in it (never through a symlink)."""
    if repo.is_symlink():
        raise SnapshotError(f"{repo} is a symbolic link; not deleting through it")
    if repo.exists():
        shutil.rmtree(repo)


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
