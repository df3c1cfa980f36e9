"""First snapshots seeded from the workspace's own git (snapshots/seed.py), with real git.

Each case compares the seeded first snapshot with one whose files are all hashed from disk (the
store's older path, `update-index --add` of every file): the same tree id, every blob readable
from the store's own repository alone. Which files were hashed rather than seeded is seen by
spying on `hash_files`. The attacker cases forge what the agent can write: the index, `.git`
itself, objects, config."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent_rewind.snapshots import Snapshot, SnapshotStore, gitindex
from agent_rewind.snapshots import store as store_module
from agent_rewind.snapshots import watch as watch_module
from agent_rewind.snapshots.seed import read_index

PAST = time.time() - 3600  # files older than the index: never "racily clean"


class HashingStore(SnapshotStore):
    """The store as it was: a first snapshot adds every file with `update-index --add`."""

    def _record(self, changed: bytes, others: bytes, deadline: float, fresh: bool = False):  # type: ignore[no-untyped-def]
        return super()._record(changed, others, deadline, False)


def git(ws: Path, *args: str, stdin: bytes = b"") -> bytes:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": "/nonexistent",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    return subprocess.run(
        ["git", *args], cwd=ws, env=env, input=stdin, capture_output=True, check=True
    ).stdout


def write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    os.utime(path, (PAST, PAST), follow_symlinks=False)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """A committed checkout: files in directories, an executable, a symlink, an ignored file."""
    root = tmp_path / "ws"
    root.mkdir()
    write(root / ".gitignore", "*.log\n")
    for d in range(3):
        for f in range(4):
            write(root / f"src/d{d}/f{f}.py", f"print({d}, {f})\n" * (f + 1))
    write(root / "run.sh", "#!/bin/sh\necho hi\n", 0o755)
    write(root / "README.md", "hello\n")
    (root / "link").symlink_to("README.md")
    os.utime(root / "link", (PAST, PAST), follow_symlinks=False)
    write(root / "debug.log", "ignored\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "init")
    return root


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths the first snapshots of the test hashed from disk (not seeded)."""
    seen: list[str] = []
    real = store_module.hash_files

    def spy(pack, workspace, paths, max_file_bytes, deadline):  # type: ignore[no-untyped-def]
        seen.extend(paths)
        return real(pack, workspace, paths, max_file_bytes, deadline)

    monkeypatch.setattr(store_module, "hash_files", spy)
    return seen


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[list[SnapshotStore]]:
    made: list[SnapshotStore] = []
    yield made
    for store in made:
        store.close()


def first(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore], name: str, kind: type = SnapshotStore
) -> str:
    store = kind(tmp_path / "state" / f"{name}.git", ws)
    stores.append(store)
    snapshot = store.take()
    assert snapshot.complete, snapshot.reason
    assert snapshot.tree is not None
    return snapshot.tree


def seeded_and_hashed(tmp_path: Path, ws: Path, stores: list[SnapshotStore]) -> tuple[str, str]:
    seeded = first(tmp_path, ws, stores, "seeded")
    reference = first(tmp_path, ws, stores, "hashed", HashingStore)
    return seeded, reference


def readable(store_repo: Path, tree: str) -> None:
    """Every blob of the tree is in the store's own repository (no alternates), intact."""
    assert not (store_repo / "objects" / "info" / "alternates").exists()
    env = {"PATH": os.environ["PATH"], "GIT_DIR": str(store_repo), "HOME": "/nonexistent"}
    out = subprocess.run(["git", "ls-tree", "-r", tree], env=env, capture_output=True, check=True).stdout
    oids = [line.split()[2] for line in out.decode().splitlines()]
    subprocess.run(["git", "fsck", "--no-dangling", "--full"], env=env, capture_output=True, check=True)
    for oid in oids:
        subprocess.run(["git", "cat-file", "blob", oid], env=env, capture_output=True, check=True)


def test_a_clean_checkout_is_seeded_whole(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore], hashed: list[str]
) -> None:
    seeded, reference = seeded_and_hashed(tmp_path, ws, stores)
    assert seeded == reference
    assert stores[0].take().how in ("scan", "unchanged")  # the next take finds nothing to hash
    assert sorted(hashed) == []  # every file came from the checkout's git
    readable(stores[0].repo, seeded)


