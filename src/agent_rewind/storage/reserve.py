"""Space kept for what the service must write when a workspace fills the volume it shares with
the state dir (`--storage-reserve`), and the check that starts no turn on a full volume.

With workspaces on a volume of their own (`--workspace-root` elsewhere; deploy/ does this), an
agent that fills its workspace fills only that volume: the ledger, the transcripts and the
rewind intents are written as before, and only turns, which write workspaces, wait for space.
When they share one (the default, `workspaces/` in the state dir, as `make run` has it), nothing
stops an agent's command from writing until the volume is full, and then nothing of the service
can be written either. So, on the state dir's volume:

- the reserve: a file of `size` bytes in the state dir, `storage-reserve`, its blocks really
  taken (allocated, or written with incompressible bytes where allocating takes nothing: a
  compressing file system keeps zeros as nothing). While it is held, the volume is full for
  everyone `size` bytes early;
- released (deleted) as soon as the volume is full: `watch` looks at the free space (one
  statvfs, more often the less there is), and the ledger calls `release` when a write fails for
  want of space, then retries it. What it frees is what the writes in flight (a turn's record, the
  transcripts of the turns running, a rewind's intent) and the rewinds and deletions that free
  space are written with;
- while it is released, and while the volume a turn would write (the state dir's, the session's
  workspace's) has less than `size` free, no turn or fork starts (`admit`): `VolumeFull`,
  RESOURCE_EXHAUSTED with the reason and metadata of the storage limits. What runs finishes;
  reads, rewinds, undos and deletions are never refused: they are how space comes back;
- made again once the volume has twice `size` free, so that, made, it leaves `size` free and
  turns start again.

What it cannot do: a command that goes on writing after the release takes what was freed, and a
write that comes between the volume filling and the release (at most 10 ms) fails: a CLI's
transcript line written at that moment may be cut short. The ledger's writes do not wait for a
look: the first one that fails releases the reserve itself. Only a volume of its own keeps a
workspace from the state dir's space for certain.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import structlog

from agent_rewind.errors import AgentRewindError

log = structlog.get_logger(__name__)

RESERVE_NAME = "storage-reserve"
# Free space under this on the state dir's volume is a full volume: the reserve is released. (A
# command that filled it left less than a block; a few writes of a turn's record need more.)
FULL_BELOW = 256 << 10
# How often the free space is looked at: as often as a writer this fast could use up what is
# free (dd on a tmpfs here: 2.8 GB/s), between these bounds. Once a second on a roomy volume; near
# full, every 10 ms, so that the reserve is released before the CLI's next batch of transcript
# lines (tens of milliseconds after the command that filled the volume ended; measured in
# tests/integration/test_full_disk.py).
FILL_RATE = 4 << 30
MIN_INTERVAL, MAX_INTERVAL = 0.01, 1.0
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Space:
    """A volume's free and total bytes, as an unprivileged writer sees them (statvfs)."""

    free: int
    total: int


def interval(free: int) -> float:
    """Seconds until the next look at a volume with `free` bytes free."""
    return min(MAX_INTERVAL, max(MIN_INTERVAL, free / FILL_RATE))


def space(path: Path) -> Space:
    st = os.statvfs(path)
    return Space(free=st.f_bavail * st.f_frsize, total=st.f_blocks * st.f_frsize)


class VolumeFull(AgentRewindError):
    """A turn (or fork) not started: the volume it would write has less free than the reserve.
    The reason and metadata of the storage limits (API.md, "Storage"), `limit`
    `storage_reserve`, and `volume`: `state` or `workspace`. Retryable once space is freed."""

    reason = "QUOTA_EXCEEDED"

    def __init__(self, volume: str, free: int, total: int, reserve: int) -> None:
        what = (
            f"the server's state volume is full: it keeps its last {reserve} bytes for the ledger "
            "and the transcripts"
            if volume == "state"
            else f"the workspace's volume has {free} bytes free, less than {reserve}"
        )
        super().__init__(
            f"{what}; no turn starts until space is freed (DeleteSession, a rewind, files deleted): "
            "reads, rewinds and deletions go on",
            metadata={
                "limit": "storage_reserve",
                "volume": volume,
                "used_bytes": str(total - free),
                "max_bytes": str(max(total - reserve, 0)),
            },
        )


