"""A first snapshot seeded from what the workspace's own git already knows.

A first snapshot must record every file. When the workspace is a git checkout, its `.git/index`
already names the blob of each tracked file together with the stat data the file had when git
last hashed it, and its object store holds those blobs: a file whose stat data still match its
entry need not be read again. This module finds, for the paths a first snapshot records, those
that can be taken from there (`trusted_files`), and copies their blobs into the store's
repository, verified (`copy`).

The workspace is the agent's: everything in its `.git` may be forged. So:

- No git ever runs on the workspace's repository (its config names programs: `core.fsmonitor`,
  hooks). The index is parsed here (`gitindex`); the objects are read by the store's sealed git,
  on its own repository, with an object directory as an alternate for one command only
  (`GIT_ALTERNATE_OBJECT_DIRECTORIES`): nothing of it is left referring to the workspace. Nothing
  in the workspace is written, locked or refreshed (pinning, below, gives its object files a
  second link for the copy's duration: their link count and ctime change, nothing else).
- `.git` must be a real directory at the workspace's root (not a symlink, not a `gitdir:` file),
  its `objects` one too, with no `info/alternates` (which could lead anywhere) and no symlink
  among its directories and pack files. Anything else: nothing is seeded, every file is hashed.
- Only stage-0 entries of regular files and symlinks are used; never a gitlink, a sparse
  directory, an intent-to-add, skip-worktree or assume-unchanged entry. The entry's mode, size,
  mtime, ctime, inode, uid and gid must equal the file's (lstat), and its mtime must be older than
  the index file's (else the entry is "racily clean": the file may have changed since, within the
  same timestamp, as git itself guards against).
- Each blob is copied into the store's repository by `pack-objects | index-pack`: index-pack names
  every object by the hash of its content, so a forged or damaged object cannot land under the id
  the index claims. The blob must be a blob of exactly the file's size. A file whose blob is
  missing, of another kind or size, or did not arrive under its id is hashed from disk.
- The trust decision (`trusted_files`) is what depends on the files; the copy (`copy`) comes
  after, while the agent's turn may already run (`SnapshotStore.take`'s `on_read`), and the agent
  could then swap `.git`, `objects` or `pack` for a link to anywhere (another tenant's repository)
  between any check and git's open. So before the turn the object files are pinned (`pin`):
  hard-linked into a directory of the store's own, each through directory descriptors opened
  without following a link and kept only if a regular file got linked; git reads only that
  directory. Their content is still the agent's, verified object by object as above. Where they
  cannot be pinned (another filesystem, links refused), the copy is made before the turn. A file
  whose blob turns out missing or damaged after the turn began is hashed from disk only if the
  store's watch saw no change to it and its stat data are still those trusted (else the snapshot
  is incomplete, never silently wrong).

What stays trusted is what git itself trusts: a file whose stat data equal its entry's holds that
entry's blob. Someone who can write the workspace can make such an entry (copying a file's stat
data into a forged index) only for a file they could as well have written; the first snapshot then
records that blob for it, as `git status` would report the file clean.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import struct
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import structlog

from agent_rewind.snapshots import gitindex
from agent_rewind.snapshots.errors import GitTimeout, SnapshotError, UnsafePath
from agent_rewind.snapshots.files import MODE_EXECUTABLE, MODE_FILE, MODE_SYMLINK, _open_root
from agent_rewind.snapshots.git import Git
from agent_rewind.snapshots.gitindex import IndexEntry, Stat
from agent_rewind.snapshots.scan import gc_paused

log = structlog.get_logger(__name__)

# An index larger than this is not read (a 100,000-file index is about 10 MB).
MAX_INDEX_BYTES = 512 * 1024 * 1024
# Objects that fail to copy (damaged) are dropped and the copy retried, this many times.
COPY_ATTEMPTS = 4

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_UNUSABLE = gitindex.ASSUME_VALID | gitindex.STAGE_MASK
_UNUSABLE_EXTENDED = gitindex.SKIP_WORKTREE | gitindex.INTENT_TO_ADD
_MODES = {
    gitindex.MODE_FILE: MODE_FILE,
    gitindex.MODE_EXECUTABLE: MODE_EXECUTABLE,
    gitindex.MODE_SYMLINK: MODE_SYMLINK,
}
_OID = re.compile(rb"\b[0-9a-f]{40}\b")


@dataclass(frozen=True, slots=True)  # gremlin: pardon[equivalent] never assigned/hashed; slots: memory only
class Known:
    """A path of the first snapshot: its git mode, blob id, and the stat data to index it with."""

    mode: str
    oid: str
    stat: Stat


class NotSeedable(Exception):
    """The workspace's git cannot be used (the message says why): every file is hashed."""


