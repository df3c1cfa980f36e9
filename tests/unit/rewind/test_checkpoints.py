"""Seeing what a files rewind from the CLI's checkpoints changed (rewind/checkpoints.py), on real
files: what is read before and after, and what makes the CLI's dry run plan it instead."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from structlog.testing import capture_logs

from agent_rewind.rewind import checkpoints
from agent_rewind.snapshots import files


def _view(*paths: str) -> Any:
    return SimpleNamespace(tracked_files=set(paths))


def test_the_tracked_files_are_named_inside_the_workspace(tmp_path: Path) -> None:
    assert checkpoints.tracked(_view("b.txt", "src/a.py", f"{tmp_path}/c.txt"), tmp_path) == [
        "b.txt", "c.txt", "src/a.py"
    ]  # fmt: skip


def test_a_tracked_file_outside_the_workspace_or_too_many_leave_it_to_the_cli(tmp_path: Path) -> None:
    assert checkpoints.tracked(_view("../elsewhere.txt"), tmp_path) is None
    assert checkpoints.tracked(_view("/etc/passwd"), tmp_path) is None
    many = [f"f{i}.txt" for i in range(checkpoints.MAX_LOOKED_AT + 1)]
    assert checkpoints.tracked(_view(*many), tmp_path) is None


def test_what_changed_is_seen_with_its_lines(tmp_path: Path) -> None:
    (tmp_path / "kept.txt").write_text("same\n")
    (tmp_path / "edited.txt").write_text("one\ntwo\n")
    (tmp_path / "made.txt").write_text("new\nlines\n")
    before = checkpoints.look(tmp_path, ["kept.txt", "edited.txt", "made.txt", "gone.txt"])
    assert before is not None and before["gone.txt"] is None
    (tmp_path / "edited.txt").write_text("one\n2\n")
    (tmp_path / "made.txt").unlink()
    (tmp_path / "gone.txt").write_text("back\n")
    assert checkpoints.seen(tmp_path, before) == (
        tuple(str(tmp_path / n) for n in ("edited.txt", "made.txt", "gone.txt")), 2, 3
    )  # fmt: skip


def test_nothing_is_read_through_a_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("a\nb\nc\n")
    work = tmp_path / "work"
    work.mkdir()
    (work / "link.txt").symlink_to(outside / "secret.txt")
    (work / "dir").symlink_to(outside)
    before = checkpoints.look(work, ["link.txt", "dir/secret.txt"])
    assert before == {"link.txt": ("120000", str(outside / "secret.txt").encode()), "dir/secret.txt": None}
    (work / "link.txt").unlink()
    changed, insertions, deletions = checkpoints.seen(work, before) or ((), -1, -1)
    assert changed == (str(work / "link.txt"),) and (insertions, deletions) == (0, 0), "a link has no lines"


def test_files_too_big_to_look_at_leave_it_to_the_cli(tmp_path: Path) -> None:
    half = checkpoints.MAX_LOOKED_AT_BYTES // 2 + 1
    (tmp_path / "a.bin").write_bytes(b"a" * half)
    (tmp_path / "b.bin").write_bytes(b"b" * half)
    assert checkpoints.look(tmp_path, ["a.bin"]) is not None
    assert checkpoints.look(tmp_path, ["a.bin", "b.bin"]) is None


def test_a_fix_never_waits_on_a_fifo_or_reads_through_a_link(tmp_path: Path) -> None:
    """The issue's freeze: a FIFO planted at a path a rewind puts right blocked the event loop in
    open(); a link on the way led the write outside."""
    work, history, outside = tmp_path / "work", tmp_path / "history", tmp_path / "outside"
    for d in (work, history, outside):
        d.mkdir()
    (history / "b@v1").write_text("before\n")
    os.mkfifo(work / "made.txt")
    os.mkfifo(work / "kept.txt")
    (work / "dir").symlink_to(outside)
    fixes = [
        checkpoints.Fix(work / "made.txt", "made.txt", None),
        checkpoints.Fix(work / "kept.txt", "kept.txt", history / "b@v1"),
        checkpoints.Fix(work / "dir" / "x.txt", "dir/x.txt", history / "b@v1"),
    ]
    done = ThreadPoolExecutor(1).submit(
        lambda: (checkpoints.needed(fixes, work), checkpoints.apply(fixes, work))
    )
    needed, _ = done.result(timeout=10)
    assert [f.relative for f in needed] == ["made.txt", "kept.txt", "dir/x.txt"]
    assert not (work / "made.txt").exists()
    assert (work / "kept.txt").read_text() == "before\n"
    assert list(outside.iterdir()) == [], "nothing written through the link"
    assert checkpoints.needed(fixes, work) == [fixes[2]]


def test_a_fix_compares_a_huge_file_by_its_size_without_reading_it(tmp_path: Path) -> None:
    work, history = tmp_path / "work", tmp_path / "history"
    work.mkdir()
    history.mkdir()
    (history / "b@v1").write_text("before\n")
    with (work / "big.bin").open("wb") as f:
        f.truncate(8 << 30)  # sparse: nothing on disk
    fix = checkpoints.Fix(work / "big.bin", "big.bin", history / "b@v1")
    assert checkpoints.needed([fix], work) == [fix]
    checkpoints.apply([fix], work)
    assert (work / "big.bin").read_text() == "before\n"


def test_a_backup_that_is_not_a_plain_file_name_or_a_regular_file_is_not_restored(tmp_path: Path) -> None:
    work, history = tmp_path / "work", tmp_path / "history"
    work.mkdir()
    history.mkdir()
    (history / "link@v1").symlink_to("/etc/passwd")
    view = SimpleNamespace(
        files_before=lambda point: {"a.txt": "link@v1", "b.txt": "../../etc/passwd", "c.txt": None}
    )
    fixes = checkpoints.planned(view, None, work, history)  # type: ignore[arg-type]
    assert [(f.relative, f.backup) for f in fixes] == [("c.txt", None)]


def test_a_file_that_grows_while_read_is_read_no_further_than_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its size as fstat saw it, then more: what was read on was unbounded before."""
    (tmp_path / "a.txt").write_bytes(b"x" * (8 << 20))
    real = os.fstat

    def small(fd: int) -> os.stat_result:
        info = real(fd)
        return os.stat_result((info.st_mode, *info[1:6], 10, *info[7:]))

    read = []
    real_read = os.read

    def counted(fd: int, n: int) -> bytes:
        data = real_read(fd, n)
        read.append(len(data))
        return data

    monkeypatch.setattr(files.os, "fstat", small)
    monkeypatch.setattr(files.os, "read", counted)
    with files.Workspace(tmp_path) as ws, pytest.raises(OSError, match="over"):
        ws.content("a.txt", 1 << 20)
    assert sum(read) <= (1 << 20) + 1


