"""The registry: loading sessions from the ledger, workspace checks, paging, deleting."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent_rewind.access import Principal
from agent_rewind.config import Config
from agent_rewind.errors import (
    InvalidArgument,
    RequestIdReused,
    SessionAlreadyExists,
    SessionNotFound,
    StorageUnavailable,
    WorkspaceInUse,
    WorkspaceOutsideRoot,
)
from agent_rewind.sessions import erasure
from agent_rewind.sessions.registry import NewSessionRequest, SessionRegistry
from agent_rewind.sessions.worker import WorkerContext
from agent_rewind.store.ledger import EventRecord, NewEvent, NewSession
from agent_rewind.store.sqlite import SqliteLedger

SID = "0b7f3c1e-5a8d-4d6e-9f10-2a3b4c5d6e7f"


def _factory(spec: object) -> object:
    raise AssertionError("no process is started here")


async def _registry(
    tmp_path: Path, publish: Callable[[EventRecord], None] | None = None, **config: object
) -> tuple[SessionRegistry, SqliteLedger]:
    cfg = Config(state_dir=tmp_path, **config).resolved()  # type: ignore[arg-type]
    ledger = await SqliteLedger.open(cfg.ledger_path)
    ctx = WorkerContext(ledger, _factory, {}, cfg.claude_config_dir, 0)  # type: ignore[arg-type]
    return SessionRegistry(config=cfg, ledger=ledger, ctx=ctx, publish=publish), ledger


async def test_options_an_older_version_stored_are_checked_again_at_load(tmp_path: Path) -> None:
    registry, ledger = await _registry(tmp_path)
    stored = {"model": "m", "settings": '{"hooks": {"SessionStart": []}}', "add_dirs": ["/"]}
    await ledger.add_session(NewSession(SID, str(tmp_path / "workspaces" / "a"), stored, True))
    await registry.load()
    assert registry.get(SID).record.options == {"model": "m"}
    await ledger.close()


async def test_workspaces_never_overlap_and_never_are_a_root(tmp_path: Path) -> None:
    registry, ledger = await _registry(tmp_path)
    root = tmp_path / "workspaces"
    await registry.create(NewSessionRequest("proj/a", SID, {}, True, False, ""))
    for cwd in ("proj/a", "proj", str(root), ".", "proj/a/inner", str(root / "proj" / "a" / "x")):
        with pytest.raises(WorkspaceInUse):
            registry.resolve_workspace(cwd, "other")
    with pytest.raises(WorkspaceOutsideRoot):
        registry.resolve_workspace(str(tmp_path / "workspaces-evil"), "other")
    assert registry.resolve_workspace("proj/b", "other") == root / "proj" / "b"
    await ledger.close()


async def test_a_cwd_naming_a_home_the_host_does_not_have_is_invalid_argument(tmp_path: Path) -> None:
    # Found by `make fuzz`: `~0` (the home of a user "0") made CreateSession fail with INTERNAL.
    registry, ledger = await _registry(tmp_path)
    with pytest.raises(InvalidArgument) as err:
        registry.resolve_workspace("~no-such-user-here/x", "other")
    assert err.value.field == "cwd"
    await ledger.close()


# DeleteSession (no CLI process here: tests/integration/test_delete.py runs the real one)

ALICE = Principal("alice")


def _leftovers(tmp_path: Path, sid: str, cwd: Path) -> list[Path]:
    """What a session leaves on disk: the CLI's files, its snapshot repository, its workspace."""
    paths = [
        tmp_path / "claude" / "projects" / "-ws" / f"{sid}.jsonl",
        tmp_path / "claude" / "file-history" / sid / "backup@v1",
        tmp_path / "snapshots" / f"{sid}.git" / "objects" / "ab",
        cwd / "notes.txt",
    ]
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("the session's content")
    return paths


async def test_delete_erases_the_session_and_its_files_and_tells_the_hub(tmp_path: Path) -> None:
    published: list[EventRecord] = []
    registry, ledger = await _registry(tmp_path, published.append)
    worker = await registry.create(NewSessionRequest("", SID, {}, True, False, "", principal="alice"))
    other = await registry.create(NewSessionRequest("", str(uuid.uuid4()), {}, True, False, ""))
    paths = _leftovers(tmp_path, SID, Path(worker.record.cwd))
    theirs = _leftovers(tmp_path, other.session_id, Path(other.record.cwd))
    request_id = str(uuid.uuid4())

    with pytest.raises(SessionNotFound):  # someone else's: it does not exist for them
        await registry.delete(SID, principal=Principal("bob"), request_id=request_id)
    await registry.delete(SID, principal=ALICE, request_id=request_id, delete_workspace=True)

    assert not any(p.exists() for p in paths) and not Path(worker.record.cwd).exists()
    assert all(p.exists() for p in theirs)
    assert worker.gone and worker.process.stopped
    with pytest.raises(SessionNotFound):
        registry.get(SID)
    assert [w.session_id for w in registry.all()] == [other.session_id]
    [event] = published
    assert (event.kind, event.session_id, event.principal, event.data) == (
        "SESSION_DELETED",
        SID,
        "alice",
        {"owner": "alice"},
    )
    tombstone = await ledger.tombstone(SID)
    assert tombstone is not None and tombstone.erasure is None, "the erasure is finished"

    # A retry with the request id is answered as the first call was; anything else is refused.
    await registry.delete(SID, principal=ALICE, request_id=request_id, delete_workspace=True)
    with pytest.raises(RequestIdReused):
        await registry.delete(SID, principal=ALICE, request_id=request_id)
    with pytest.raises(SessionNotFound):
        await registry.delete(SID, principal=ALICE)
    with pytest.raises(SessionAlreadyExists):
        await registry.create(NewSessionRequest("", SID, {}, True, False, ""))
    assert len(published) == 1
    await ledger.close()


