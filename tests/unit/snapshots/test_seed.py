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
from types import SimpleNamespace

import pytest
from structlog.testing import capture_logs

from agent_rewind.snapshots import GitTimeout, Snapshot, SnapshotError, SnapshotStore, gitindex, seed
from agent_rewind.snapshots import store as store_module
from agent_rewind.snapshots import watch as watch_module
from agent_rewind.snapshots.git import Git
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


# Git as the oracle at the edges: racy entries, stat data that lie, packs, bounds.


def _ls_tree(store_repo: Path, tree: str) -> dict[str, tuple[str, str]]:
    """`git ls-tree -r` of a snapshot's tree: path -> (mode, blob id)."""
    env = {"PATH": os.environ["PATH"], "GIT_DIR": str(store_repo), "HOME": "/nonexistent"}
    out = subprocess.run(["git", "ls-tree", "-r", tree], env=env, capture_output=True, check=True).stdout
    rows = (line.split(b"\t", 1) for line in out.splitlines())
    return {path.decode(): (meta.split()[0].decode(), meta.split()[2].decode()) for meta, path in rows}


@pytest.mark.parametrize(
    ("index_after_file_ns", "git_says_modified"),
    [(0, True), (-1_000_000_000, True), (1_000_000_000, False)],
    ids=["same-timestamp", "file-newer", "index-newer"],
)
def test_an_entry_is_trusted_only_when_git_would_not_compare_its_content(
    index_after_file_ns: int,
    git_says_modified: bool,
    tmp_path: Path,
    ws: Path,
    stores: list[SnapshotStore],
    hashed: list[str],
) -> None:
    """Racy git: README.md rewritten in place (the same size) and its entry given the file's
    exact stat data, as when git added it within the same timestamp as the edit. An entry whose
    mtime is not older than the index's is "racily clean": git compares the content and finds
    it modified, and the seed hashes the file; only an index written later vouches for it."""
    old = git(ws, "rev-parse", ":README.md").decode().strip()
    (ws / "README.md").write_text("HELLO\n")
    info = (ws / "README.md").lstat()
    _forge(ws, "README.md", stat=gitindex.Stat.of(gitindex.MODE_FILE, info))
    when = info.st_mtime_ns + index_after_file_ns
    os.utime(ws / ".git/index", ns=(when, when))
    seeded, reference = seeded_and_hashed(tmp_path, ws, stores)
    modified = git(ws, "diff-files", "--name-only").decode().split()
    assert modified == (["README.md"] if git_says_modified else [])
    readme = _ls_tree(stores[0].repo, seeded)["README.md"]
    if git_says_modified:
        assert hashed == ["README.md"] and seeded == reference
        assert readme == ("100644", git(ws, "hash-object", "README.md").decode().strip())
    else:  # what `git status` would call clean: the entry's blob, as git would commit it
        assert hashed == [] and readme == ("100644", old)


@pytest.mark.parametrize("edit", ["other-size", "same-size"])
def test_a_file_edited_with_its_mtime_put_back_is_hashed(
    edit: str, tmp_path: Path, ws: Path, stores: list[SnapshotStore], hashed: list[str]
) -> None:
    """An editor (or an agent) that restores the mtime after writing: the size or the ctime
    still differ from the entry's. Git sees another size; of the same size, a git that keeps
    ctime to the second (built without USE_NSEC, as this one) calls the file clean when it was added in the same
    second, but the seed compares the nanoseconds too, and hashes it."""
    path = ws / "src/d1/f1.py"
    path.write_text("changed\n" if edit == "other-size" else path.read_text().upper())
    os.utime(path, (PAST, PAST))
    if edit == "other-size":
        assert git(ws, "diff-files", "--name-only").decode().split() == ["src/d1/f1.py"]
    seeded, reference = seeded_and_hashed(tmp_path, ws, stores)
    assert seeded == reference
    assert hashed == ["src/d1/f1.py"]


