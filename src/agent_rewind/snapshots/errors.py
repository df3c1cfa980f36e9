"""Errors of the snapshot store. The caller maps them to the API's reasons (SNAPSHOT_UNAVAILABLE...)."""

from __future__ import annotations


class SnapshotError(Exception):
    """The snapshot repository could not do what was asked."""


class GitFailed(SnapshotError):
    """A git command exited with an error; its stderr is the message."""

    def __init__(self, command: str, code: int, stderr: str) -> None:
        super().__init__(f"git {command} failed ({code}): {stderr.strip()[:500]}")
        self.code = code


class GitTimeout(SnapshotError):
    """A git command ran past the deadline and was killed."""


class UnsafePath(SnapshotError, ValueError):
    """A path that is not a plain relative path inside the workspace, or whose parent is not a
    real directory there (a symbolic link, a file)."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path!r}: {why}")
        self.path = path


class RestoreError(SnapshotError):
    """A restore failed. `rolled_back` says whether every path it had touched was put back to the
    rollback tree's content (True), or whether some could not be (the message names them)."""

    def __init__(self, message: str, *, path: str = "", rolled_back: bool) -> None:
        super().__init__(message)
        self.path = path
        self.rolled_back = rolled_back


SnapshotRestoreError = RestoreError
