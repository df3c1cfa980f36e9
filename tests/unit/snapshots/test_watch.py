"""The workspace watch (inotify) never lets a snapshot miss what a full scan sees.

The model test drives random workspace operations between snapshots (files written, deleted,
renamed, made executable, turned into links; directories made, moved, deleted; a `.gitignore`
changed; an ignored tree grown) and checks after every step that a store following the
workspace with its watch records exactly the tree a store scanning it records. The other tests
pin what the watch itself promises: nothing changed means no git process, a change means git is
asked about that path alone, and whenever the watch may have missed something it says so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_rewind.snapshots import SnapshotStore
from agent_rewind.snapshots import git as git_module
from agent_rewind.snapshots import watch as watch_module
from agent_rewind.snapshots.watch import Watch

pytestmark = pytest.mark.skipif(not watch_module._INOTIFY.available, reason="Linux inotify only")


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


class GitCalls:
    """Counts the git commands stores start (wrapping the sealed runner)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.commands: list[tuple[str, ...]] = []
        complete, parallel = git_module.Git._complete, git_module.Git.run_parallel

        def counted_complete(git, args, *rest, **kw):  # type: ignore[no-untyped-def]
            self.commands.append(tuple(args))
            return complete(git, args, *rest, **kw)

        def counted_parallel(git, commands, deadline):  # type: ignore[no-untyped-def]
            self.commands.extend(tuple(c) for c in commands)
            return parallel(git, commands, deadline)

        monkeypatch.setattr(git_module.Git, "_complete", counted_complete)
        monkeypatch.setattr(git_module.Git, "run_parallel", counted_parallel)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    write(ws / ".gitignore", "node_modules/\n*.log\n")
    write(ws / "src" / "a.py", "a\n")
    write(ws / "src" / "deep" / "b.py", "b\n")
    write(ws / "node_modules" / "left" / "index.js", "x\n")
    return ws