def test_a_tracked_path_outside_the_workspace_is_never_put_right(tmp_path: Path) -> None:
    """The slip of issue 37: a tracked path outside the workspace written or deleted anyway."""
    work, history, outside = tmp_path / "work", tmp_path / "history", tmp_path / "outside"
    for d in (work, history, outside):
        d.mkdir()
    (history / "b@v1").write_text("before\n")
    (outside / "kept.txt").write_text("outside's\n")
    view = SimpleNamespace(
        files_before=lambda point: {
            "../outside/kept.txt": None,
            str(outside / "new.txt"): "b@v1",
            "inside.txt": "b@v1",
            ".": None,
        }
    )
    fixes = checkpoints.planned(view, None, work, history)  # type: ignore[arg-type]
    assert [f.relative for f in fixes] == ["inside.txt"]
    checkpoints.apply(fixes, work)
    assert sorted(p.name for p in outside.iterdir()) == ["kept.txt"]
    assert (outside / "kept.txt").read_text() == "outside's\n"


def _fixed(tmp_path: Path, ours: bytes, before: bytes) -> tuple[Path, checkpoints.Fix]:
    work, history = tmp_path / "work", tmp_path / "history"
    work.mkdir(exist_ok=True)
    history.mkdir(exist_ok=True)
    (history / "b@v1").write_bytes(before)
    (work / "f.bin").write_bytes(ours)
    return work, checkpoints.Fix(work / "f.bin", "f.bin", history / "b@v1")


@pytest.mark.parametrize(
    ("ours", "before", "needed"),
    [
        (b"same\n", b"same\n", False),
        (b"abcd\n", b"abce\n", True),  # the same size, another content
        (b"x" * (3 << 20) + b"1", b"x" * (3 << 20) + b"2", True),  # differs past the first chunks
        (b"x" * (3 << 20), b"x" * (3 << 20), False),
        (b"short\n", b"longer\n", True),
    ],
)
def test_a_file_is_put_right_unless_it_holds_exactly_the_backup(
    tmp_path: Path, ours: bytes, before: bytes, needed: bool
) -> None:
    work, fix = _fixed(tmp_path, ours, before)
    assert checkpoints.needed([fix], work) == ([fix] if needed else [])
    checkpoints.apply([fix], work)
    assert (work / "f.bin").read_bytes() == before


