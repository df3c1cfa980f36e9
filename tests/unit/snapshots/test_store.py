"""The workspace snapshot store with real git: round trips, all-or-nothing restores, a hostile
workspace that runs nothing, symlinks never followed, bounds, garbage collection and diffs."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_rewind.snapshots import (
    EMPTY_TREE,
    Change,
    Limits,
    RestoreError,
    Snapshot,
    SnapshotStore,
    UnsafePath,
)
from agent_rewind.snapshots import files as files_module


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


@pytest.fixture(params=[False, True], ids=["scan", "watch"])
def store(request: pytest.FixtureRequest, tmp_path: Path, workspace: Path) -> Iterator[SnapshotStore]:
    """Each test runs on a store that scans the workspace and on one that watches it."""
    found = SnapshotStore(tmp_path / "state" / "snapshots" / "s1.git", workspace, watch=request.param)
    yield found
    found.close()


def write(path: Path, text: str | bytes, mode: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    if mode is not None:
        path.chmod(mode)
    return path


def take(store: SnapshotStore) -> str:
    snapshot = store.take()
    assert snapshot.complete, snapshot.reason
    assert snapshot.tree is not None
    return snapshot.tree


def tree_entries(store: SnapshotStore, tree: str) -> dict[str, tuple[str, bytes]]:
    """path -> (mode, content) of a tree, read with plain git on the snapshot repository."""
    env = {"PATH": os.environ["PATH"], "GIT_DIR": str(store.repo), "HOME": "/nonexistent"}
    listing = subprocess.run(
        ["git", "ls-tree", "-r", "-z", tree], env=env, capture_output=True, check=True
    ).stdout
    entries: dict[str, tuple[str, bytes]] = {}
    for record in filter(None, listing.split(b"\0")):
        meta, _, path = record.partition(b"\t")
        mode, _, oid = meta.decode().split()
        blob = subprocess.run(["git", "cat-file", "blob", oid], env=env, capture_output=True, check=True)
        entries[os.fsdecode(path)] = (mode, blob.stdout)
    return entries


def has_object(store: SnapshotStore, oid: str) -> bool:
    env = {"PATH": os.environ["PATH"], "GIT_DIR": str(store.repo), "HOME": "/nonexistent"}
    return subprocess.run(["git", "cat-file", "-e", oid], env=env, capture_output=True).returncode == 0


def blob_id(content: bytes) -> str:
    return (
        subprocess.run(["git", "hash-object", "--stdin"], input=content, capture_output=True, check=True)
        .stdout.decode()
        .strip()
    )


def listing(root: Path) -> dict[str, str]:
    """Every file and symlink under root (not following links): path -> content or '-> target'."""
    out: dict[str, str] = {}
    for directory, dirs, names in os.walk(root):
        for name in names + [d for d in dirs if os.path.islink(os.path.join(directory, d))]:
            full = Path(directory) / name
            rel = full.relative_to(root).as_posix()
            out[rel] = f"-> {os.readlink(full)}" if full.is_symlink() else full.read_text()
    return out


# Round trips


def test_round_trip_restores_added_modified_deleted_modes_and_symlinks(
    store: SnapshotStore, workspace: Path
) -> None:
    write(workspace / "keep.txt", "kept\n")
    write(workspace / "edit.txt", "before\n")
    write(workspace / "gone" / "deep" / "old.txt", "old\n")
    write(workspace / "run.sh", "#!/bin/sh\n", mode=0o644)
    (workspace / "link").symlink_to("keep.txt")
    write(workspace / ".gitignore", "*.log\nbuild/\n")
    write(workspace / "debug.log", "ignored, before\n")
    (workspace / "empty-dir").mkdir()
    start = take(store)
    held = tree_entries(store, start)
    assert sorted(held) == [".gitignore", "edit.txt", "gone/deep/old.txt", "keep.txt", "link", "run.sh"]
    assert held["link"] == ("120000", b"keep.txt")

    write(workspace / "edit.txt", "after\n")
    (workspace / "gone" / "deep" / "old.txt").unlink()
    write(workspace / "new" / "nested" / "file.txt", "new\n")
    (workspace / "run.sh").chmod(0o755)
    (workspace / "link").unlink()
    (workspace / "link").symlink_to("edit.txt")
    write(workspace / "debug.log", "ignored, after\n")
    write(workspace / "build" / "out.o", "ignored too\n")
    end = take(store)

    changes = store.changes(start, end)
    assert sorted(changes, key=lambda c: c.path) == [
        Change("edit.txt", "modified"),
        Change("gone/deep/old.txt", "deleted"),
        Change("link", "modified"),
        Change("new/nested/file.txt", "added"),
        Change("run.sh", "modified"),
    ]
    assert store.numstat(start, end, ["edit.txt"]) == (1, 1)

    store.restore(start, [c.path for c in changes], rollback=end)

    assert listing(workspace) == {
        ".gitignore": "*.log\nbuild/\n",
        "keep.txt": "kept\n",
        "edit.txt": "before\n",
        "gone/deep/old.txt": "old\n",
        "run.sh": "#!/bin/sh\n",
        "link": "-> keep.txt",
        "debug.log": "ignored, after\n",  # ignored: neither recorded nor touched
        "build/out.o": "ignored too\n",
    }
    assert not (workspace / "run.sh").stat().st_mode & stat.S_IXUSR
    assert not (workspace / "new").exists(), "directories emptied by the restore are removed"
    assert take(store) == start


def test_executable_bit_is_restored(store: SnapshotStore, workspace: Path) -> None:
    write(workspace / "tool", "#!/bin/sh\necho hi\n", mode=0o755)
    start = take(store)
    (workspace / "tool").unlink()
    end = take(store)
    assert store.changes(start, end) == [Change("tool", "deleted")]
    store.restore(start, ["tool"], rollback=end)
    assert (workspace / "tool").stat().st_mode & stat.S_IXUSR
    assert tree_entries(store, start)["tool"][0] == "100755"


def test_an_unchanged_workspace_gives_the_same_tree_and_an_empty_one_the_empty_tree(
    store: SnapshotStore, workspace: Path
) -> None:
    assert take(store) == EMPTY_TREE
    write(workspace / "a.txt", "a\n")
    first = take(store)
    assert take(store) == first
    os.utime(workspace / "a.txt", (1, 1))  # touched, same content
    assert take(store) == first
    assert store.files(first) == ["a.txt"]


def test_a_file_replaced_by_a_directory_and_back(store: SnapshotStore, workspace: Path) -> None:
    write(workspace / "x", "a file\n")
    start = take(store)
    (workspace / "x").unlink()
    write(workspace / "x" / "inner.txt", "in a directory\n")
    end = take(store)
    changes = store.changes(start, end)
    assert sorted(changes, key=lambda c: c.path) == [Change("x", "deleted"), Change("x/inner.txt", "added")]
    store.restore(start, [c.path for c in changes], rollback=end)
    assert (workspace / "x").read_text() == "a file\n"
    store.restore(end, [c.path for c in changes], rollback=start)
    assert (workspace / "x" / "inner.txt").read_text() == "in a directory\n"


def test_restore_into_a_new_workspace_builds_the_whole_tree(
    tmp_path: Path, store: SnapshotStore, workspace: Path
) -> None:
    write(workspace / "a" / "b.txt", "b\n")
    (workspace / "l").symlink_to("a/b.txt")
    tree = take(store)
    fork = tmp_path / "fork"
    fork.mkdir()
    forked = SnapshotStore(store.repo, fork)
    forked.restore(tree, forked.files(tree), rollback=EMPTY_TREE)
    assert listing(fork) == {"a/b.txt": "b\n", "l": "-> a/b.txt"}


def test_nested_repository_files_are_recorded_not_a_gitlink(store: SnapshotStore, workspace: Path) -> None:
    nested = workspace / "vendor" / "lib"
    write(nested / "src" / "code.py", "print(1)\n")
    write(nested / ".gitignore", "*.pyc\n")
    write(nested / "src" / "code.pyc", "compiled\n")
    env = {"PATH": os.environ["PATH"], "HOME": "/nonexistent", "GIT_CONFIG_GLOBAL": "/dev/null"}
    subprocess.run(["git", "init", "-q", str(nested)], env=env, check=True)
    subprocess.run(["git", "init", "-q", str(workspace / "empty-repo")], env=env, check=True)
    first = store.take()
    assert first.complete, first.reason
    assert first.tree is not None
    held = tree_entries(store, first.tree)
    assert sorted(held) == ["vendor/lib/.gitignore", "vendor/lib/src/code.py"]
    assert not any(mode == "160000" for mode, _ in held.values())

    write(nested / "src" / "more.py", "print(2)\n")
    write(nested / "src" / "code.py", "print(3)\n")
    second = take(store)
    assert sorted(store.changes(first.tree, second), key=lambda c: c.path) == [
        Change("vendor/lib/src/code.py", "modified"),
        Change("vendor/lib/src/more.py", "added"),
    ]


def test_names_git_refuses_make_the_snapshot_incomplete(store: SnapshotStore, workspace: Path) -> None:
    write(workspace / "ok.txt", "ok\n")
    write(workspace / "back\\slash", "a backslash is a plain character on Linux\n")
    write(workspace / ".GIT" / "sneaky", "git would skip this silently\n")
    snapshot = store.take()
    assert not snapshot.complete
    assert "unsupported path" in snapshot.reason and ".GIT/sneaky" in snapshot.reason
    assert snapshot.tree is not None
    assert sorted(tree_entries(store, snapshot.tree)) == ["back\\slash", "ok.txt"]


# All or nothing


def test_a_failing_restore_puts_back_what_it_wrote(
    store: SnapshotStore, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("a.txt", "b.txt", "c.txt"):
        write(workspace / name, f"{name} at the start\n")
    start = take(store)
    for name in ("a.txt", "b.txt", "c.txt"):
        write(workspace / name, f"{name} now\n")
    write(workspace / "added.txt", "added now\n")
    now = take(store)

    real_write = files_module.Workspace.write
    calls: list[str] = []

    def failing_write(self: files_module.Workspace, path: str, mode: str, chunks: list[bytes]) -> None:
        calls.append(path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real_write(self, path, mode, chunks)

    monkeypatch.setattr(files_module.Workspace, "write", failing_write)
    with pytest.raises(RestoreError) as caught:
        store.restore(start, ["a.txt", "added.txt", "b.txt", "c.txt"], rollback=now)
    assert caught.value.rolled_back
    assert "No space left" in str(caught.value)
    assert calls[:2] == ["a.txt", "b.txt"], "added.txt is removed first, then a.txt written, b.txt fails"
    assert listing(workspace) == {
        "a.txt": "a.txt now\n",
        "b.txt": "b.txt now\n",
        "c.txt": "c.txt now\n",
        "added.txt": "added now\n",
    }
    assert take(store) == now


def test_a_parent_turned_symlink_fails_the_restore_and_nothing_is_written_through(
    tmp_path: Path, store: SnapshotStore, workspace: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    write(workspace / "a.txt", "a at the start\n")
    write(workspace / "sub" / "f.txt", "f at the start\n")
    start = take(store)
    write(workspace / "a.txt", "a now\n")
    (workspace / "sub" / "f.txt").unlink()
    (workspace / "sub").rmdir()
    (workspace / "sub").symlink_to(outside)
    now = take(store)

    # Only the file under the link is asked for: restoring it would write through the symlink.
    with pytest.raises(RestoreError) as caught:
        store.restore(start, ["a.txt", "sub/f.txt"], rollback=now)
    assert caught.value.rolled_back
    assert "symbolic link" in str(caught.value)
    assert list(outside.iterdir()) == []
    assert (workspace / "a.txt").read_text() == "a now\n"
    assert (workspace / "sub").is_symlink()

    # With the link itself among the paths, it is replaced by a real directory.
    store.restore(start, [c.path for c in store.changes(now, start)], rollback=now)
    assert not (workspace / "sub").is_symlink()
    assert (workspace / "sub" / "f.txt").read_text() == "f at the start\n"
    assert list(outside.iterdir()) == []


def test_restore_replaces_a_symlinked_file_without_writing_through_it(
    tmp_path: Path, store: SnapshotStore, workspace: Path
) -> None:
    target = write(tmp_path / "outside.txt", "outside, untouched\n")
    write(workspace / "f.txt", "mine\n")
    start = take(store)
    (workspace / "f.txt").unlink()
    (workspace / "f.txt").symlink_to(target)
    now = take(store)
    store.restore(start, ["f.txt"], rollback=now)
    assert not (workspace / "f.txt").is_symlink()
    assert (workspace / "f.txt").read_text() == "mine\n"
    assert target.read_text() == "outside, untouched\n"


def test_restore_refuses_content_the_rollback_could_not_put_back(
    store: SnapshotStore, workspace: Path
) -> None:
    write(workspace / ".gitignore", "*.log\n")
    write(workspace / "a.log", "tracked before it was ignored\n")
    (workspace / ".gitignore").write_text("")
    start = take(store)  # a.log is recorded
    (workspace / "a.log").unlink()
    (workspace / ".gitignore").write_text("*.log\n")
    middle = take(store)
    write(workspace / "a.log", "someone's ignored log\n")
    now = take(store)  # ignored, untracked: not recorded
    assert "a.log" not in store.files(now)

    with pytest.raises(RestoreError) as caught:
        store.restore(middle, ["a.log"], rollback=now)  # would delete the ignored file
    assert caught.value.path == "a.log"
    assert (workspace / "a.log").read_text() == "someone's ignored log\n"
    with pytest.raises(RestoreError):
        store.restore(start, ["a.log"], rollback=now)
    assert (workspace / "a.log").read_text() == "someone's ignored log\n"


def test_restore_run_again_after_an_interruption_finishes_it(store: SnapshotStore, workspace: Path) -> None:
    write(workspace / "a.txt", "a start\n")
    write(workspace / "b.txt", "b start\n")
    start = take(store)
    write(workspace / "a.txt", "a now\n")
    write(workspace / "b.txt", "b now\n")
    now = take(store)
    write(workspace / "a.txt", "a start\n")  # as if a crash hit after the first file
    store.restore(start, ["a.txt", "b.txt"], rollback=now)
    assert listing(workspace) == {"a.txt": "a start\n", "b.txt": "b start\n"}


@pytest.mark.parametrize("path", ["../escape.txt", "/etc/passwd", "a/../../x", ".git/config", "a//b", ""])
def test_paths_that_could_leave_the_workspace_are_refused(
    tmp_path: Path, store: SnapshotStore, workspace: Path, path: str
) -> None:
    write(workspace / "a.txt", "a\n")
    tree = take(store)
    with pytest.raises(UnsafePath):
        store.restore(tree, ["a.txt", path], rollback=tree)
    assert not (tmp_path / "escape.txt").exists()


def test_the_repository_may_not_live_in_the_workspace(workspace: Path) -> None:
    with pytest.raises(ValueError, match="overlap"):
        SnapshotStore(workspace / ".snapshots.git", workspace)


# A hostile workspace


# CRLF that `text` would normalise, a keyword that `ident` would collapse.
CODE = b"line one\r\nline two\n$Id: kept as is $\n"


def _hostile(workspace: Path, marker: Path) -> None:
    """A workspace whose own git setup runs `marker`-writing programs at every chance."""
    script = write(workspace.parent / "evil.sh", f'#!/bin/sh\necho "$0 $*" >> {marker}\ncat\n', mode=0o755)
    env = {"PATH": os.environ["PATH"], "HOME": "/nonexistent", "GIT_CONFIG_GLOBAL": "/dev/null"}
    subprocess.run(["git", "init", "-q", str(workspace)], env=env, check=True)
    hooks = workspace / ".git" / "hooks"
    elsewhere = workspace / "my-hooks"
    for directory in (hooks, elsewhere):
        for hook in (
            "post-index-change",
            "pre-commit",
            "post-checkout",
            "reference-transaction",
            "pre-auto-gc",
        ):
            write(directory / hook, f"#!/bin/sh\necho {hook} >> {marker}\n", mode=0o755)
    with (workspace / ".git" / "config").open("a") as config:
        config.write(
            f"[core]\n\tfsmonitor = {script}\n\thooksPath = {elsewhere}\n\tattributesFile = {workspace / 'attrs'}\n"
            f'[filter "x"]\n\tclean = {script} clean\n\tsmudge = {script} smudge\n\trequired = true\n'
            f'[diff "x"]\n\ttextconv = {script} textconv\n\tcommand = {script} external\n'
            f"[diff]\n\texternal = {script}\n"
        )
    write(workspace / ".gitattributes", "* filter=x diff=x text eol=crlf ident\n")
    write(workspace / "attrs", "* filter=x\n")
    write(workspace / "code.txt", CODE)


def test_a_hostile_workspace_runs_nothing(tmp_path: Path, store: SnapshotStore, workspace: Path) -> None:
    marker = tmp_path / "marker"
    _hostile(workspace, marker)
    # Positive control: plain git in the workspace does run its programs.
    env = {"PATH": os.environ["PATH"], "HOME": "/nonexistent", "GIT_CONFIG_GLOBAL": "/dev/null"}
    subprocess.run(["git", "-C", str(workspace), "add", "code.txt"], env=env, capture_output=True)
    assert marker.exists(), "the hostile setup should trigger plain git"
    marker.unlink()

    start = take(store)
    assert tree_entries(store, start)["code.txt"] == ("100644", CODE)
    write(workspace / "code.txt", CODE.replace(b"two", b"2"))
    end = take(store)
    assert store.changes(start, end) == [Change("code.txt", "modified")]
    diffs = store.diff(start, end)
    assert "-line two\n+line 2\n" in diffs[0].unified_diff
    store.restore(start, ["code.txt"], rollback=end)
    assert (workspace / "code.txt").read_bytes() == CODE  # no smudge, no conversion
    store.keep_only([start])
    take(store)
    assert not marker.exists(), marker.read_text()
    assert not (store.repo / "hooks").exists()


def test_symlinks_out_of_the_workspace_are_recorded_as_links_never_followed(
    tmp_path: Path, store: SnapshotStore, workspace: Path
) -> None:
    outside = tmp_path / "outside"
    write(outside / "secret.txt", "not the workspace's\n")
    (workspace / "to-dir").symlink_to(outside)
    (workspace / "to-file").symlink_to(outside / "secret.txt")
    (workspace / "dangling").symlink_to(tmp_path / "nothing-here")
    tree = take(store)
    held = tree_entries(store, tree)
    assert held == {
        "to-dir": ("120000", os.fsencode(outside)),
        "to-file": ("120000", os.fsencode(outside / "secret.txt")),
        "dangling": ("120000", os.fsencode(tmp_path / "nothing-here")),
    }
    (workspace / "to-dir").unlink()
    (workspace / "to-file").unlink()
    now = take(store)
    store.restore(tree, ["to-dir", "to-file"], rollback=now)
    assert (workspace / "to-dir").is_symlink() and (workspace / "to-file").is_symlink()
    assert os.readlink(workspace / "to-file") == str(outside / "secret.txt")
    assert listing(outside) == {"secret.txt": "not the workspace's\n"}


# Bounds


def test_a_file_over_the_bound_makes_the_snapshot_incomplete(tmp_path: Path, workspace: Path) -> None:
    store = SnapshotStore(tmp_path / "s.git", workspace, Limits(max_file_bytes=100))
    write(workspace / "small.txt", "small\n")
    write(workspace / "dir" / "big.bin", b"x" * 101)
    snapshot = store.take()
    assert not snapshot.complete
    assert snapshot.reason == "file over 100 bytes: dir/big.bin"
    assert snapshot.tree is not None and store.files(snapshot.tree) == ["small.txt"]

    (workspace / "dir" / "big.bin").write_bytes(b"x" * 100)
    assert store.take().complete
    (workspace / "dir" / "big.bin").write_bytes(b"y" * 500)  # recorded before, over the bound now
    again = store.take()
    assert not again.complete and again.tree is not None
    assert store.files(again.tree) == ["small.txt"], "the old content is not passed off as current"


def test_more_changed_bytes_than_the_total_bound_make_it_incomplete(tmp_path: Path, workspace: Path) -> None:
    store = SnapshotStore(tmp_path / "s.git", workspace, Limits(max_total_bytes=1000))
    for i in range(3):
        write(workspace / f"f{i}.bin", b"z" * 400)
    snapshot = store.take()
    assert snapshot == Snapshot(
        None, False, "total over 1000 bytes: 1200 bytes changed", snapshot.seconds, "scan"
    )
    (workspace / "f2.bin").unlink()
    assert store.take().complete, "the bound counts the bytes of one snapshot"
    write(workspace / "f3.bin", b"z" * 400)
    assert store.take().complete, "unchanged files are not counted again"


def test_a_timeout_makes_the_snapshot_incomplete_and_the_next_one_is_right(
    tmp_path: Path, workspace: Path
) -> None:
    repo = tmp_path / "s.git"
    write(workspace / "a.txt", "a\n")
    hurried = SnapshotStore(repo, workspace, Limits(timeout_s=1e-9))
    snapshot = hurried.take()
    assert (snapshot.tree, snapshot.complete) == (None, False)
    assert snapshot.reason.startswith("timeout")

    # A git killed at the deadline may leave the index locked.
    (repo / "snapshot.index.lock").write_bytes(b"half written")
    store = SnapshotStore(repo, workspace)
    tree = take(store)
    assert tree_entries(store, tree) == {"a.txt": ("100644", b"a\n")}


@pytest.mark.parametrize("damage", ["garbage index", "shared part gone"])
def test_an_unreadable_index_is_rebuilt(store: SnapshotStore, workspace: Path, damage: str) -> None:
    write(workspace / "a.txt", "a\n")
    write(workspace / "d" / "b.txt", "b\n")
    first = take(store)
    if damage == "garbage index":
        (store.repo / "snapshot.index").write_bytes(b"DIRC not really an index")
    else:
        for part in store.repo.glob("sharedindex.*"):
            part.unlink()
    write(workspace / "a.txt", "a, changed\n")
    second = take(store)
    assert tree_entries(store, second) == {
        "a.txt": ("100644", b"a, changed\n"),
        "d/b.txt": ("100644", b"b\n"),
    }
    assert store.changes(first, second) == [Change("a.txt", "modified")]


def test_replaced_shared_index_parts_are_deleted(store: SnapshotStore, workspace: Path) -> None:
    for round_ in range(4):
        for i in range(10):  # as many new entries as old: git writes a new shared part each time
            write(workspace / f"f{round_}-{i}.txt", f"{round_} {i}\n")
        take(store)
        # The first snapshot writes its index whole (`_record_first`), with no shared part; git
        # splits it when it next writes it (a scan; a watched take leaves it as it is).
        assert len(list(store.repo.glob("sharedindex.*"))) <= 1


# Keeping


def test_keep_only_drops_what_no_kept_tree_reaches(store: SnapshotStore, workspace: Path) -> None:
    write(workspace / "shared.txt", "in both\n")
    write(workspace / "old.txt", "only in the first snapshot\n")
    first = take(store)
    (workspace / "old.txt").unlink()
    write(workspace / "new.txt", "only in the second\n")
    second = take(store)
    old_blob = blob_id(b"only in the first snapshot\n")
    assert has_object(store, old_blob) and has_object(store, first)

    store.keep_only([first, second])
    assert has_object(store, old_blob) and has_object(store, first)

    store.keep_only([second])
    assert not has_object(store, old_blob)
    assert not has_object(store, first)
    assert tree_entries(store, second) == {
        "new.txt": ("100644", b"only in the second\n"),
        "shared.txt": ("100644", b"in both\n"),
    }
    # The index still stands on objects that exist: the next snapshots are right.
    write(workspace / "new.txt", "changed\n")
    third = take(store)
    store.restore(second, ["new.txt"], rollback=third)
    assert (workspace / "new.txt").read_text() == "only in the second\n"

    store.keep_only([])
    assert take(store) == second
    assert store.files(second) == ["new.txt", "shared.txt"]


def test_keep_only_shrinks_the_repository_and_delete_removes_it(
    store: SnapshotStore, workspace: Path
) -> None:
    trees = []
    for i in range(5):
        write(workspace / "data.bin", os.urandom(20_000) + bytes([i]))
        trees.append(take(store))
    before = store.disk_bytes()
    store.keep_only(trees[-1:])
    assert store.disk_bytes() < before - 60_000
    store.delete()
    assert not store.repo.exists()
    assert store.disk_bytes() == 0


def test_keep_only_refuses_what_is_not_a_tree_id(store: SnapshotStore, workspace: Path) -> None:
    take(store)
    with pytest.raises(ValueError):
        store.keep_only(["--all"])


# Diffs


@pytest.fixture
def two_trees(store: SnapshotStore, workspace: Path) -> Iterator[tuple[str, str]]:
    write(workspace / "text.txt", "".join(f"line {i}\n" for i in range(100)))
    write(workspace / "image.bin", b"\x89PNG\0\0\x01")
    start = take(store)
    write(workspace / "text.txt", "".join(f"line {i}\n" for i in range(100) if i != 50) + "last\n")
    write(workspace / "image.bin", b"\x89PNG\0\0\x02")
    write(workspace / "added.txt", "brand new\n")
    yield start, take(store)


def test_diff_gives_unified_text_and_flags_binary(store: SnapshotStore, two_trees: tuple[str, str]) -> None:
    start, end = two_trees
    diffs = {d.path: d for d in store.diff(start, end)}
    assert sorted(diffs) == ["added.txt", "image.bin", "text.txt"]
    text = diffs["text.txt"]
    assert (text.change, text.binary, text.truncated) == ("modified", False, False)
    assert "--- a/text.txt\n+++ b/text.txt\n" in text.unified_diff
    assert "-line 50\n" in text.unified_diff and "+last\n" in text.unified_diff
    image = diffs["image.bin"]
    assert image.binary and "Binary files" in image.unified_diff
    assert diffs["added.txt"].change == "added" and "+brand new\n" in diffs["added.txt"].unified_diff


def test_diff_is_cut_at_the_bound_and_limited_to_the_paths_asked(
    store: SnapshotStore, two_trees: tuple[str, str]
) -> None:
    start, end = two_trees
    (cut,) = store.diff(start, end, ["text.txt"], 80)
    assert cut.truncated and len(cut.unified_diff) <= 80
    assert cut.unified_diff.startswith("diff --git a/text.txt b/text.txt\n")
    (whole,) = store.diff(start, end, ["text.txt"])
    assert not whole.truncated and whole.unified_diff.startswith(cut.unified_diff)


def test_capture_keeps_just_the_named_paths_as_they_are_now_ignored_ones_included(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / ".gitignore").write_text("ignored.txt\n")
    (ws / "a.txt").write_text("a")
    (ws / "ignored.txt").write_text("kept anyway")
    (ws / "d").mkdir()
    (ws / "d" / "b.txt").write_text("b")
    (ws / "other.txt").write_text("not named")
    os.symlink("/etc/passwd", ws / "link")
    store = SnapshotStore(tmp_path / "repo.git", ws)
    tree = store.capture(["a.txt", "ignored.txt", "d/b.txt", "missing.txt", "link", "../escape", ".git/x"])
    assert store.files(tree) == ["a.txt", "d/b.txt", "ignored.txt", "link"]
    # Restoring from it after changes puts the named paths back; a missing one stays missing.
    (ws / "a.txt").write_text("changed")
    (ws / "missing.txt").write_text("new")
    now = store.capture(["a.txt", "missing.txt"])
    store.restore(tree, ["a.txt", "missing.txt"], rollback=now)
    assert (ws / "a.txt").read_text() == "a" and not (ws / "missing.txt").exists()
    assert os.readlink(ws / "link") == "/etc/passwd"
    assert not list((tmp_path / "repo.git").glob("capture-*")), "the scratch index is gone"


def test_a_capture_leaves_the_stores_own_index_working(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(3):
        (ws / f"f{i}.txt").write_text(str(i))
    store = SnapshotStore(tmp_path / "repo.git", ws)
    first = store.take()
    store.capture(["f0.txt", "f1.txt"])
    (ws / "f2.txt").write_text("changed")
    second = store.take()
    assert first.complete and second.complete
    assert first.tree is not None and second.tree is not None
    assert [c.path for c in store.changes(first.tree, second.tree)] == ["f2.txt"]


def test_overlay_is_the_tree_a_restore_leaves_without_scanning(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    (ws / "a.txt").write_text("a1")
    (ws / "d" / "b.txt").write_text("b1")
    store = SnapshotStore(tmp_path / "repo.git", ws)
    old = store.take().tree
    (ws / "a.txt").write_text("a2")
    (ws / "d" / "b.txt").unlink()
    (ws / "c.txt").write_text("c2")
    (ws / "other.txt").write_text("untouched")
    now = store.take().tree
    assert old is not None and now is not None
    paths = ["a.txt", "c.txt", "d/b.txt"]
    predicted = store.overlay(now, old, paths)
    store.restore(old, paths, rollback=now)
    assert predicted == store.take().tree
    assert store.overlay(now, old, []) == now


def test_changes_many_answers_like_changes_for_every_pair(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    store = SnapshotStore(tmp_path / "repo.git", ws)
    trees = []
    for i in range(4):
        (ws / f"f{i}.txt").write_text(str(i))
        if i == 2:
            (ws / "f0.txt").unlink()
        trees.append(store.take().tree)
    assert all(t is not None for t in trees)
    pairs = [(trees[0], trees[1]), (trees[1], trees[3]), (trees[2], trees[2]), (trees[3], trees[0])]
    many = store.changes_many(pairs)  # type: ignore[arg-type]
    assert many == [store.changes(a, b) for a, b in pairs]  # type: ignore[arg-type]
    assert [len(c) for c in many] == [1, 3, 0, 4]


def test_diff_keeps_each_path_to_its_own_patch(store: SnapshotStore, workspace: Path) -> None:
    write(workspace / "kind", "a file\n")
    write(workspace / "x", "file x\n")
    write(workspace / "after.txt", "1\n")
    start = take(store)
    (workspace / "kind").unlink()
    (workspace / "kind").symlink_to("after.txt")  # a change of type: git gives two patches
    (workspace / "x").unlink()
    write(workspace / "x" / "inner.txt", "inner\n")  # a pathspec "x" matches x/inner.txt too
    write(workspace / "after.txt", "2\n")
    end = take(store)
    diffs = {d.path: d for d in store.diff(start, end)}
    assert sorted(diffs) == ["after.txt", "kind", "x", "x/inner.txt"]
    assert "-a file\n" in diffs["kind"].unified_diff and "+after.txt" in diffs["kind"].unified_diff
    assert "-file x\n" in diffs["x"].unified_diff and "inner" not in diffs["x"].unified_diff
    assert "+inner\n" in diffs["x/inner.txt"].unified_diff
    assert "+2\n" in diffs["after.txt"].unified_diff and "kind" not in diffs["after.txt"].unified_diff
    only = store.diff(start, end, ["x", "after.txt"])
    assert [d.path for d in only] == ["after.txt", "x"]
    assert only[1] == diffs["x"]


def test_a_capture_of_every_path_is_the_very_tree_git_makes(tmp_path: Path) -> None:
    """capture() hashes and writes objects itself: its tree must be byte for byte git's."""
    ws = tmp_path / "ws"
    for path, text in {
        "a.txt": "a",
        "b-c.txt": "dash sorts before the directory b/",
        "b/x.txt": "x",
        "b/deeper/y.bin": "\x00\x01binary",
        "b.txt": "b",
        "z/z.txt": "z",
    }.items():
        (ws / path).parent.mkdir(parents=True, exist_ok=True)
        (ws / path).write_text(text)
    (ws / "run.sh").write_text("#!/bin/sh\n")
    (ws / "run.sh").chmod(0o755)
    os.symlink("a.txt", ws / "link")
    store = SnapshotStore(tmp_path / "repo.git", ws)
    taken = store.take()
    assert taken.complete and taken.tree is not None
    assert store.capture(store.files(taken.tree)) == taken.tree
    fsck = subprocess.run(
        ["git", "--git-dir", str(tmp_path / "repo.git"), "fsck", "--strict", "--no-dangling"],
        capture_output=True,
        text=True,
    )
    assert fsck.returncode == 0, fsck.stderr
