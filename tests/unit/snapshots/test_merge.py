"""A revert of one turn's changes by a three-way merge of snapshot trees (snapshots/merge.py),
with real git: each kind of path the turn changed, each kind of change since, and the workspace
left untouched (a revert only writes objects; the rewind's restore writes the files)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_rewind.snapshots import SnapshotStore
from agent_rewind.snapshots.merge import Reverted

BASE = "".join(f"line {i}\n" for i in range(1, 21))


def lines(**changed: str) -> str:
    """BASE with line N replaced (`l5="five"`)."""
    out = BASE.splitlines(keepends=True)
    for key, text in changed.items():
        out[int(key[1:]) - 1] = text + "\n"
    return "".join(out)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


@pytest.fixture
def store(tmp_path: Path, workspace: Path) -> Iterator[SnapshotStore]:
    found = SnapshotStore(tmp_path / "state" / "s1.git", workspace)
    yield found
    found.close()


def put(root: Path, files: dict[str, str | bytes | None]) -> None:
    """Writes (str, bytes) or deletes (None) each file."""
    for name, content in files.items():
        path = root / name
        if content is None:
            if path.is_symlink() or path.exists():
                path.unlink()
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            path.unlink()
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


def take(store: SnapshotStore) -> str:
    snapshot = store.take()
    assert snapshot.complete and snapshot.tree is not None, snapshot.reason
    return snapshot.tree


class Turn:
    """Snapshots around one turn and after what came later, and the revert of the turn."""

    def __init__(self, store: SnapshotStore, workspace: Path) -> None:
        self.store, self.workspace = store, workspace

    def run(
        self,
        before: dict[str, str | bytes | None],
        turn: dict[str, str | bytes | None],
        later: dict[str, str | bytes | None],
        *,
        overwrite: bool = False,
    ) -> Reverted:
        put(self.workspace, before)
        self.before = take(self.store)
        put(self.workspace, turn)
        self.after = take(self.store)
        put(self.workspace, later)
        self.now = take(self.store)
        changed = [c.path for c in self.store.changes(self.before, self.after)]
        return self.store.revert(self.before, self.after, self.now, changed, overwrite=overwrite)

    def content(self, tree: str, path: str) -> str | None:
        """What `path` holds in `tree` (None: nothing), read through the store's objects."""
        with self.store._objects as objects:
            entry = objects.lookup(tree, path)
            return None if entry is None else objects.read(entry[1], b"blob").decode()

    def mode(self, tree: str, path: str) -> str | None:
        with self.store._objects as objects:
            entry = objects.lookup(tree, path)
            return None if entry is None else entry[0]


@pytest.fixture
def turn(store: SnapshotStore, workspace: Path) -> Turn:
    return Turn(store, workspace)


def test_a_file_unchanged_since_the_turn_goes_back_to_what_it_was(turn: Turn) -> None:
    got = turn.run({"a.txt": BASE}, {"a.txt": lines(l5="five")}, {})
    assert got.changed == ("a.txt",) and got.conflicts == ()
    assert turn.content(got.tree, "a.txt") == BASE


def test_later_edits_in_other_lines_of_the_same_file_are_kept(turn: Turn) -> None:
    got = turn.run({"a.txt": BASE}, {"a.txt": lines(l3="three")}, {"a.txt": lines(l3="three", l15="fifteen")})
    assert got.conflicts == ()
    assert turn.content(got.tree, "a.txt") == lines(l15="fifteen")


def test_later_edits_of_the_same_lines_are_a_conflict_left_as_they_are(turn: Turn) -> None:
    got = turn.run({"a.txt": BASE}, {"a.txt": lines(l3="three")}, {"a.txt": lines(l3="THREE")})
    assert got.conflicts == ("a.txt",) and got.changed == ()
    assert got.tree == turn.now


def test_overwrite_puts_a_conflicting_file_back_as_it_was_before_the_turn(turn: Turn) -> None:
    got = turn.run(
        {"a.txt": BASE}, {"a.txt": lines(l3="three")}, {"a.txt": lines(l3="THREE")}, overwrite=True
    )
    assert got.conflicts == ("a.txt",) and got.changed == ("a.txt",)
    assert turn.content(got.tree, "a.txt") == BASE


def test_a_file_the_turn_created_is_deleted_and_one_it_deleted_comes_back(turn: Turn) -> None:
    got = turn.run({"old.txt": "old\n"}, {"new.txt": "new\n", "old.txt": None}, {})
    assert sorted(got.changed) == ["new.txt", "old.txt"] and got.conflicts == ()
    assert turn.content(got.tree, "new.txt") is None
    assert turn.content(got.tree, "old.txt") == "old\n"


def test_a_file_the_turn_deleted_with_its_directory_comes_back_with_it(turn: Turn, workspace: Path) -> None:
    put(workspace, {"d/e/old.txt": "old\n", "keep.txt": "k\n"})
    before = take(turn.store)
    put(workspace, {"d/e/old.txt": None})
    (workspace / "d" / "e").rmdir()
    (workspace / "d").rmdir()
    after = take(turn.store)
    got = turn.store.revert(before, after, after, ["d/e/old.txt"], overwrite=False)
    assert got.changed == ("d/e/old.txt",) and got.conflicts == ()
    assert turn.content(got.tree, "d/e/old.txt") == "old\n"


def test_a_created_file_changed_since_and_a_deleted_one_made_again_are_conflicts(turn: Turn) -> None:
    got = turn.run(
        {"old.txt": "old\n"},
        {"new.txt": "new\n", "old.txt": None},
        {"new.txt": "new\nand more\n", "old.txt": "made again\n"},
    )
    assert got.conflicts == ("new.txt", "old.txt") and got.changed == ()


