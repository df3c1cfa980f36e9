"""The storage reserve (storage/reserve.py): the file that holds its bytes, released when the
state dir's volume is full and made again once it has room, and the admission of turns by the
free space of the volumes a turn writes. The volumes' free space is given (`space` replaced);
a real full volume is tests/integration/test_full_disk.py's."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from agent_rewind.storage import reserve
from agent_rewind.storage.reserve import (
    FULL_BELOW,
    MAX_INTERVAL,
    MIN_INTERVAL,
    RESERVE_NAME,
    Reserve,
    Space,
    VolumeFull,
    interval,
)

MIB = 1 << 20
SIZE = 4 * MIB
TOTAL = 1 << 30


class Volumes:
    """The free bytes `space` reports, by path (the real figure for a path not set)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.free: dict[Path, int] = {}
        real = reserve.space
        monkeypatch.setattr(
            reserve, "space", lambda path: Space(self.free[path], TOTAL) if path in self.free else real(path)
        )


@pytest.fixture
def volumes(monkeypatch: pytest.MonkeyPatch) -> Volumes:
    return Volumes(monkeypatch)


def refusal(made: Reserve, workspace: Path) -> dict[str, str]:
    with pytest.raises(VolumeFull) as err:
        made.admit(workspace)
    assert err.value.reason == "QUOTA_EXCEEDED"
    return err.value.metadata


def test_the_reserve_takes_its_bytes_and_a_whole_one_is_kept_across_starts(tmp_path: Path) -> None:
    first = Reserve(tmp_path, SIZE)
    assert first.make() and first.held
    st = os.stat(tmp_path / RESERVE_NAME)
    assert st.st_size == SIZE and st.st_blocks * 512 >= SIZE, "its blocks are taken, not a hole"
    again = Reserve(tmp_path, SIZE)
    assert again.make()
    assert os.stat(tmp_path / RESERVE_NAME).st_ino == st.st_ino, "not written again"


def test_replicas_sharing_a_state_dir_keep_a_reserve_each(tmp_path: Path) -> None:
    one, two = (Reserve(tmp_path, SIZE, name=f"{RESERVE_NAME}-replica-{i}") for i in (1, 2))
    assert one.make() and two.make()
    one.release()
    assert not one.path.exists() and two.path.stat().st_size == SIZE


def test_another_size_or_one_cut_short_is_made_again(tmp_path: Path) -> None:
    (tmp_path / RESERVE_NAME).write_bytes(b"x" * 100)
    (tmp_path / (RESERVE_NAME + ".new")).write_bytes(b"x" * 100)
    assert Reserve(tmp_path, SIZE).make()
    assert os.stat(tmp_path / RESERVE_NAME).st_size == SIZE
    assert sorted(p.name for p in tmp_path.iterdir()) == [RESERVE_NAME]


@pytest.mark.parametrize("allocation", ["unsupported", "takes nothing"])
def test_where_allocating_takes_no_space_the_bytes_are_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, allocation: str
) -> None:
    """A file system without fallocate, or one that keeps allocated zeros as nothing (a
    compressing one): random bytes, which take their room on any."""

    def allocate(fd: int, offset: int, length: int) -> None:
        if allocation == "unsupported":
            raise OSError(errno.EOPNOTSUPP, "not supported")

    monkeypatch.setattr(os, "posix_fallocate", allocate)
    assert Reserve(tmp_path, SIZE).make()
    data = (tmp_path / RESERVE_NAME).read_bytes()
    assert len(data) == SIZE and data.count(0) < SIZE // 128


def test_without_room_there_is_no_reserve_and_no_turn_starts(tmp_path: Path, volumes: Volumes) -> None:
    volumes.free[tmp_path] = 2 * SIZE - 1
    made = Reserve(tmp_path, SIZE)
    assert not made.make() and not made.held
    assert not (tmp_path / RESERVE_NAME).exists()
    metadata = refusal(made, tmp_path / "ws")
    assert (metadata["limit"], metadata["volume"]) == ("storage_reserve", "state")
    assert metadata["used_bytes"] == str(TOTAL - (2 * SIZE - 1))
    assert metadata["max_bytes"] == str(TOTAL - SIZE)