def git_mode(info: os.stat_result) -> int:
    """The mode git records for a file or symlink with this lstat."""
    if stat.S_ISLNK(info.st_mode):
        return gitindex.MODE_SYMLINK
    return gitindex.MODE_EXECUTABLE if info.st_mode & stat.S_IXUSR else gitindex.MODE_FILE


def trusted_files(
    workspace: Path,
    stats: Mapping[str, os.stat_result],
    index: Future[tuple[dict[str, IndexEntry], int]] | None = None,
) -> dict[str, IndexEntry]:
    """The paths of `stats` (each with its lstat) whose file holds the blob its entry in the
    workspace's index names (`trusted`), with that entry (`known` makes what the snapshot keeps
    of it); {} when the workspace is not a usable git checkout.
    Nothing is copied yet (`copy`). Never raises for the workspace's content. `index`:
    `read_index` of the workspace, started earlier (in a thread, while git lists the workspace)."""
    try:
        entries, index_mtime_ns = index.result() if index is not None else read_index(workspace)
    except (NotSeedable, OSError) as err:
        if str(err):
            log.info("first snapshot not seeded from git", workspace=str(workspace), why=str(err))
        return {}
    get = entries.get
    found: dict[str, IndexEntry] = {}
    for path, info in stats.items():  # once per file: kept lean
        entry = get(path)
        if entry is not None and trusted(entry, info, index_mtime_ns):
            found[path] = entry
    return found


def known(entry: IndexEntry) -> Known:
    """What the snapshot keeps of a trusted entry: its stat data are the file's (`trusted`
    compared them), so the store's index keeps them."""
    return Known(_MODES[entry.stat.mode], entry.oid, entry.stat)


def pin(workspace: Path, into: Path) -> Path | None:
    """The workspace's object files hard-linked into `into` (a directory of the store's own,
    made here, whose object directory is returned): what the blob copy reads once the agent may
    run (`take`'s `on_read`). Each file is linked through directory descriptors opened without
    following a link, and kept only if what was linked is a regular file: a `.git`, `objects` or
    `pack` the agent swaps for a symbolic link afterwards changes nothing of it. (An object
    file's content is still the agent's to change: the copy verifies every object by its id.)
    None when the files cannot be linked (another filesystem, links refused): the caller then
    copies before the agent may run. NotSeedable when the workspace's git is not one to take
    blobs from (a link among its object files, say): nothing is seeded."""
    shutil.rmtree(into, ignore_errors=True)
    with _checked_git(workspace) as dot_git:
        try:
            objects = os.open("objects", _DIR, dir_fd=dot_git)
            try:
                into.mkdir(mode=0o700)
                linked = _link_objects(objects, into)
            finally:
                os.close(objects)
        except BaseException as err:
            shutil.rmtree(into, ignore_errors=True)
            if isinstance(err, OSError):
                log.info("the workspace's objects could not be pinned; they are copied at once", why=str(err))
                return None
            raise
    return into if linked else None


_LOOSE_DIR = re.compile(r"[0-9a-f]{2}")
_LOOSE = re.compile(r"[0-9a-f]{38}")
_PACKED = re.compile(r"pack-[0-9a-f]{40,64}\.(pack|idx|rev)")


