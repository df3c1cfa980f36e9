"""Workspace snapshots on git's object store (see `store` for what they hold and why)."""

from agent_rewind.snapshots.errors import (
    GitFailed,
    GitTimeout,
    RestoreError,
    SnapshotError,
    SnapshotRestoreError,
    UnsafePath,
)
from agent_rewind.snapshots.git import EMPTY_TREE
from agent_rewind.snapshots.store import (
    DEFAULT_DIFF_BYTES,
    Change,
    ChangeKind,
    FileDiff,
    Limits,
    Snapshot,
    SnapshotStore,
    directory_bytes,
)

__all__ = [
    "DEFAULT_DIFF_BYTES",
    "EMPTY_TREE",
    "Change",
    "ChangeKind",
    "FileDiff",
    "GitFailed",
    "GitTimeout",
    "Limits",
    "RestoreError",
    "Snapshot",
    "SnapshotError",
    "SnapshotRestoreError",
    "SnapshotStore",
    "UnsafePath",
    "directory_bytes",
]