def test_nothing_changed_runs_no_git_and_gives_the_same_tree(
    tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SnapshotStore(tmp_path / "s.git", workspace, watch=True)
    first = store.take()
    assert first.complete
    calls = GitCalls(monkeypatch)
    again = store.take()
    assert again.complete and again.tree == first.tree
    assert calls.commands == []
    assert (first.how, again.how) == ("scan", "unchanged")


def test_changed_files_are_recorded_without_git_and_new_ones_ask_only_about_ignores(
    tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SnapshotStore(tmp_path / "s.git", workspace, watch=True)
    scanning = SnapshotStore(tmp_path / "scan.git", workspace)
    store.take()
    calls = GitCalls(monkeypatch)
    write(workspace / "src" / "deep" / "b.py", "changed\n")
    (workspace / "src" / "a.py").unlink()
    snap = store.take()
    assert snap.complete and calls.commands == [] and snap.how == "watched"
    assert snap.tree == scanning.take().tree
    calls.commands.clear()
    write(workspace / "src" / "new.py", "new\n")
    write(workspace / "src" / "debug.log", "ignored\n")
    snap = store.take()
    assert [c[:2] for c in calls.commands] == [("check-ignore", "--no-index")], calls.commands
    assert snap.tree == scanning.take().tree


def test_a_new_directory_makes_git_scan_that_directory_alone(
    tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SnapshotStore(tmp_path / "s.git", workspace, watch=True)
    store.take()
    calls = GitCalls(monkeypatch)
    write(workspace / "lib" / "c.py", "c\n")
    snap = store.take()
    scans = [c for c in calls.commands if "diff-files" in c or "ls-files" in c]
    assert scans and all(c[-2:] == ("--", "lib") for c in scans), calls.commands
    assert snap.how == "paths"
    assert snap.tree == SnapshotStore(tmp_path / "scan.git", workspace).take().tree


def test_ignored_directories_are_not_watched(tmp_path: Path, workspace: Path) -> None:
    store = SnapshotStore(tmp_path / "s.git", workspace, watch=True)
    store.take()
    assert store._watch is not None
    watched = set(store._watch._dirs.values())
    assert watched == {"", "src", "src/deep"}


def test_a_directory_holding_only_ignored_files_is_watched(tmp_path: Path, workspace: Path) -> None:
    """git lists `lib/` among the ignored when all it holds is ignored; a new file there is not."""
    write(workspace / "lib" / "debug.log", "ignored\n")
    watching = SnapshotStore(tmp_path / "w.git", workspace, watch=True)
    scanning = SnapshotStore(tmp_path / "s.git", workspace)
    assert watching.take().tree == scanning.take().tree
    write(workspace / "lib" / "kept.py", "not ignored\n")
    assert watching.take().tree == scanning.take().tree
    assert "lib/kept.py" in watching.files(scanning.take().tree or "")


def test_a_gitignore_change_makes_the_next_snapshot_scan(
    tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SnapshotStore(tmp_path / "s.git", workspace, watch=True)
    store.take()
    write(workspace / ".gitignore", "*.log\n")  # node_modules/ is no longer ignored
    calls = GitCalls(monkeypatch)
    snap = store.take()
    full = [c for c in calls.commands if "diff-files" in c and "--" not in c]
    assert full, calls.commands
    assert snap.how == "scan"
    assert snap.tree == SnapshotStore(tmp_path / "scan.git", workspace).take().tree
    assert store._watch is not None
    assert "node_modules" in set(store._watch._dirs.values())  # watched once no longer ignored


def test_an_overflowing_queue_is_never_trusted(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    watch = Watch(root)
    watch.start([])
    for i in range(watch_module.MAX_PATHS + 1):  # more paths than are worth naming
        (root / f"f{i}").write_text("x")
    assert watch.changed() is None
    watch.start([])
    assert watch.changed() == set()
    watch.distrust()
    assert watch.changed() is None
    watch.close()


def test_a_moved_directory_is_never_trusted(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "a" / "b").mkdir(parents=True)
    watch = Watch(root)
    watch.start([])
    (root / "a").rename(root / "c")
    assert watch.changed() is None
    watch.close()


def test_a_new_directory_is_watched_with_what_it_holds(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    watch = Watch(root)
    watch.start([])
    (root / "new" / "inner").mkdir(parents=True)
    assert watch.changed() == {"new"}
    (root / "new" / "inner" / "f.txt").write_text("x")  # below a directory made meanwhile
    assert watch.changed() == {"new/inner/f.txt"}
    watch.close()


def test_without_inotify_the_store_scans(
    tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watch_module._INOTIFY, "available", False)
    store = SnapshotStore(tmp_path / "s.git", workspace, watch=True)
    first = store.take()
    write(workspace / "src" / "a.py", "changed\n")
    second = store.take()
    assert store._watch is None
    assert first.complete and second.complete and first.tree != second.tree


def test_closing_stops_the_watch_and_the_next_snapshot_scans(tmp_path: Path, workspace: Path) -> None:
    store = SnapshotStore(tmp_path / "s.git", workspace, watch=True)
    store.take()
    store.close()
    assert store._watch is not None and not store._watch.watching
    write(workspace / "src" / "a.py", "changed while nobody watched\n")
    snap = store.take()
    assert snap.tree == SnapshotStore(tmp_path / "scan.git", workspace).take().tree


def test_files_written_later_into_a_new_directory_are_seen(tmp_path: Path, workspace: Path) -> None:
    watching = SnapshotStore(tmp_path / "w.git", workspace, watch=True)
    scanning = SnapshotStore(tmp_path / "s.git", workspace)
    watching.take()
    write(workspace / "lib" / "first", "1\n")  # the directory is new
    assert watching.take().tree == scanning.take().tree
    write(workspace / "lib" / "second", "2\n")  # seen only through the new directory's watch
    assert watching.take().tree == scanning.take().tree


def test_files_written_into_a_moved_directory_are_seen(tmp_path: Path, workspace: Path) -> None:
    watching = SnapshotStore(tmp_path / "w.git", workspace, watch=True)
    scanning = SnapshotStore(tmp_path / "s.git", workspace)
    watching.take()
    (workspace / "src" / "deep").rename(workspace / "moved")
    assert watching.take().tree == scanning.take().tree
    write(workspace / "moved" / "b.py", "changed after the move\n")
    assert watching.take().tree == scanning.take().tree
    write(tmp_path / "outside" / "c.py", "c\n")
    (tmp_path / "outside").rename(workspace / "incoming")  # no watch was ever on it
    assert watching.take().tree == scanning.take().tree
    write(workspace / "incoming" / "c.py", "changed after moving in\n")
    assert watching.take().tree == scanning.take().tree


# --- the model: a watching store records what a scanning one does, after any operations ---

NAMES = ["a", "b", "c.log", "d"]
DIRS = ["", "src", "src/x", "node_modules", "lib", "src/x/y"]

operation = st.one_of(
    st.tuples(st.just("write"), st.sampled_from(DIRS), st.sampled_from(NAMES), st.integers(0, 3)),
    st.tuples(st.just("delete"), st.sampled_from(DIRS), st.sampled_from(NAMES)),
    st.tuples(st.just("rename"), st.sampled_from(DIRS), st.sampled_from(NAMES), st.sampled_from(NAMES)),
    st.tuples(st.just("chmod"), st.sampled_from(DIRS), st.sampled_from(NAMES)),
    st.tuples(st.just("symlink"), st.sampled_from(DIRS), st.sampled_from(NAMES)),
    st.tuples(st.just("mkdir"), st.sampled_from(DIRS)),
    st.tuples(st.just("rmtree"), st.sampled_from(DIRS[1:])),
    st.tuples(st.just("movedir"), st.sampled_from(DIRS[1:]), st.sampled_from(["moved", "lib/m"])),
    st.tuples(
        st.just("ignore"),
        st.sampled_from(
            ["node_modules/\n", "*.log\n", "lib/\n", "", "src/\n!src/x/\n", "*\n!*/\n!a\n", "x\n"]
        ),
    ),
    st.tuples(st.just("nested"), st.sampled_from(DIRS[1:])),
    # Snapshots often: a change is missed only when a later one lands between two of them.
    st.tuples(st.just("snapshot")),
    st.tuples(st.just("snapshot")),
    st.tuples(st.just("snapshot")),
)


def apply(root: Path, op: tuple) -> None:  # type: ignore[type-arg]
    kind = op[0]
    try:
        if kind == "write":
            write(root / op[1] / op[2], f"content {op[3]}\n")
        elif kind == "delete":
            (root / op[1] / op[2]).unlink()
        elif kind == "rename":
            os.replace(root / op[1] / op[2], root / op[1] / op[3])
        elif kind == "chmod":
            (root / op[1] / op[2]).chmod(0o755)
        elif kind == "symlink":
            (root / op[1] / op[2]).unlink(missing_ok=True)
            (root / op[1]).mkdir(parents=True, exist_ok=True)
            os.symlink("../elsewhere", root / op[1] / op[2])
        elif kind == "mkdir":
            (root / op[1] / "made").mkdir(parents=True, exist_ok=True)
            write(root / op[1] / "made" / "inside", "new\n")
        elif kind == "rmtree":
            shutil.rmtree(root / op[1])
        elif kind == "movedir":
            (root / op[2]).parent.mkdir(parents=True, exist_ok=True)
            os.rename(root / op[1], root / op[2])
        elif kind == "ignore":
            write(root / ".gitignore", op[1])
        elif kind == "nested":
            (root / op[1] / ".git").mkdir(parents=True, exist_ok=True)
            write(root / op[1] / "in-nested", "n\n")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, FileExistsError, OSError):
        pass  # the operation does not apply to the workspace as it is: skip it


# `make test` runs the same 60 examples every time; `make fuzz` runs 3,000 new ones.
EXAMPLES = os.environ.get("AGENT_REWIND_WATCH_EXAMPLES")


@settings(
    max_examples=int(EXAMPLES or 60),
    derandomize=EXAMPLES is None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=st.lists(operation, min_size=1, max_size=25))
def test_a_watching_store_records_what_a_scanning_one_does(
    tmp_path_factory: pytest.TempPathFactory, ops
) -> None:  # type: ignore[no-untyped-def]
    base = tmp_path_factory.mktemp("model")
    root = base / "ws"
    write(root / ".gitignore", "node_modules/\n")
    write(root / "src" / "x" / "a", "a\n")
    write(root / "node_modules" / "pkg" / "i.js", "i\n")
    watching = SnapshotStore(base / "watch.git", root, watch=True)
    scanning = SnapshotStore(base / "scan.git", root)
    try:
        assert watching.take().tree == scanning.take().tree
        for op in [*ops, ("snapshot",)]:
            apply(root, op)
            if op[0] != "snapshot":
                continue
            seen, scanned = watching.take(), scanning.take()
            assert (seen.tree, seen.complete) == (scanned.tree, scanned.complete), ops
    finally:
        watching.close()
        subprocess.run(["chmod", "-R", "u+rwx", str(base)], check=False)


def test_a_damaged_index_while_watching_is_rebuilt_and_the_watch_restarts(
    tmp_path: Path, workspace: Path
) -> None:
    store = SnapshotStore(tmp_path / "s.git", workspace, watch=True)
    scanning = SnapshotStore(tmp_path / "scan.git", workspace)
    store.take()
    store.close()  # the next take starts the watch again, listing what is ignored from the index
    (store.repo / "snapshot.index").write_bytes(b"DIRC not really an index")
    write(workspace / "src" / "a.py", "changed\n")
    snap = store.take()
    assert snap.complete and snap.tree == scanning.take().tree
    # The take that rebuilt the index could not start the watch (listing what is ignored needs
    # the index); the next one does, scanning once more, and the one after relies on it.
    for round_, how in enumerate(["scan", "watched"]):
        write(workspace / "src" / "a.py", f"changed again {round_}\n")
        again = store.take()
        assert again.complete and again.tree == scanning.take().tree
        assert again.how == how


@pytest.mark.parametrize("limit", ["too many directories", "max_user_watches reached"])
def test_a_workspace_past_a_watch_limit_is_scanned_and_still_right(
    tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch, limit: str
) -> None:
    if limit == "too many directories":
        monkeypatch.setattr(watch_module, "MAX_WATCHES", 2)
    else:

        def no_space(fd: int, path: bytes) -> int:
            raise OSError(28, "No space left on device", os.fsdecode(path))  # ENOSPC

        monkeypatch.setattr(watch_module._INOTIFY, "add", no_space)
    store = SnapshotStore(tmp_path / "s.git", workspace, watch=True)
    scanning = SnapshotStore(tmp_path / "scan.git", workspace)
    first = store.take()
    assert first.complete and first.tree == scanning.take().tree
    assert store._watch is None  # given up for this store: every take scans
    write(workspace / "src" / "deep" / "b.py", "changed\n")
    second = store.take()
    assert second.how == "scan" and second.tree == scanning.take().tree


def test_a_disk_full_mid_take_is_an_incomplete_snapshot_and_the_next_one_is_whole(
    tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent_rewind.snapshots import objects as objects_module

    store = SnapshotStore(tmp_path / "s.git", workspace, watch=True)
    scanning = SnapshotStore(tmp_path / "scan.git", workspace)
    store.take()
    write(workspace / "src" / "a.py", "changed while the disk was full\n")
    real_write = objects_module.Objects.write

    def full(self: objects_module.Objects, kind: bytes, body: bytes) -> str:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(objects_module.Objects, "write", full)
    failed = store.take()
    assert not failed.complete and failed.tree is None and "No space left" in failed.reason
    monkeypatch.setattr(objects_module.Objects, "write", real_write)
    healed = store.take()  # what the failed take had been told is not lost: it scans
    assert healed.complete and healed.how == "scan"
    assert healed.tree == scanning.take().tree


def test_a_workspace_removed_and_made_again_is_scanned_whole(tmp_path: Path) -> None:
    """A person deletes the workspace and clones it again between two turns: every watch was on
    the old directories, so the next snapshot scans the new ones. (No `.gitignore`, whose own
    deletion would make it scan anyway.)"""
    workspace = tmp_path / "plain"
    write(workspace / "src" / "a.py", "a\n")
    store = SnapshotStore(tmp_path / "s.git", workspace, watch=True)
    scanning = SnapshotStore(tmp_path / "scan.git", workspace)
    assert store.take().tree == scanning.take().tree
    shutil.rmtree(workspace)
    write(workspace / "src" / "a.py", "cloned again\n")
    write(workspace / "fresh" / "new.py", "new\n")
    again = store.take()
    assert again.how == "scan" and again.tree == scanning.take().tree
    write(workspace / "fresh" / "new.py", "changed in the new workspace\n")
    watched = store.take()
    assert watched.how == "watched" and watched.tree == scanning.take().tree