def test_a_file_deleted_since_that_the_turn_changed_is_a_conflict(turn: Turn) -> None:
    got = turn.run({"a.txt": BASE}, {"a.txt": lines(l3="three")}, {"a.txt": None})
    assert got.conflicts == ("a.txt",)


def test_a_file_already_as_it_was_before_the_turn_is_not_touched(turn: Turn) -> None:
    got = turn.run(
        {"a.txt": BASE, "n.txt": None},
        {"a.txt": lines(l3="x"), "n.txt": "n\n"},
        {"a.txt": BASE, "n.txt": None},
    )
    assert got.changed == () and got.conflicts == () and got.tree == turn.now


def test_a_binary_file_changed_since_is_a_whole_file_conflict(turn: Turn) -> None:
    got = turn.run(
        {"b.bin": b"\0" + BASE.encode()},
        {"b.bin": b"\0" + lines(l3="x").encode()},
        {"b.bin": b"\0" + lines(l3="x", l18="y").encode()},
    )
    assert got.conflicts == ("b.bin",)


def test_a_binary_file_unchanged_since_goes_back_whole(turn: Turn) -> None:
    got = turn.run({"b.bin": b"\0\1\2"}, {"b.bin": b"\0\3"}, {})
    assert got.changed == ("b.bin",) and got.conflicts == ()


def test_a_turn_that_made_a_file_executable_is_taken_back_and_later_edits_kept(
    turn: Turn, workspace: Path
) -> None:
    put(workspace, {"run.sh": BASE})
    before = take(turn.store)
    (workspace / "run.sh").chmod(0o755)
    after = take(turn.store)
    put(workspace, {"run.sh": lines(l9="nine")})
    now = take(turn.store)
    got = turn.store.revert(before, after, now, ["run.sh"], overwrite=False)
    assert got.conflicts == ()
    assert turn.mode(got.tree, "run.sh") == "100644"
    assert turn.content(got.tree, "run.sh") == lines(l9="nine")


def test_a_symbolic_link_is_taken_back_whole_and_a_link_changed_since_is_a_conflict(
    turn: Turn, workspace: Path
) -> None:
    os.symlink("one", workspace / "link")
    before = take(turn.store)
    (workspace / "link").unlink()
    os.symlink("two", workspace / "link")
    after = take(turn.store)
    got = turn.store.revert(before, after, after, ["link"], overwrite=False)
    assert got.changed == ("link",) and turn.content(got.tree, "link") == "one"
    (workspace / "link").unlink()
    os.symlink("three", workspace / "link")
    now = take(turn.store)
    got = turn.store.revert(before, after, now, ["link"], overwrite=False)
    assert got.conflicts == ("link",)


def test_a_file_where_a_directory_of_a_turn_s_file_now_stands_is_a_conflict(
    turn: Turn, workspace: Path
) -> None:
    put(workspace, {"d/a.txt": "a\n"})
    before = take(turn.store)
    put(workspace, {"d/a.txt": None})
    (workspace / "d").rmdir()
    after = take(turn.store)
    put(workspace, {"d": "now a file\n"})
    now = take(turn.store)
    got = turn.store.revert(before, after, now, ["d/a.txt"], overwrite=True)
    assert got.conflicts == ("d/a.txt",) and got.kept == ("d/a.txt",) and got.changed == ()
    # Even overwrite leaves it: the file in the way is not the turn's to remove.
    assert turn.content(got.tree, "d") == "now a file\n"


def test_a_directory_where_the_turn_s_file_was_is_never_overwritten(turn: Turn, workspace: Path) -> None:
    got = turn.run({"f": "one\n"}, {"f": "two\n"}, {"f": None, "f/inside.txt": "later\n"}, overwrite=True)
    assert got.conflicts == ("f",) and got.kept == ("f",) and got.changed == ()
    assert turn.content(got.tree, "f/inside.txt") == "later\n"


def test_a_revert_writes_no_file_of_the_workspace(turn: Turn, workspace: Path) -> None:
    turn.run({"a.txt": BASE}, {"a.txt": lines(l5="five"), "n.txt": "n\n"}, {})
    assert (workspace / "a.txt").read_text() == lines(l5="five")
    assert (workspace / "n.txt").exists()


def test_a_revert_done_twice_changes_nothing_the_second_time(turn: Turn) -> None:
    got = turn.run({"a.txt": BASE}, {"a.txt": lines(l3="three")}, {"a.txt": lines(l3="three", l15="fifteen")})
    again = turn.store.revert(turn.before, turn.after, got.tree, ["a.txt"], overwrite=False)
    assert again.changed == () and again.conflicts == () and again.tree == got.tree


def test_a_file_made_executable_since_keeps_its_mode_and_loses_the_turn_s_lines(
    turn: Turn, workspace: Path
) -> None:
    put(workspace, {"run.sh": BASE})
    before = take(turn.store)
    put(workspace, {"run.sh": lines(l2="two")})
    after = take(turn.store)
    put(workspace, {"run.sh": lines(l2="two", l19="nineteen")})
    (workspace / "run.sh").chmod(0o755)
    now = take(turn.store)
    got = turn.store.revert(before, after, now, ["run.sh"], overwrite=False)
    assert got.conflicts == ()
    assert turn.mode(got.tree, "run.sh") == "100755"
    assert turn.content(got.tree, "run.sh") == lines(l19="nineteen")