def test_a_dirty_checkout_hashes_only_what_changed(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore], hashed: list[str]
) -> None:
    (ws / "src/d0/f0.py").write_text("changed, longer than before\n")  # modified
    (ws / "src/d0/f1.py").unlink()  # deleted
    write(ws / "src/d1/new.py", "untracked\n")  # untracked
    (ws / "src/d1/f2.py").chmod(0o755)  # mode changed
    (ws / "src/d2/f3.py").unlink()
    (ws / "src/d2/f3.py").symlink_to("f0.py")  # a file become a symlink
    (ws / "newlink").symlink_to("src")  # a new symlink
    seeded, reference = seeded_and_hashed(tmp_path, ws, stores)
    assert seeded == reference
    assert sorted(hashed) == ["newlink", "src/d0/f0.py", "src/d1/f2.py", "src/d1/new.py", "src/d2/f3.py"]
    readable(stores[0].repo, seeded)


def test_the_next_scan_after_a_seeded_snapshot_sees_changes(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore]
) -> None:
    seeded = first(tmp_path, ws, stores, "seeded")
    (ws / "README.md").write_text("changed\n")
    after = stores[0].take()
    assert after.complete and after.tree != seeded
    assert [c.path for c in stores[0].changes(seeded, after.tree or "")] == ["README.md"]


@pytest.mark.parametrize("version", [2, 3, 4])
def test_every_index_version_is_read(
    version: int, tmp_path: Path, ws: Path, stores: list[SnapshotStore], hashed: list[str]
) -> None:
    if version == 3:  # git writes version 3 only for an entry with extended flags
        write(ws / "intent.py", "intent to add\n")
        git(ws, "add", "-N", "intent.py")
    git(ws, "update-index", "--index-version", str(version))
    assert int.from_bytes((ws / ".git/index").read_bytes()[4:8], "big") == version
    entries, _ = read_index(ws)
    assert "src/d2/f3.py" in entries and "link" in entries
    seeded, reference = seeded_and_hashed(tmp_path, ws, stores)
    assert seeded == reference
    assert sorted(hashed) == (["intent.py"] if version == 3 else [])  # intent-to-add: hashed


def test_flagged_entries_are_hashed(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore], hashed: list[str]
) -> None:
    git(ws, "update-index", "--assume-unchanged", "README.md")
    git(ws, "update-index", "--skip-worktree", "run.sh")
    seeded, reference = seeded_and_hashed(tmp_path, ws, stores)
    assert seeded == reference
    assert sorted(hashed) == ["README.md", "run.sh"]  # never trusted, whatever their stat data


def test_a_gitlink_is_hashed_as_the_files_it_holds(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore], hashed: list[str]
) -> None:
    sub = ws / "vendor/lib"
    write(sub / "a.c", "int a;\n")
    git(sub, "init", "-q")
    git(sub, "add", "-A")
    git(sub, "commit", "-qm", "sub")
    head = git(sub, "rev-parse", "HEAD").decode().strip()
    git(ws, "update-index", "--add", "--cacheinfo", f"160000,{head},vendor/lib")
    seeded, reference = seeded_and_hashed(tmp_path, ws, stores)
    assert seeded == reference
    assert sorted(hashed) == ["vendor/lib/a.c"]


# The attacker: everything under .git is theirs.


def _forge(ws: Path, path: str, **changes: object) -> None:
    """Rewrites the workspace's index with one entry changed (its checksum made right)."""
    index = ws / ".git/index"
    entries = gitindex.parse(index.read_bytes())
    rows = []
    for e in entries:
        if e.path == path.encode():
            e = e._replace(**changes)  # type: ignore[arg-type]
        rows.append((e.path, e.oid, e.stat))
    index.write_bytes(gitindex.write(rows))


def _blob(ws: Path, content: bytes) -> str:
    return git(ws, "hash-object", "-w", "--stdin", stdin=content).decode().strip()