async def test_a_deletion_that_cannot_commit_leaves_the_session_as_it_was(tmp_path: Path) -> None:
    registry, ledger = await _registry(tmp_path)
    worker = await registry.create(NewSessionRequest("", SID, {}, True, False, ""))
    paths = _leftovers(tmp_path, SID, Path(worker.record.cwd))

    async def full_disk(*args: object, **kwargs: object) -> EventRecord:
        raise StorageUnavailable("disk full")

    erase = ledger.erase_session
    ledger.erase_session = full_disk  # type: ignore[method-assign]
    with pytest.raises(StorageUnavailable):
        await registry.delete(SID, request_id=str(uuid.uuid4()), delete_workspace=True)
    assert registry.get(SID) is worker and not worker.gone
    assert all(p.exists() for p in paths)
    assert await ledger.session(SID) is not None
    ledger.erase_session = erase  # type: ignore[method-assign]
    await registry.delete(SID)
    assert not any(p.exists() for p in paths[:3]) and paths[3].exists(), "the workspace stays unless asked"
    await ledger.close()


async def test_two_deletions_at_once_erase_once(tmp_path: Path) -> None:
    published: list[EventRecord] = []
    registry, ledger = await _registry(tmp_path, published.append)
    await registry.create(NewSessionRequest("", SID, {}, True, False, ""))
    request_id = str(uuid.uuid4())
    same = [registry.delete(SID, request_id=request_id) for _ in range(3)]
    results = await asyncio.gather(*same, registry.delete(SID), return_exceptions=True)
    assert results[:3] == [None, None, None]
    assert isinstance(results[3], SessionNotFound)
    assert len(published) == 1
    await ledger.close()


async def test_the_next_start_finishes_an_erasure_a_crash_interrupted(tmp_path: Path) -> None:
    registry, ledger = await _registry(tmp_path)
    cwd = tmp_path / "workspaces" / "a"
    await ledger.add_session(NewSession(SID, str(cwd), {}, True))
    await ledger.add_session(NewSession(str(uuid.uuid4()), str(tmp_path / "workspaces" / "b"), {}, True))
    paths = _leftovers(tmp_path, SID, cwd)
    # The commit happened; the server died before it erased anything.
    await ledger.erase_session(
        SID, NewEvent("SESSION_DELETED", SID), erasure={"cwd": str(cwd), "workspace": True}
    )
    await registry.load()
    assert not any(p.exists() for p in paths) and not cwd.exists()
    assert await ledger.unfinished_erasures() == []
    with pytest.raises(SessionNotFound):
        registry.get(SID)
    assert len(registry.all()) == 1
    await ledger.close()


async def test_a_deleted_session_s_workspace_is_taken_until_its_erasure_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry, ledger = await _registry(tmp_path)
    worker = await registry.create(NewSessionRequest("proj/a", SID, {}, True, False, ""))
    release = threading.Event()
    real = erasure.erase_cli_files

    def slow(*args: Any) -> list[Path]:
        release.wait(5)
        return real(*args)

    monkeypatch.setattr(erasure, "erase_cli_files", slow)
    deleting = asyncio.create_task(registry.delete(SID, delete_workspace=True))
    for _ in range(100):  # until the commit
        if worker.deleted:
            break
        await asyncio.sleep(0.01)
    with pytest.raises(SessionNotFound):
        registry.get(SID)
    for cwd in ("proj/a", "proj", "proj/a/b"):
        with pytest.raises(WorkspaceInUse):
            await registry.create(NewSessionRequest(cwd, str(uuid.uuid4()), {}, True, False, ""))
    release.set()
    await deleting
    fresh = await registry.create(NewSessionRequest("proj/a", str(uuid.uuid4()), {}, True, False, ""))
    assert Path(fresh.record.cwd).is_dir(), "made anew after the old one was erased"
    await ledger.close()