@pytest.mark.parametrize("version", [1, 5, 0xFFFFFFFF])
def test_an_index_of_a_version_not_known_is_not_used(
    version: int, tmp_path: Path, ws: Path, stores: list[SnapshotStore], hashed: list[str]
) -> None:
    """An index a newer (or no) git wrote: its entries may not mean what version 2-4's do."""
    index = ws / ".git/index"
    body = bytearray(index.read_bytes()[:-20])
    body[4:8] = version.to_bytes(4, "big")
    index.write_bytes(bytes(body) + hashlib.sha1(bytes(body)).digest())
    with pytest.raises(seed.NotSeedable):
        read_index(ws)
    seeded, reference = seeded_and_hashed(tmp_path, ws, stores)
    assert seeded == reference
    assert len(hashed) == 16


def test_an_index_whose_files_are_all_gone_seeds_nothing_and_copies_nothing(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore], hashed: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every tracked file deleted, untracked ones left: no entry names a file, no blob is copied."""
    copied = _copies(monkeypatch)
    for line in git(ws, "ls-files", "-z").split(b"\0"):
        if line:
            (ws / line.decode()).unlink()
    write(ws / "notes.txt", "untracked\n")
    seeded, reference = seeded_and_hashed(tmp_path, ws, stores)
    assert seeded == reference
    assert sorted(hashed) == ["debug.log", "notes.txt"] and copied == []
    assert _ls_tree(stores[0].repo, seeded).keys() == {"debug.log", "notes.txt"}


def _packed(ws: Path) -> None:
    """The checkout's objects in a pack (as a clone has them), then one more commit (loose)."""
    git(ws, "repack", "-a", "-d", "-q")
    git(ws, "prune-packed")
    write(ws / "later.py", "a later commit\n")
    git(ws, "add", "later.py")
    git(ws, "commit", "-qm", "later")
    assert list((ws / ".git/objects/pack").glob("pack-*.pack"))


def test_a_packed_checkout_is_seeded_from_its_pinned_pack(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore], hashed: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cloned checkout keeps its blobs in packs: they are pinned with the loose objects, so
    every file is seeded, though the agent removes its `.git` as its turn starts."""
    _packed(ws)
    reference = first(tmp_path, ws, stores, "hashed", HashingStore)
    hashed.clear()
    copied = _copies(monkeypatch)
    _, snapshot, read = _take_released(tmp_path, ws, stores, lambda: shutil.rmtree(ws / ".git"))
    assert snapshot.complete and snapshot.how == "seeded" and snapshot.tree == reference, snapshot
    assert hashed == [] and len(copied) == 1 and read[0] <= copied[0]


def test_a_pack_that_is_a_link_elsewhere_is_never_read(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore], hashed: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent links another repository's pack into its own and forges an entry naming a blob
    of it (of its file's size, with its file's stat data): were the link followed, the snapshot
    would record that blob, and a rewind write it into the workspace. The checkout is not used,
    even where the objects cannot be pinned and git would read the workspace's own."""
    victim = tmp_path / "victim"
    write(victim / "secret", "token\n")  # the size of README.md
    git(victim, "init", "-q")
    git(victim, "add", "-A")
    git(victim, "commit", "-qm", "secret")
    git(victim, "repack", "-a", "-d", "-q")
    secret = git(victim, "rev-parse", ":secret").decode().strip()
    for part in (victim / ".git/objects/pack").iterdir():
        (ws / ".git/objects/pack" / part.name).symlink_to(part)
    _forge(ws, "README.md", oid=secret)
    with pytest.raises(seed.NotSeedable, match=r"pack/pack-\w+\.\w+ is not a plain file"):
        read_index(ws)
    refused = OSError(errno.EXDEV, "Invalid cross-device link")
    monkeypatch.setattr(os, "link", lambda *args, **kwargs: (_ for _ in ()).throw(refused))
    seeded, reference = seeded_and_hashed(tmp_path, ws, stores)
    assert seeded == reference and len(hashed) == 16
    assert _ls_tree(stores[0].repo, seeded)["README.md"][1] != secret


def test_a_pin_directory_that_cannot_be_made_means_copy_at_once(tmp_path: Path, ws: Path) -> None:
    """`pin` answers None (the caller copies before the agent runs) when its directory cannot
    be made (here its parent is missing; a full disk likewise), rather than failing the take."""
    into = tmp_path / "missing" / "pinned"
    assert seed.pin(ws, into) is None
    assert not into.exists()