def test_a_forged_blob_of_another_size_is_not_trusted(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore], hashed: list[str]
) -> None:
    # Real stat data (copied from the file), a blob of other content and size.
    _forge(ws, "README.md", oid=_blob(ws, b"what the agent wants restored\n"))
    seeded, reference = seeded_and_hashed(tmp_path, ws, stores)
    assert seeded == reference
    assert hashed == ["README.md"]


def test_a_forged_entry_of_other_stat_data_is_not_trusted(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore], hashed: list[str]
) -> None:
    other = _blob(ws, b"hellO\n")  # the same size, other content
    git(ws, "update-index", "--cacheinfo", f"100644,{other},README.md")  # no stat data
    seeded, reference = seeded_and_hashed(tmp_path, ws, stores)
    assert seeded == reference
    assert hashed == ["README.md"]


def test_an_entry_naming_a_tree_is_not_trusted(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore], hashed: list[str]
) -> None:
    tree = git(ws, "write-tree").decode().strip()
    _forge(ws, "README.md", oid=tree)
    seeded, reference = seeded_and_hashed(tmp_path, ws, stores)
    assert seeded == reference
    assert hashed == ["README.md"]


def _loose(ws: Path, oid: str) -> Path:
    return ws / ".git/objects" / oid[:2] / oid[2:]


def test_a_corrupt_loose_object_makes_its_file_hashed(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore], hashed: list[str]
) -> None:
    oid = git(ws, "rev-parse", ":README.md").decode().strip()
    path = _loose(ws, oid)
    path.chmod(0o644)
    path.write_bytes(zlib.compress(b"blob 6\0hel")[:-3])  # cut short
    seeded, reference = seeded_and_hashed(tmp_path, ws, stores)
    assert seeded == reference
    assert "README.md" in hashed and "run.sh" not in hashed  # the rest still seeded
    readable(stores[0].repo, seeded)


def test_a_forged_loose_object_makes_its_file_hashed(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore], hashed: list[str]
) -> None:
    oid = git(ws, "rev-parse", ":README.md").decode().strip()
    path = _loose(ws, oid)
    path.chmod(0o644)
    path.write_bytes(zlib.compress(b"blob 6\0HACKED"))  # well formed, the size right, not its id
    assert hashlib.sha1(b"blob 6\0HACKED").hexdigest() != oid
    seeded, reference = seeded_and_hashed(tmp_path, ws, stores)
    assert seeded == reference
    assert "README.md" in hashed and "run.sh" not in hashed
    readable(stores[0].repo, seeded)


def test_a_symlinked_git_directory_is_not_used(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore], hashed: list[str]
) -> None:
    outside = tmp_path / "outside.git"
    (ws / ".git").rename(outside)
    (ws / ".git").symlink_to(outside)
    seeded, reference = seeded_and_hashed(tmp_path, ws, stores)
    assert seeded == reference
    assert len(hashed) == 16  # every file


def test_a_gitdir_file_is_not_followed(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore], hashed: list[str]
) -> None:
    outside = tmp_path / "outside.git"
    (ws / ".git").rename(outside)
    (ws / ".git").write_text(f"gitdir: {outside}\n")
    seeded, reference = seeded_and_hashed(tmp_path, ws, stores)
    assert seeded == reference
    assert len(hashed) == 16


def test_alternates_are_not_used(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore], hashed: list[str]
) -> None:
    (ws / ".git/objects/info/alternates").write_text(f"{tmp_path}/elsewhere/objects\n")
    seeded, reference = seeded_and_hashed(tmp_path, ws, stores)
    assert seeded == reference
    assert len(hashed) == 16


def test_the_workspace_config_runs_nothing(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore], hashed: list[str]
) -> None:
    marker = tmp_path / "ran"
    hook = f"#!/bin/sh\ntouch {marker}\n"
    (ws / ".git/hooks").mkdir(exist_ok=True)
    for name in ("post-index-change", "pre-commit", "reference-transaction"):
        (ws / ".git/hooks" / name).write_text(hook)
        (ws / ".git/hooks" / name).chmod(0o755)
    with (ws / ".git/config").open("a") as config:
        config.write(f'[core]\n\tfsmonitor = "touch {marker}"\n\thooksPath = .git/hooks\n')
        config.write(f'[filter "x"]\n\tclean = "touch {marker}"\n')
    (ws / ".gitattributes").write_text("* filter=x\n")
    os.utime(ws / ".gitattributes", (PAST, PAST))
    seeded = first(tmp_path, ws, stores, "seeded")
    assert not marker.exists()
    assert seeded == first(tmp_path, ws, stores, "hashed", HashingStore)
    assert not marker.exists()