def test_a_backup_up_to_the_bound_is_restored_and_one_past_it_left(tmp_path: Path) -> None:
    """Sparse backups: their size is all that is looked at before a restore streams them."""
    work, history = tmp_path / "work", tmp_path / "history"
    work.mkdir()
    history.mkdir()
    for name, size in (("at@v1", checkpoints.MAX_FIX_BYTES), ("past@v1", checkpoints.MAX_FIX_BYTES + 1)):
        with (history / name).open("wb") as f:
            f.truncate(size)
    view = SimpleNamespace(files_before=lambda point: {"at.bin": "at@v1", "past.bin": "past@v1"})
    fixes = checkpoints.planned(view, None, work, history)  # type: ignore[arg-type]
    assert [f.relative for f in fixes] == ["at.bin"]


def test_a_backup_that_is_no_longer_a_regular_file_is_needed_and_left_as_it_is(tmp_path: Path) -> None:
    work, fix = _fixed(tmp_path, b"ours\n", b"before\n")
    assert fix.backup is not None
    fix.backup.unlink()
    os.mkfifo(fix.backup)  # swapped after the plan
    assert checkpoints.needed([fix], work) == [fix]
    with capture_logs() as logged:
        checkpoints.apply([fix], work)  # logged, not raised, and nothing waits on the FIFO
    assert (work / "f.bin").read_bytes() == b"ours\n"
    [error] = [e for e in logged if e["log_level"] == "error"]
    assert error["error"] == "the backup b@v1 is not a regular file", "the log says why"


def test_exactly_as_many_tracked_files_as_may_be_looked_at_are_looked_at(tmp_path: Path) -> None:
    names = [f"f{i}.txt" for i in range(checkpoints.MAX_LOOKED_AT)]
    assert checkpoints.tracked(_view(*names), tmp_path) == sorted(names)


@pytest.mark.parametrize("name", [".", "..", "a/b", "/etc/passwd"])
def test_a_backup_name_that_is_not_one_file_name_is_never_read(tmp_path: Path, name: str) -> None:
    work, history = tmp_path / "work", tmp_path / "history"
    (history / "a").mkdir(parents=True)
    work.mkdir()
    (history / "a" / "b").write_text("a file a path would reach\n")
    view = SimpleNamespace(files_before=lambda point: {"x.txt": name})
    assert checkpoints.planned(view, None, work, history) == []  # type: ignore[arg-type]


def test_a_restored_backup_keeps_its_executable_bit(tmp_path: Path) -> None:
    work, fix = _fixed(tmp_path, b"#!/bin/sh\necho new\n", b"#!/bin/sh\necho old\n")
    assert fix.backup is not None
    fix.backup.chmod(0o755)
    checkpoints.apply([fix], work)
    assert (work / "f.bin").stat().st_mode & 0o100


def test_a_backup_that_grew_past_the_bound_since_the_plan_is_left_and_one_at_it_restored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`apply` checks the bound again on the backup it opens (here made 7 bytes): one of exactly
    7 bytes is restored; one that grew to 8 after the plan is left as the CLI's restore left it."""
    monkeypatch.setattr(checkpoints, "MAX_FIX_BYTES", 7)
    work, at = _fixed(tmp_path, b"ours\n", b"1234567")
    history = tmp_path / "history"
    (history / "past@v1").write_bytes(b"12345678")
    (work / "past.bin").write_bytes(b"ours\n")
    past = checkpoints.Fix(work / "past.bin", "past.bin", history / "past@v1")
    checkpoints.apply([at, past], work)
    assert (work / "f.bin").read_bytes() == b"1234567"
    assert (work / "past.bin").read_bytes() == b"ours\n"


def test_a_workspace_that_cannot_be_read_needs_no_fix(tmp_path: Path) -> None:
    """Gone (or not a directory): no fix is planned, and the rewind's plan goes on with the CLI's
    own list (an empty list, not an error)."""
    work, fix = _fixed(tmp_path, b"ours\n", b"before\n")
    assert checkpoints.needed([fix], tmp_path / "gone") == []
    assert checkpoints.needed([fix], work / "f.bin") == []


# A rewind narrowed to some paths: the service writes them from the CLI's backups itself.