def test_a_volume_full_while_making_it_leaves_no_part_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int, size: int) -> None:
        os.write(fd, b"part")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(reserve, "_allocate", full)
    made = Reserve(tmp_path, SIZE)
    assert not made.make() and not made.held
    assert list(tmp_path.iterdir()) == []


def test_release_deletes_it_and_says_whether_a_failed_write_may_be_retried(tmp_path: Path) -> None:
    made = Reserve(tmp_path, SIZE)
    made.make()
    assert made.release() and not made.held
    assert not (tmp_path / RESERVE_NAME).exists()
    # Released already (by the watch, just before a write failed): the write is worth retrying.
    assert made.release()
    assert not Reserve(tmp_path, 0).release(), "no reserve: nothing was freed"


def test_the_watch_releases_a_full_volume_and_makes_it_again_with_twice_its_size(
    tmp_path: Path, volumes: Volumes
) -> None:
    made = Reserve(tmp_path, SIZE)
    made.make()
    volumes.free[tmp_path] = FULL_BELOW
    assert made.check() == MIN_INTERVAL and made.held, "nearly full: held, and looked at often"
    volumes.free[tmp_path] = FULL_BELOW - 1
    assert made.check() == MAX_INTERVAL and not made.held
    assert not (tmp_path / RESERVE_NAME).exists()
    volumes.free[tmp_path] = 2 * SIZE - 1
    made.check()
    assert not made.held
    volumes.free[tmp_path] = 2 * SIZE
    made.check()
    assert made.held and os.stat(tmp_path / RESERVE_NAME).st_size == SIZE


def test_the_less_is_free_the_sooner_the_next_look() -> None:
    assert interval(0) == interval(FULL_BELOW) == MIN_INTERVAL
    assert interval(1 << 40) == MAX_INTERVAL
    assert MIN_INTERVAL < interval(reserve.FILL_RATE // 4) == 0.25 < MAX_INTERVAL


def test_turns_start_while_the_volumes_have_room_beyond_the_reserve(tmp_path: Path, volumes: Volumes) -> None:
    made = Reserve(tmp_path, SIZE)
    made.make()
    volumes.free[tmp_path] = SIZE
    made.admit(tmp_path / "ws")
    volumes.free[tmp_path] = SIZE - 1
    made.admit(tmp_path / "ws")  # on the last look: no file system call for a turn that may start
    made.check()
    assert refusal(made, tmp_path / "ws")["volume"] == "state"
    volumes.free[tmp_path] = TOTAL
    made.admit(tmp_path / "ws")  # freed: a fresh look, not the last one
    made.release()
    assert refusal(made, tmp_path / "ws")["volume"] == "state", "released: refused, however much is free"


def test_a_workspace_on_a_volume_of_its_own_is_admitted_by_that_volume(
    tmp_path: Path, volumes: Volumes, monkeypatch: pytest.MonkeyPatch
) -> None:
    state, roots = tmp_path / "state", tmp_path / "roots"
    (state / "workspaces").mkdir(parents=True)
    roots.mkdir()
    real_stat = os.stat

    def stat(path: Path, **kw: bool) -> os.stat_result:
        """The roots on a device of their own, as a volume of their own is."""
        found = real_stat(path, **kw)
        if Path(path) != roots:
            return found
        return os.stat_result((*found[:2], found.st_dev + 1, *found[3:]))

    monkeypatch.setattr(os, "stat", stat)
    made = Reserve(state, SIZE, workspace_roots=(roots, state / "workspaces"))
    made.make()
    volumes.free[roots] = 0
    metadata = refusal(made, roots / "alice" / "one")
    assert (metadata["volume"], metadata["used_bytes"], metadata["max_bytes"]) == (
        "workspace",
        str(TOTAL),
        str(TOTAL - SIZE),
    )
    made.admit(state / "workspaces" / "alice" / "two")  # under the state dir: its volume only
    volumes.free[roots] = SIZE
    made.admit(roots / "alice" / "one")


def test_with_no_reserve_nothing_is_refused_or_made(tmp_path: Path, volumes: Volumes) -> None:
    volumes.free[tmp_path] = 0
    made = Reserve(tmp_path, 0)
    assert not made.make()
    made.admit(tmp_path / "ws")
    assert list(tmp_path.iterdir()) == []