def _link_objects(objects: int, into: Path) -> int:
    """Links the loose objects and the packs of the object directory `objects` (a descriptor)
    into `into`; how many files. OSError when one cannot be linked, NotSeedable when what got
    linked is not a regular file."""
    count = 0
    for entry in os.scandir(objects):
        if entry.name == "pack" or _LOOSE_DIR.fullmatch(entry.name):
            try:
                sub = os.open(entry.name, _DIR, dir_fd=objects)
            except OSError as err:
                raise NotSeedable(f".git/objects/{entry.name} is not a directory ({err.strerror})") from None
            try:
                names = _LOOSE if entry.name != "pack" else _PACKED
                target = into / entry.name
                target.mkdir(mode=0o700)
                for item in os.scandir(sub):
                    if not names.fullmatch(item.name):
                        continue
                    linked = target / item.name
                    os.link(item.name, linked, src_dir_fd=sub, follow_symlinks=False)
                    if not stat.S_ISREG(os.lstat(linked).st_mode):
                        raise NotSeedable(f".git/objects/{entry.name}/{item.name} is not a plain file")
                    count += 1
            finally:
                os.close(sub)
    return count


def copy(
    git: Git,
    objects: Path,
    entries: Mapping[str, IndexEntry],
    stats: Mapping[str, os.stat_result],
    deadline: float,
) -> set[str]:
    """Copies the blobs of `entries` (`trusted_files`: each a blob of the size its file had in
    `stats`) from the object directory `objects` (the workspace's objects `pin`ned, or, before
    the agent may run, the workspace's own) into the store's repository, verified; the paths
    whose blob arrived. Nothing when they cannot be copied (logged). GitTimeout past the
    deadline."""
    sizes = {entry.oid: stats[path].st_size for path, entry in entries.items()}
    if not sizes:
        return set()
    try:
        copied = copy_blobs(git, objects, sizes, deadline)
    except GitTimeout:
        raise
    except (SnapshotError, OSError) as err:
        log.warning("first snapshot not seeded: the blobs could not be copied", error=str(err))
        return set()
    return {path for path, entry in entries.items() if entry.oid in copied}