def test_a_state_path_with_a_control_character_hashes_every_file(
    tmp_path: Path, ws: Path, stores: list[SnapshotStore], hashed: list[str]
) -> None:
    """The pinned objects' path cannot be given to git as an alternate (a newline in it): no
    blob is copied, every file vouched for is hashed, and the snapshot is still whole."""
    store = SnapshotStore(tmp_path / "state\nnewline" / "seeded.git", ws)
    stores.append(store)
    snapshot = store.take()
    assert len(hashed) == 16
    reference = first(tmp_path, ws, stores, "hashed", HashingStore)
    assert snapshot.complete and snapshot.tree == reference and snapshot.how != "seeded", snapshot


def test_only_control_characters_keep_a_path_from_being_an_alternate() -> None:
    """GIT_ALTERNATE_OBJECT_DIRECTORIES' C-quoting: the control characters (below a space, and
    DEL) are refused; a space, `~`, `:`, a quote, a backslash and non-ASCII are quoted."""
    for c in ("\x00", "\n", "\x1f", "\x7f"):
        with pytest.raises(SnapshotError, match="control character"):
            seed.quoted(f"/a{c}b")
    assert seed.quoted('/a b~:"\\é') == '"/a b~:\\"\\\\é"'


class _NoGit(Git):
    def _argv(self, args):  # type: ignore[no-untyped-def]
        raise AssertionError(f"git {args[0]} ran")


def test_copying_no_entries_copies_nothing_and_runs_no_git(tmp_path: Path) -> None:
    """No file vouched for: an empty set of paths copied, and no git started for it."""
    assert (
        seed.copy(_NoGit(tmp_path / "store.git", tmp_path), tmp_path, {}, {}, time.monotonic() + 60) == set()
    )


def test_a_blob_copy_past_its_deadline_stops(
    tmp_path: Path, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy's pack-objects and index-pack are given only what is left of the deadline: with
    the clock past it (as after a slow hashing), a copy of 16 MiB is stopped, not waited on."""
    big = os.urandom(16 << 20)
    oid = _blob(ws, big)
    store_git = Git(tmp_path / "state" / "deadline.git", ws)
    store_git.init()
    deadline = time.monotonic() + 600
    monkeypatch.setattr(seed, "time", SimpleNamespace(monotonic=lambda: deadline + 1))
    with pytest.raises(GitTimeout):
        seed.copy_blobs(store_git, ws / ".git/objects", {oid: len(big)}, deadline)
    assert list((store_git.repo / "objects" / "pack").glob("*.idx")) == []


@pytest.mark.parametrize("count", [1, 40, 300])
def test_the_ids_of_a_copied_pack_are_those_git_lists(count: int, tmp_path: Path, ws: Path) -> None:
    """`pack_ids` read against `git show-index` of packs of one to hundreds of blobs."""
    oids = {_blob(ws, f"blob {i}\n".encode()) for i in range(count)}
    pack = git(ws, "pack-objects", "-q", str(tmp_path / "p"), stdin="".join(f"{o}\n" for o in oids).encode())
    idx = tmp_path / f"p-{pack.decode().strip()}.idx"
    listed = {line.split()[1] for line in git(ws, "show-index", stdin=idx.read_bytes()).decode().splitlines()}
    assert listed == oids
    assert seed.pack_ids(idx) == oids


def test_an_index_at_the_size_bound_is_read_and_one_byte_over_is_not(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    size = (ws / ".git/index").stat().st_size
    monkeypatch.setattr(seed, "MAX_INDEX_BYTES", size)
    assert "README.md" in read_index(ws)[0]
    monkeypatch.setattr(seed, "MAX_INDEX_BYTES", size - 1)
    with pytest.raises(seed.NotSeedable, match="over"):
        read_index(ws)


def test_an_index_that_fails_to_read_is_logged_with_the_read_s_own_error(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An I/O error reading `.git/index` (a failing disk): nothing is seeded, and the log says
    what failed rather than taking it for an index that is a directory."""
    real = os.read

    def failing(fd: int, n: int) -> bytes:
        if os.fstat(fd).st_ino == (ws / ".git/index").stat().st_ino:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(fd, n)

    monkeypatch.setattr(os, "read", failing)
    with capture_logs() as logs:
        assert seed.trusted_files(ws, {"README.md": (ws / "README.md").lstat()}) == {}
    assert [e["why"] for e in logs] == [str(OSError(errno.EIO, os.strerror(errno.EIO)))], logs
