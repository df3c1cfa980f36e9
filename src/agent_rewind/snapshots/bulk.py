"""Hashing many files at once into one pack: the files of a first snapshot that nothing knew.

`git update-index --add` writes each blob as a loose object, a file of its own: at 100,000 files
that is most of a first snapshot (about 40 s here, nearly all of it creating files). Here each
file is read once, in a few threads, and its blob appended to one pack (`packs`), which git
checks at the end.

Each path is reached as the store reaches files to restore them (`files`): one component at a
time without following a symlink, so a directory replaced by a link meanwhile is not followed; a
file that vanished is simply not recorded, one that grew past the bound makes the snapshot
incomplete. The stat data kept for the index are the open file's (fstat before reading): a file
changed while it was read has a newer ctime than that, so the next snapshot hashes it again.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agent_rewind.snapshots.errors import GitTimeout
from agent_rewind.snapshots.files import _open_root, read
from agent_rewind.snapshots.gitindex import Stat
from agent_rewind.snapshots.packs import BLOB, PackWriter, encode
from agent_rewind.snapshots.seed import Known, git_mode

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Threads reading and compressing files (the system calls and zlib let each other run), and the
# consecutive paths each is given at a time (one directory's descriptors serve a run).
THREADS = 4
RUN = 512
_MODE_NAMES = {0o100644: "100644", 0o100755: "100755", 0o120000: "120000"}


class _Directories:
    """Descriptors of the directories on the way to the current path, reused while paths come
    in sorted order (all of a directory's paths are then consecutive)."""

    def __init__(self, root: Path) -> None:
        self._chain: list[tuple[str, int]] = [("", _open_root(root))]

    def parent(self, parts: list[str]) -> int:
        depth = 0
        while (
            depth + 1 < len(self._chain) and depth < len(parts) and self._chain[depth + 1][0] == parts[depth]
        ):
            depth += 1
        for _, fd in self._chain[depth + 1 :]:
            os.close(fd)
        del self._chain[depth + 1 :]
        for name in parts[depth:]:
            fd = os.open(name, _DIR, dir_fd=self._chain[-1][1])
            self._chain.append((name, fd))
        return self._chain[-1][1]

    def close(self) -> None:
        for _, fd in self._chain:
            os.close(fd)
        self._chain.clear()


def hash_files(
    pack: PackWriter, workspace: Path, paths: Sequence[str], max_file_bytes: int, deadline: float
) -> tuple[dict[str, Known], list[str]]:
    """Writes the blobs of `paths` into `pack`; what each path is now, and the problems that make
    the snapshot incomplete (a file grown past the bound, unreadable). Files are read and
    compressed by THREADS threads, a run of consecutive paths each; the pack is written here."""
    known: dict[str, Known] = {}
    problems: list[str] = []
    ordered = sorted(paths)
    runs = [ordered[i : i + RUN] for i in range(0, len(ordered), RUN)]
    if not runs:
        return known, problems
    with ThreadPoolExecutor(min(THREADS, len(runs)), thread_name_prefix="snapshot-hash") as pool:
        # A few runs ahead at a time: what is read waits in memory only until it is written.
        for start in range(0, len(runs), 2 * THREADS):
            window = runs[start : start + 2 * THREADS]
            for found, said in pool.map(
                lambda run: _hash_run(workspace, run, max_file_bytes, deadline), window
            ):
                for path, (mode, oid, entry, st) in found.items():
                    pack.append(oid, entry)
                    known[path] = Known(mode, oid, st)
                problems += said
    return known, problems


def _hash_run(
    workspace: Path, paths: Sequence[str], max_file_bytes: int, deadline: float
) -> tuple[dict[str, tuple[str, str, bytes, Stat]], list[str]]:
    if time.monotonic() > deadline:
        raise GitTimeout("the deadline passed while hashing the workspace's files")
    found: dict[str, tuple[str, str, bytes, Stat]] = {}
    problems: list[str] = []
    directories = _Directories(workspace)
    try:
        for path in paths:
            *dirs, name = path.split("/")
            try:
                read_now = read(directories.parent(dirs), name, max_file_bytes)
            except OSError as err:
                if err.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                    continue  # gone, or behind a link now: not recorded
                problems.append(
                    f"file over {max_file_bytes} bytes: {path}"
                    if err.errno == errno.EFBIG
                    else f"{path}: {err.strerror or err}"
                )
                continue
            if read_now is None:
                continue
            info, data = read_now
            mode = git_mode(info)
            oid, entry = encode(BLOB, data)
            found[path] = (_MODE_NAMES[mode], oid, entry, Stat.of(mode, info))
    finally:
        directories.close()
    return found, problems