def _tree_state(root: Path) -> dict[str, tuple[bytes, int, int]]:
    """Every file under `root`: its bytes, mtime and mode (directories: their mtime)."""
    found: dict[str, tuple[bytes, int, int]] = {}
    for directory, dirs, names in os.walk(root):
        for name in [*dirs, *names]:
            path = Path(directory) / name
            info = path.lstat()
            data = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
            found[str(path.relative_to(root))] = (data, info.st_mtime_ns, info.st_mode)
    return found


def test_the_workspace_git_is_left_byte_for_byte(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore], hashed: list[str]
) -> None:
    (ws / "README.md").write_text("dirty now\n")  # git status would refresh the index here
    before = _tree_state(ws / ".git")
    index_stat = (ws / ".git/index").stat()
    first(tmp_path, ws, stores, "seeded")
    assert _tree_state(ws / ".git") == before
    after = (ws / ".git/index").stat()
    assert (after.st_mtime_ns, after.st_ino, after.st_size) == (
        index_stat.st_mtime_ns,
        index_stat.st_ino,
        index_stat.st_size,
    )
    assert hashed == ["README.md"]


def test_a_split_index_is_not_used(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore], hashed: list[str]
) -> None:
    git(ws, "update-index", "--split-index")
    seeded, reference = seeded_and_hashed(tmp_path, ws, stores)
    assert seeded == reference
    assert len(hashed) == 16


@pytest.mark.parametrize("damage", ["truncated", "checksum", "signature"])
def test_a_damaged_index_is_not_used(
    damage: str, tmp_path: Path, ws: Path, stores: list[SnapshotStore], hashed: list[str]
) -> None:
    index = ws / ".git/index"
    data = index.read_bytes()
    if damage == "truncated":
        body = data[: len(data) // 2]
        data = body + hashlib.sha1(body).digest()  # a right checksum over too few bytes
    elif damage == "checksum":
        data = data[:-1] + bytes([data[-1] ^ 1])
    else:
        body = b"XIRC" + data[4:-20]
        data = body + hashlib.sha1(body).digest()
    index.write_bytes(data)
    with pytest.raises(gitindex.BadIndex):
        gitindex.parse(data)
    seeded, reference = seeded_and_hashed(tmp_path, ws, stores)
    assert seeded == reference
    assert len(hashed) == 16


def test_a_first_snapshot_past_its_deadline_leaves_no_pack(
    tmp_path: Path, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent_rewind.snapshots import GitTimeout

    (ws / ".git").rename(tmp_path / "elsewhere.git")  # every file hashed into the pack
    written: list[str] = []

    def late(pack, files):  # type: ignore[no-untyped-def]
        written.extend(files)  # the blobs are in the pack being written when the deadline passes
        raise GitTimeout("the deadline passed")

    real = store_module.write_trees
    monkeypatch.setattr(store_module, "write_trees", late)
    store = SnapshotStore(tmp_path / "state" / "late.git", ws)
    snapshot = store.take()
    assert not snapshot.complete and snapshot.reason.startswith("timeout"), snapshot.reason
    assert len(written) == 16
    assert list((tmp_path / "state" / "late.git").glob("objects/pack/*")) == []
    assert not (tmp_path / "state" / "late.git" / "snapshot.index").exists()
    monkeypatch.setattr(store_module, "write_trees", real)
    assert store.take().complete  # and the next one starts over


def test_a_colon_in_the_workspace_path_names_one_object_directory(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore], hashed: list[str]
) -> None:
    # Unquoted, "…/a:b/ws/.git/objects" would be two alternates: "…/a" and "b/ws/.git/objects".
    moved = tmp_path / "a:b" / "ws"
    moved.parent.mkdir()
    ws.rename(moved)
    seeded, reference = seeded_and_hashed(tmp_path, moved, stores)
    assert seeded == reference
    assert hashed == []


# After the read: the caller's turn goes on (`take`'s `on_read`) while the blobs are copied.


def _take_released(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore], then: Callable[[], None], *, watch: bool = True
) -> tuple[SnapshotStore, Snapshot, list[float]]:
    """A first take (watching, as the server runs it) whose `on_read` runs `then`: what the
    agent does as its turn starts, while the take goes on copying the checkout's blobs."""
    store = SnapshotStore(tmp_path / "state" / "released.git", ws, watch=watch)
    stores.append(store)
    read: list[float] = []

    def on_read() -> None:
        read.append(time.monotonic())
        then()

    return store, store.take(on_read=on_read), read


