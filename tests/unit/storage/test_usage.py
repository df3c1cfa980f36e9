"""Measuring what a session holds (storage/usage.py): what a walk counts, and how the book
measures, records and judges the limits, on a real ledger."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent_rewind.errors import StorageQuotaExceeded
from agent_rewind.storage.usage import Limits, Places, UsageBook, measure, tree_bytes
from agent_rewind.store.ledger import NewSession
from agent_rewind.store.sqlite import SqliteLedger


def _blocks(path: Path) -> int:
    return os.lstat(path).st_blocks * 512


def test_a_walk_counts_blocks_once_per_file_and_follows_no_link(tmp_path: Path) -> None:
    work = tmp_path / "ws"
    (work / "d").mkdir(parents=True)
    (work / "d" / "a.bin").write_bytes(os.urandom(100_000))
    os.link(work / "d" / "a.bin", work / "hard.bin")  # the same blocks, twice named
    (tmp_path / "outside.bin").write_bytes(os.urandom(300_000))
    os.symlink(tmp_path / "outside.bin", work / "link")
    os.symlink(tmp_path, work / "dirlink")
    expected = sum(
        _blocks(p) for p in (work, work / "d", work / "d" / "a.bin", work / "link", work / "dirlink")
    )
    assert tree_bytes(work) == expected
    assert 100_000 <= tree_bytes(work) < 300_000, "neither the link's target nor the hard link again"


def test_what_is_not_there_holds_nothing(tmp_path: Path) -> None:
    assert tree_bytes(tmp_path / "missing") == 0
    (tmp_path / "f").write_bytes(b"x" * 10_000)
    assert measure(Places(tmp_path / "missing", (tmp_path / "f", tmp_path / "gone"))) == (
        0,
        _blocks(tmp_path / "f"),
    )


@pytest.fixture
async def book(tmp_path: Path) -> AsyncIterator[tuple[UsageBook, SqliteLedger, Path]]:
    ledger = await SqliteLedger.open(tmp_path / "ledger.sqlite3")
    for sid in ("s-1", "s-2"):
        await ledger.add_session(NewSession(session_id=sid, cwd=f"/ws/{sid}", options={}, checkpointing=True))
    work = tmp_path / "ws"
    work.mkdir()
    usage = UsageBook(ledger, Limits(session=200_000, principal=300_000))
    yield usage, ledger, work
    usage.close()


async def test_a_session_over_its_limit_is_measured_again_before_it_is_refused(
    book: tuple[UsageBook, SqliteLedger, Path],
) -> None:
    usage, ledger, work = book
    usage.track("s-1", "alice", Places(work, ()))
    (work / "big").write_bytes(os.urandom(250_000))
    usage.changed("s-1")
    with pytest.raises(StorageQuotaExceeded) as caught:
        await usage.admit("s-1", "alice")  # waits for the measurement under way
    assert caught.value.metadata["limit"] == "session_storage"
    (work / "big").unlink()  # freed, and no one told the book: the refusal measures first
    await usage.admit("s-1", "alice")
    record = await ledger.usage("s-1")
    assert record is not None and record.workspace_bytes < 200_000
    await ledger.close()


async def test_the_principal_limit_sums_its_sessions_in_the_ledger(
    book: tuple[UsageBook, SqliteLedger, Path],
) -> None:
    usage, ledger, work = book
    other = work.parent / "other"
    other.mkdir()
    (work / "a").write_bytes(os.urandom(160_000))
    (other / "b").write_bytes(os.urandom(160_000))
    usage.track("s-1", "alice", Places(work, ()))
    usage.track("s-2", "alice", Places(other, ()))
    with pytest.raises(StorageQuotaExceeded) as caught:
        await usage.admit("s-1", "alice")
    assert caught.value.metadata["limit"] == "principal_storage"
    usage.forget("s-2")  # another replica's now: its figure in the ledger still counts
    with pytest.raises(StorageQuotaExceeded):
        await usage.admit("s-1", "alice")
    await ledger.close()


async def test_changes_while_a_measurement_runs_measure_once_more_after_it(
    book: tuple[UsageBook, SqliteLedger, Path],
) -> None:
    usage, ledger, work = book
    usage.track("s-1", "alice", Places(work, ()))
    for _ in range(5):
        usage.changed("s-1")
    (work / "late").write_bytes(os.urandom(50_000))
    usage.changed("s-1")
    for _ in range(100):
        await asyncio.sleep(0.01)
        record = await ledger.usage("s-1")
        if record is not None and record.workspace_bytes >= 50_000:
            break
    assert record is not None and record.workspace_bytes >= 50_000
    await ledger.close()