def trusted(entry: IndexEntry, info: os.stat_result, index_mtime_ns: int) -> bool:
    """Whether the entry's blob is what the file holds, by git's own rule: the stat data equal
    (all but the device, as git compares them), and the entry not racily clean. Runs once per
    file of a first snapshot: one comparison of tuples."""
    if entry.flags & _UNUSABLE or entry.extended & _UNUSABLE_EXTENDED:
        return False
    mtime_ns = info.st_mtime_ns
    if mtime_ns >= index_mtime_ns:
        return False
    recorded = entry.stat
    ctime_ns, mode = info.st_ctime_ns, info.st_mode
    return recorded == (
        (ctime_ns // 1_000_000_000) & 0xFFFFFFFF,
        ctime_ns % 1_000_000_000,
        (mtime_ns // 1_000_000_000) & 0xFFFFFFFF,
        mtime_ns % 1_000_000_000,
        recorded.dev,
        info.st_ino & 0xFFFFFFFF,
        gitindex.MODE_SYMLINK
        if stat.S_ISLNK(mode)
        else gitindex.MODE_EXECUTABLE
        if mode & stat.S_IXUSR
        else gitindex.MODE_FILE,
        info.st_uid & 0xFFFFFFFF,
        info.st_gid & 0xFFFFFFFF,
        info.st_size & 0xFFFFFFFF,
    )


def read_index(workspace: Path) -> tuple[dict[str, IndexEntry], int]:
    """The usable entries of the workspace's `.git/index` by path, and the index file's mtime
    (ns). NotSeedable when the workspace has no `.git` of its own we may read."""
    with _checked_git(workspace) as dot_git:
        data, mtime_ns = _read_file(dot_git, "index")
    with gc_paused():
        try:
            parsed = gitindex.parse(data)
        except (gitindex.BadIndex, struct.error, ValueError) as err:
            raise NotSeedable(f".git/index cannot be used: {err}") from err
        encoding, errors = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()  # as fsdecode
        entries = {entry.path.decode(encoding, errors): entry for entry in parsed}
        if len(entries) < len(parsed):  # a path twice: a forged index, trust neither
            seen: set[str] = set()
            for entry in parsed:
                path = entry.path.decode(encoding, errors)
                if path in seen:
                    entries.pop(path, None)
                seen.add(path)
    return entries, mtime_ns


@contextlib.contextmanager
def _checked_git(workspace: Path) -> Iterator[int]:
    """The workspace's `.git` (a descriptor), reached without following a link, its objects
    checked (`_check_objects`). NotSeedable when the workspace has no `.git` of its own to use
    (with no message when it has none at all: not a checkout, nothing to say)."""
    try:
        root = _open_root(workspace)
    except (OSError, UnsafePath) as err:
        raise NotSeedable(f"the workspace cannot be opened: {err}") from err
    try:
        try:
            dot_git = os.open(".git", _DIR, dir_fd=root)
        except FileNotFoundError:
            raise NotSeedable("") from None
        except OSError as err:  # ELOOP (a symlink), ENOTDIR (a `gitdir:` file)
            raise NotSeedable(f".git is not a directory of the workspace ({err.strerror})") from None
        try:
            _check_objects(dot_git)
            yield dot_git
        finally:
            os.close(dot_git)
    finally:
        os.close(root)


def _check_objects(dot_git: int) -> None:
    """`.git/objects` and what git will open in it are plain directories and files, with no
    alternates: nothing leads outside the workspace (when checked: the blobs are verified anyway).
    A linked worktree's `.git` (a `commondir`) is not used either."""
    for name in ("commondir", "objects/info/alternates", "objects/info/http-alternates"):
        try:
            os.lstat(name, dir_fd=dot_git)
        except FileNotFoundError:
            continue
        raise NotSeedable(f".git/{name} exists")
    try:
        objects = os.open("objects", _DIR, dir_fd=dot_git)
    except OSError as err:
        raise NotSeedable(f".git/objects is not a directory ({err.strerror})") from None
    try:
        for entry in os.scandir(objects):
            if entry.is_symlink():
                raise NotSeedable(f".git/objects/{entry.name} is a symbolic link")
        try:
            pack = os.open("pack", _DIR, dir_fd=objects)
        except FileNotFoundError:
            return
        except OSError as err:
            raise NotSeedable(f".git/objects/pack is not a directory ({err.strerror})") from None
        try:
            for entry in os.scandir(pack):
                if not entry.is_file(follow_symlinks=False):
                    raise NotSeedable(f".git/objects/pack/{entry.name} is not a plain file")
        finally:
            os.close(pack)
    finally:
        os.close(objects)


def _read_file(directory: int, name: str) -> tuple[bytes, int]:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory)
    except OSError as err:
        raise NotSeedable(f".git/{name} cannot be read ({err.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotSeedable(f".git/{name} is not a file")
        if info.st_size > MAX_INDEX_BYTES:
            raise NotSeedable(f".git/{name} is over {MAX_INDEX_BYTES} bytes")
        chunks = []
        while chunk := os.read(fd, 1 << 22):
            chunks.append(chunk)
        return b"".join(chunks), info.st_mtime_ns
    except OSError as err:
        if err.errno == errno.EISDIR:
            raise NotSeedable(f".git/{name} is a directory") from None
        raise
    finally:
        os.close(fd)


def copy_blobs(git: Git, objects: Path, sizes: Mapping[str, int], deadline: float) -> set[str]:
    """Copies the blobs of `sizes` (oid -> the size the file has) from the object directory
    `objects` into the store's repository, verified; returns the ids that arrived. A blob absent
    there, not a blob, or of another size is not copied; one damaged is dropped and the copy
    retried without it."""
    reading = git.with_env(GIT_ALTERNATE_OBJECT_DIRECTORIES=quoted(str(objects)))
    listing = b"".join(oid.encode() + b"\n" for oid in sizes)
    out = reading.run("cat-file", "--batch-check", stdin=listing, deadline=deadline)
    wanted: list[str] = []
    for line in out.decode(errors="replace").splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] == "blob" and parts[0] in sizes and int(parts[2]) == sizes[parts[0]]:
            wanted.append(parts[0])
    for _ in range(COPY_ATTEMPTS):
        if not wanted:
            return set()
        try:
            return _pack(git, reading, wanted, deadline)
        except _Damaged as err:
            log.warning("a blob of the workspace's git is damaged; that file is hashed", error=str(err))
            bad = {m.decode() for m in _OID.findall(err.stderr)}
            kept = [oid for oid in wanted if oid not in bad]
            if len(kept) == len(wanted):
                raise SnapshotError(f"copying the blobs failed: {err}") from err
            wanted = kept
    raise SnapshotError("copying the blobs failed: too many damaged objects")


class _Damaged(SnapshotError):
    def __init__(self, stderr: bytes) -> None:
        super().__init__(stderr.decode(errors="replace").strip()[:300])
        self.stderr = stderr


def _pack(git: Git, reading: Git, oids: Sequence[str], deadline: float) -> set[str]:
    """`pack-objects` (reading the alternate) piped into `index-pack` (writing the store's own
    repository, naming each object by its content): the ids of the objects in the new pack."""
    producer = reading.popen_io("pack-objects", "--stdout", "-q", "--window=0")
    assert producer.stdout is not None
    try:
        consumer = git.popen_io("index-pack", "--stdin", stdin=producer.stdout)
    except BaseException:
        reap(producer)
        raise
    producer.stdout.close()  # the consumer reads it now
    producer.stdout = None
    try:
        listing = b"".join(oid.encode() + b"\n" for oid in oids)
        try:
            _, produced_err = producer.communicate(listing, timeout=_left(deadline))
            said, consumed_err = consumer.communicate(timeout=_left(deadline))
        except subprocess.TimeoutExpired as err:
            raise GitTimeout("copying the workspace's blobs ran past the deadline") from err
    finally:
        reap(producer)
        reap(consumer)
    if producer.returncode != 0:
        raise _Damaged(produced_err)
    if consumer.returncode != 0:
        raise SnapshotError(f"git index-pack failed: {consumed_err.decode(errors='replace').strip()[:300]}")
    name = said.decode().split()[-1]
    return pack_ids(git.repo / "objects" / "pack" / f"pack-{name}.idx")


def quoted(path: str) -> str:
    """One entry of GIT_ALTERNATE_OBJECT_DIRECTORIES, C-quoted as git reads it: else a `:` in
    the workspace's path would split it into two directories, one of them anywhere."""
    if any(ord(c) < 0x20 or c == "\x7f" for c in path):
        raise SnapshotError("the workspace's path holds a control character")
    return '"' + path.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _left(deadline: float) -> float:
    return max(0.001, deadline - time.monotonic())


def reap(proc: subprocess.Popen[bytes]) -> None:
    """Kills a process still running and waits for it; closes the pipes left open."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def pack_ids(idx: Path) -> set[str]:
    """The object ids a pack index (version 2, as index-pack writes it) lists."""
    data = idx.read_bytes()
    if data[:8] != b"\xfftOc\x00\x00\x00\x02":
        raise SnapshotError(f"{idx.name} is not a version 2 pack index")
    count = int.from_bytes(data[8 + 255 * 4 : 8 + 256 * 4], "big")
    start = 8 + 256 * 4
    ids = data[start : start + 20 * count]
    return {ids[i : i + 20].hex() for i in range(0, len(ids), 20)}