class Reserve:
    """The reserve of `size` bytes in `state_dir` (0: none, and no turn is refused for space),
    and the free space of the volumes of `state_dir` and of `workspace_roots` (which exist).
    `name`: the file's, one per replica where replicas share the state dir (`--shared-storage`)."""

    def __init__(
        self, state_dir: Path, size: int, workspace_roots: Iterable[Path] = (), name: str = RESERVE_NAME
    ) -> None:
        self.path = state_dir / name
        self.size = size
        self._state_dir = state_dir
        device = os.stat(state_dir).st_dev
        # The roots on volumes of their own: what a turn's workspace is looked at by.
        self._roots = tuple(root for root in workspace_roots if os.stat(root).st_dev != device)
        # The last look at each volume (the state dir, the roots): a turn is admitted on it, and
        # refused only after a fresh look.
        self._seen: dict[Path, Space] = {}
        # make() runs in a thread (a look), release() in the ledger's (a write that failed).
        self._lock = threading.Lock()
        self.held = False

    def make(self) -> bool:
        """Holds the reserve if the volume has room for it and `size` more (a whole one left by
        an earlier run is kept); whether it is held."""
        if self.size == 0:
            return False
        with self._lock:
            if self.held or self._whole():
                self.held = True
                return True
            partial = self.path.with_name(self.path.name + ".new")
            for stale in (self.path, partial):  # another size, or cut short
                stale.unlink(missing_ok=True)
            if space(self._state_dir).free < 2 * self.size:
                return False
            try:
                with open(partial, "wb") as out:
                    _allocate(out.fileno(), self.size)
                os.replace(partial, self.path)
            except OSError as err:
                partial.unlink(missing_ok=True)
                if err.errno in (errno.ENOSPC, errno.EDQUOT):  # taken meanwhile
                    return False
                raise
            self.held = True
        log.info("storage reserve held", path=str(self.path), bytes=self.size)
        return True

    def release(self) -> bool:
        """Deletes the reserve, so that what must be written now can be. Whether a write that
        found the volume full may be tried again: there is a reserve, released now or already
        (a write may fail just before the watch releases it)."""
        with self._lock:
            if not self.held:
                return self.size > 0
            self.held = False
            self.path.unlink(missing_ok=True)
        log.warning(
            "state volume full: storage reserve released for the service's own writes; no turn "
            "starts until it can be made again",
            bytes=self.size,
            needs_free=2 * self.size,
        )
        return True

    def admit(self, workspace: Path) -> None:
        """Raises VolumeFull when a turn in `workspace` may not start for want of space: the
        reserve released, or less than `size` free on the state dir's volume or the workspace's.
        Nothing is asked of the file system unless the last look says to refuse."""
        if self.size == 0:
            return
        volumes = [("state", self._state_dir)]
        volumes += [("workspace", root) for root in self._roots if workspace.is_relative_to(root)][:1]
        for volume, path in volumes:
            seen = self._seen.get(path)
            if seen is None or seen.free < self.size or (volume == "state" and not self.held):
                seen = self._seen[path] = space(path)
            if seen.free < self.size or (volume == "state" and not self.held):
                raise VolumeFull(volume, seen.free, seen.total, self.size)

    def check(self) -> float:
        """One look at the volumes: the reserve released when the state dir's is full, made
        again once it has room. Seconds until the next look: while the reserve is held, the less
        is free the sooner (it must be released before the CLIs write again); else a second."""
        for root in self._roots:
            self._seen[root] = space(root)
        state = self._seen[self._state_dir] = space(self._state_dir)
        if self.held and state.free < FULL_BELOW:
            self.release()
        elif not self.held and state.free >= 2 * self.size:
            self.make()
        return interval(state.free) if self.held else MAX_INTERVAL

    async def watch(self) -> None:
        """Looks until cancelled."""
        if self.size == 0:
            return
        while True:
            try:
                wait = await asyncio.to_thread(self.check)
            except OSError as err:  # an I/O error: said, and looked at again in a while
                log.warning("storage reserve: could not look at the state volume", error=str(err))
                wait = MAX_INTERVAL
            await asyncio.sleep(wait)

    def _whole(self) -> bool:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        return st.st_size == self.size and st.st_blocks * 512 >= self.size


def _allocate(fd: int, size: int) -> None:
    """Takes `size` bytes of the volume for the file `fd`: allocated (at once, no data written),
    else written with random bytes; synced."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as err:
        if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
    if os.fstat(fd).st_blocks * 512 < size:
        os.lseek(fd, 0, os.SEEK_SET)
        left = size
        while left:
            left -= os.write(fd, os.urandom(min(left, _CHUNK)))
    os.fsync(fd)