def _copies(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """When each blob copy of the store began (time.monotonic), from now on."""
    copied: list[float] = []
    real = store_module.copy

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        copied.append(time.monotonic())
        return real(*args, **kwargs)

    monkeypatch.setattr(store_module, "copy", spy)
    return copied


def test_the_read_ends_before_the_blobs_are_copied(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    copied = _copies(monkeypatch)
    reference = first(tmp_path, ws, stores, "hashed", HashingStore)
    _, snapshot, read = _take_released(tmp_path, ws, stores, lambda: None)
    assert snapshot.complete and snapshot.how == "seeded" and snapshot.tree == reference
    assert len(read) == 1 and len(copied) == 1 and read[0] <= copied[0]


def test_a_file_changed_after_the_read_is_recorded_as_it_was_read(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore], hashed: list[str]
) -> None:
    reference = first(tmp_path, ws, stores, "hashed", HashingStore)
    hashed.clear()
    store, snapshot, _ = _take_released(
        tmp_path, ws, stores, lambda: (ws / "README.md").write_text("the agent's first edit\n")
    )
    assert snapshot.complete, snapshot.reason
    assert snapshot.tree == reference and hashed == []  # its blob came from the checkout's git
    after = store.take()  # and the next take, from the watch, has the edit
    assert after.complete and after.how == "watched"
    assert [c.path for c in store.changes(reference, after.tree or "")] == ["README.md"]


def _damage_objects(ws: Path) -> None:
    """Every object file of the checkout emptied in place (the same inodes, so the pinned links
    see it too): what an agent can do to its own git once its turn runs."""
    for path in (ws / ".git" / "objects").rglob("*"):
        if path.is_file() and not path.is_symlink() and path.parent.name != "info":
            path.chmod(0o644)
            with path.open("r+b") as f:
                f.truncate(0)


def test_the_checkout_git_deleted_or_swapped_after_the_read_changes_nothing_of_the_copy(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore], hashed: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = first(tmp_path, ws, stores, "hashed", HashingStore)
    hashed.clear()
    copied = _copies(monkeypatch)
    decoy = tmp_path / "decoy-objects"
    decoy.mkdir()

    def agent() -> None:  # its .git gone, then a .git whose objects lead elsewhere
        shutil.rmtree(ws / ".git")
        (ws / ".git").mkdir()
        (ws / ".git" / "objects").symlink_to(decoy)

    store, snapshot, read = _take_released(tmp_path, ws, stores, agent)
    assert snapshot.complete and snapshot.how == "seeded", snapshot
    assert len(copied) == 1 and read[0] <= copied[0], "copied while the agent may run"
    assert snapshot.tree == reference and hashed == []  # every blob from the objects pinned
    assert not (store.repo / "seed-objects").exists(), "the pinned links are removed after the copy"
    readable(store.repo, reference)


def test_objects_damaged_after_the_read_hash_the_files_the_watch_saw_unchanged(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore], hashed: list[str]
) -> None:
    reference = first(tmp_path, ws, stores, "hashed", HashingStore)
    hashed.clear()
    store, snapshot, _ = _take_released(tmp_path, ws, stores, lambda: _damage_objects(ws))
    assert snapshot.complete, snapshot.reason
    assert snapshot.tree == reference
    assert len(hashed) == 16  # every file, from disk: unchanged since it was read
    readable(store.repo, reference)


