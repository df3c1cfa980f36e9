"""Seeing what a files rewind from the CLI's checkpoints changed (rewind/checkpoints.py), on real
files: what is read before and after, and what makes the CLI's dry run plan it instead."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from agent_rewind.rewind import checkpoints


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
