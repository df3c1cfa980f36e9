"""The registry: loading sessions from the ledger, workspace checks, paging."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_rewind.config import Config
from agent_rewind.errors import InvalidArgument, WorkspaceInUse, WorkspaceOutsideRoot
from agent_rewind.sessions.registry import NewSessionRequest, SessionRegistry
from agent_rewind.sessions.worker import WorkerContext
from agent_rewind.store.ledger import NewSession
from agent_rewind.store.sqlite import SqliteLedger

SID = "0b7f3c1e-5a8d-4d6e-9f10-2a3b4c5d6e7f"


def _factory(spec: object) -> object:
    raise AssertionError("no process is started here")


async def _registry(tmp_path: Path, **config: object) -> tuple[SessionRegistry, SqliteLedger]:
    cfg = Config(state_dir=tmp_path, **config).resolved()  # type: ignore[arg-type]
    ledger = await SqliteLedger.open(cfg.ledger_path)
    ctx = WorkerContext(ledger, _factory, {}, cfg.claude_config_dir, 0)  # type: ignore[arg-type]
    return SessionRegistry(cfg, ledger, ctx), ledger


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