def test_objects_that_cannot_be_pinned_are_copied_before_the_read(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore], hashed: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = first(tmp_path, ws, stores, "hashed", HashingStore)
    hashed.clear()
    copied = _copies(monkeypatch)

    def refused(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise OSError(errno.EXDEV, "Invalid cross-device link")  # the store on another filesystem

    monkeypatch.setattr(os, "link", refused)
    store, snapshot, read = _take_released(tmp_path, ws, stores, lambda: _damage_objects(ws))
    assert snapshot.complete and snapshot.how == "seeded" and snapshot.tree == reference, snapshot
    assert hashed == [] and len(copied) == 1 and copied[0] <= read[0], "copied while no agent ran"
    assert not (store.repo / "seed-objects").exists()


def test_the_objects_damaged_and_a_file_changed_after_the_read_make_the_snapshot_incomplete(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore]
) -> None:
    def agent() -> None:  # its objects rewritten (as a `git gc` that went wrong), then an edit
        _damage_objects(ws)
        (ws / "src/d1/f2.py").write_text("the agent's first edit\n")

    _, snapshot, _ = _take_released(tmp_path, ws, stores, agent)
    assert not snapshot.complete
    assert snapshot.reason.startswith("changed meanwhile: src/d1/f2.py"), snapshot.reason


def _lose_blobs_and_edit(ws: Path, path: str) -> Callable[[], None]:
    def agent() -> None:
        _damage_objects(ws)
        (ws / path).write_text("HELLO\n")  # the same size
        os.utime(ws / path, (PAST, PAST))  # the same mtime

    return agent


def test_a_lost_blob_file_the_watch_saw_change_is_not_taken_on_its_stat_data(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    # As if the edit had left every stat field as it was (the ctime cannot be set back here).
    monkeypatch.setattr(store_module, "_same_stat", lambda a, b: True)
    _, snapshot, _ = _take_released(tmp_path, ws, stores, _lose_blobs_and_edit(ws, "README.md"))
    assert not snapshot.complete and snapshot.reason == (
        "changed meanwhile: README.md (its blob was not in the workspace's git, and it may have "
        "changed since it was read)"
    ), snapshot.reason


def test_a_lost_blob_file_of_other_stat_data_is_not_taken_on_the_watch_alone(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watch_module.Watch, "unchanged", lambda self, path: True)  # as if unseen
    _, snapshot, _ = _take_released(tmp_path, ws, stores, _lose_blobs_and_edit(ws, "README.md"))
    assert not snapshot.complete and snapshot.reason.startswith("changed meanwhile: README.md ")


def test_without_a_watch_a_blob_lost_after_the_read_makes_the_snapshot_incomplete(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore]
) -> None:
    _, snapshot, _ = _take_released(tmp_path, ws, stores, lambda: _damage_objects(ws), watch=False)
    assert not snapshot.complete and snapshot.reason.startswith("changed meanwhile"), snapshot.reason


def test_alternates_added_after_the_read_are_not_used(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore], hashed: list[str]
) -> None:
    reference = first(tmp_path, ws, stores, "hashed", HashingStore)
    hashed.clear()
    elsewhere = tmp_path / "elsewhere"
    (ws / ".git" / "objects").rename(elsewhere)

    def agent() -> None:
        (ws / ".git" / "objects" / "info").mkdir(parents=True)
        (ws / ".git" / "objects" / "info" / "alternates").write_text(f"{elsewhere}\n")

    (ws / ".git" / "objects").mkdir()
    _, snapshot, _ = _take_released(tmp_path, ws, stores, agent)
    assert snapshot.complete and snapshot.how == "scan", snapshot  # nothing copied from there
    assert snapshot.tree == reference and len(hashed) == 16


_KILLED_MID_COPY = """
import sys, time
from pathlib import Path
from agent_rewind.snapshots import SnapshotStore, seed
def copy_blobs(*args, **kwargs):
    Path(sys.argv[3]).write_text("copying")
    time.sleep(60)
seed.copy_blobs = copy_blobs
SnapshotStore(Path(sys.argv[1]), Path(sys.argv[2]), watch=True).take(on_read=lambda: None)
"""