def _narrowing(tmp_path: Path) -> tuple[Path, Path, SimpleNamespace]:
    work, history = tmp_path / "work", tmp_path / "history"
    for d in (work / "src", history):
        d.mkdir(parents=True)
    (history / "a@v1").write_text("a before\n")
    (history / "x@v1").write_text("x before\none\n")
    (work / "a.txt").write_text("a now\n")
    (work / "src" / "x.py").write_text("x now\n")
    (work / "src" / "new.py").write_text("made later\n")
    (work / "b.txt").write_text("b now\n")
    view = SimpleNamespace(
        checkpoint_files=lambda point: {
            "a.txt": "a@v1",
            "src/x.py": "x@v1",
            "src/new.py": None,
            "b.txt": "a@v1",
            "../escape.txt": None,
        }
    )
    return work, history, view


def test_a_narrowed_rewind_restores_only_the_chosen_files_from_the_backups(tmp_path: Path) -> None:
    work, history, view = _narrowing(tmp_path)
    fixes = checkpoints.chosen(view, None, work, history, ("src", "a.txt"))  # type: ignore[arg-type]
    assert sorted(f.relative for f in fixes) == ["a.txt", "src/new.py", "src/x.py"]
    planned = checkpoints.narrowed(fixes, work)
    assert sorted(f.relative for f in planned.fixes) == ["a.txt", "src/new.py", "src/x.py"]
    # a.txt: 1 line for 1; x.py: 2 for 1; new.py: 1 line removed.
    assert (planned.insertions, planned.deletions, planned.skipped_links) == (3, 3, 0)
    checkpoints.apply_narrowed(list(planned.fixes), work)
    assert (work / "a.txt").read_text() == "a before\n"
    assert (work / "src" / "x.py").read_text() == "x before\none\n"
    assert not (work / "src" / "new.py").exists()
    assert (work / "b.txt").read_text() == "b now\n", "not chosen: kept"
    # Done: nothing is needed again.
    assert checkpoints.narrowed(fixes, work).fixes == ()


def test_a_narrowed_rewind_leaves_a_link_as_the_cli_s_restore_does_and_counts_it(tmp_path: Path) -> None:
    work, history, view = _narrowing(tmp_path)
    (work / "a.txt").unlink()
    (tmp_path / "elsewhere.txt").write_text("not the workspace's\n")
    os.symlink(tmp_path / "elsewhere.txt", work / "a.txt")
    fixes = checkpoints.chosen(view, None, work, history, ("a.txt",))  # type: ignore[arg-type]
    planned = checkpoints.narrowed(fixes, work)
    assert (planned.fixes, planned.skipped_links) == ((), 1)
    checkpoints.apply_narrowed(fixes, work)
    assert (work / "a.txt").is_symlink()
    assert (tmp_path / "elsewhere.txt").read_text() == "not the workspace's\n"


def test_a_narrowed_rewind_too_big_to_count_counts_no_lines(tmp_path: Path) -> None:
    work, history, view = _narrowing(tmp_path)
    (history / "a@v1").write_bytes(b"line\n" * (checkpoints.MAX_LOOKED_AT_BYTES // 5 + 1))
    fixes = checkpoints.chosen(view, None, work, history, ("a.txt", "src/x.py"))  # type: ignore[arg-type]
    planned = checkpoints.narrowed(fixes, work)
    assert len(planned.fixes) == 2
    assert (planned.insertions, planned.deletions) == (0, 0), "a partial count is not told"


@pytest.mark.parametrize("over", [0, 1])
def test_a_narrowed_rewind_counts_lines_up_to_exactly_the_bound_in_all(tmp_path: Path, over: int) -> None:
    """The files now and their backups, together, may be MAX_LOOKED_AT_BYTES: counted exactly;
    one byte more (in the last backup read) and no line is told."""
    work, history = tmp_path / "work", tmp_path / "history"
    work.mkdir()
    history.mkdir()
    rest = checkpoints.MAX_LOOKED_AT_BYTES - 700_000
    (work / "a.txt").write_bytes(b"x\n" * 100_000)
    (history / "a@v1").write_bytes(b"x\n" * 150_000)
    (work / "b.txt").write_bytes(b"y\n" * 100_000)
    (history / "b@v1").write_bytes(b"y\n" * (rest // 2) + b"z" * over)
    fixes = [
        checkpoints.Fix(work / "a.txt", "a.txt", history / "a@v1"),
        checkpoints.Fix(work / "b.txt", "b.txt", history / "b@v1"),
    ]
    planned = checkpoints.narrowed(fixes, work)
    assert len(planned.fixes) == 2
    expected = (0, 0) if over else (50_000 + rest // 2 - 100_000, 0)
    assert (planned.insertions, planned.deletions) == expected