def test_a_store_killed_mid_copy_leaves_no_snapshot_and_the_next_first_take_starts_over(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore]
) -> None:
    reference = first(tmp_path, ws, stores, "hashed", HashingStore)
    repo, marker = tmp_path / "state" / "killed.git", tmp_path / "copying"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_MID_COPY, str(repo), str(ws), str(marker)], env=env
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert child.poll() is None and time.monotonic() < deadline, "the take never reached the copy"
            time.sleep(0.02)
    finally:
        child.kill()  # SIGKILL, mid copy
        child.wait()
    assert not (repo / "snapshot.index").exists()  # no index: nothing claims these files known
    assert [p.name for p in (repo / "objects" / "pack").glob("pack-*")] == []  # no pack in place
    assert any((repo / "seed-objects").rglob("*")), "killed with the checkout's objects pinned"
    store = SnapshotStore(repo, ws)
    stores.append(store)
    assert store.first
    again = store.take()
    assert again.complete and again.how == "seeded" and again.tree == reference
    assert not (repo / "seed-objects").exists(), "the next first take removed the pins left"


def test_a_path_twice_in_the_index_is_trusted_neither_time(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore], hashed: list[str]
) -> None:
    index = ws / ".git/index"
    entries = gitindex.parse(index.read_bytes())
    twice = next(e for e in entries if e.path == b"README.md")
    rows = [(e.path, e.oid, e.stat) for e in entries]
    data = gitindex.write(rows)
    # gitindex.write sorts and writes each path once: add the second entry by hand.
    body = bytearray(data[:-20])
    body[8:12] = (len(entries) + 1).to_bytes(4, "big")
    extra = gitindex.write([(twice.path, _blob(ws, b"forged\n"), twice.stat)])[12:-20]
    body += extra  # after every other entry: out of order, as only a forged index is
    index.write_bytes(bytes(body) + hashlib.sha1(bytes(body)).digest())
    found, _ = read_index(ws)
    assert "README.md" not in found and "run.sh" in found
    seeded, reference = seeded_and_hashed(tmp_path, ws, stores)
    assert seeded == reference
    assert hashed == ["README.md"]


def test_the_cycle_collector_paused_is_back_on_after_the_last_pause() -> None:
    import gc

    from agent_rewind.snapshots.scan import gc_paused

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause goes on
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # off before: left off
    finally:
        gc.enable()


def test_an_on_read_that_fails_does_not_stop_the_take(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore]
) -> None:
    def closed() -> None:
        raise RuntimeError("Event loop is closed")  # what a server stopping meanwhile raises

    reference = first(tmp_path, ws, stores, "hashed", HashingStore)
    _, snapshot, read = _take_released(tmp_path, ws, stores, closed)
    assert len(read) == 1
    assert snapshot.complete and snapshot.how == "seeded" and snapshot.tree == reference


def test_a_link_among_the_object_files_is_not_pinned_and_nothing_is_seeded(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore], hashed: list[str]
) -> None:
    from agent_rewind.snapshots import seed

    reference = first(tmp_path, ws, stores, "hashed", HashingStore)
    hashed.clear()
    fanout = ws / ".git" / "objects" / "ab"
    fanout.mkdir(exist_ok=True)
    (fanout / ("c" * 38)).symlink_to(tmp_path / "anything")  # git would follow it
    into = tmp_path / "pinned"
    with pytest.raises(seed.NotSeedable):
        seed.pin(ws, into)
    assert not into.exists()
    store, snapshot, _ = _take_released(tmp_path, ws, stores, lambda: None)
    assert snapshot.complete and snapshot.how != "seeded" and snapshot.tree == reference, snapshot
    assert len(hashed) == 16 and not (store.repo / "seed-objects").exists()
    (fanout / ("c" * 38)).unlink()
    assert seed.pin(ws, into) == into
    files = [p for p in into.rglob("*") if not p.is_dir()]
    assert files and all(p.is_file() and not p.is_symlink() for p in files)
