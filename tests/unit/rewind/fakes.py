"""The rewind tests' session: a fake CLI, a real SQLite ledger in tmp_path, and, when a test asks,
the server's real workspace snapshots (a git store in tmp_path).

The real CLI proves the rewinds themselves (tests/integration/test_rewind.py); here a small fake
answers rewind_files so failures can be provoked exactly where they hurt. The transcript is
written by the test (`Setup.turn`), or by the fake CLI in a real turn of the worker
(`Setup.prompt`), which snapshots the workspace at the turn's start and end as a server does.
The fake CLI is the shared one (agent_rewind.testing.fake_agent); here a turn writes no reply.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from agent_rewind.rewind.calls import RewindRequest, UndoRequest
from agent_rewind.rewind.engine import RewindEngine
from agent_rewind.rewind.outcome import Mode
from agent_rewind.sessions.turn_events import ResultEvent
from agent_rewind.sessions.worker import SessionWorker, WorkerContext
from agent_rewind.snapshots import Limits
from agent_rewind.snapshots.taking import Snapshots
from agent_rewind.store.ledger import EventRecord, NewSession, RewindRecord, SessionRecord
from agent_rewind.store.sqlite import SqliteLedger
from agent_rewind.testing.fake_agent import (
    Edits,
    FakeClient,
    FakeFactory,
    Knobs,
    append,
    prompt_entry,
    reply_entry,
)
from agent_rewind.transcript.paths import transcript_path

SOON = 2.0


def _prompt_alone(client: FakeClient) -> None:
    """A turn of these tests is its prompt (and the agent's edits): no reply is written."""
    client.replies = False


class Setup:
    """One session: its ledger, engine, worker (whose context resolves pending intents) and transcript.

    `snapshots`: the server keeps workspace snapshots (a real store under tmp_path), as one
    started with them does; `workspace_snapshots` and `checkpointing` are the session's own.
    """

    def __init__(
        self,
        tmp_path: Path,
        ledger: SqliteLedger,
        record: SessionRecord,
        snapshots: bool = False,
        limits: Limits | None = None,
    ) -> None:
        self.tmp_path = tmp_path
        self.ledger = ledger
        self.sid = record.session_id
        self.cwd = Path(record.cwd)
        self.knobs = Knobs(files_changed=("a.txt",), insertions=1, deletions=1, skipped_links=2)
        self.factory = FakeFactory(_prompt_alone, knobs=self.knobs, config_dir=tmp_path / "claude")
        self.clients = self.factory.clients
        self.published: list[EventRecord] = []
        self.with_snapshots = snapshots
        self.limits = limits or Limits()
        self.snapshots: Snapshots | None = None
        self.path = transcript_path(tmp_path / "claude", record.cwd, self.sid)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.engine, self.worker = self.server(record)
        self.prompts: list[str] = []
        self.last = ""
        self.leaf: str | None = None

    @classmethod
    async def create(
        cls,
        tmp_path: Path,
        *,
        snapshots: bool = False,
        workspace_snapshots: bool = False,
        checkpointing: bool = True,
        limits: Limits | None = None,
    ) -> Setup:
        ledger = await SqliteLedger.open(tmp_path / "ledger.sqlite3")
        cwd = tmp_path / "ws"
        cwd.mkdir()
        record = await ledger.add_session(
            NewSession(
                str(uuid.uuid4()), str(cwd), {}, checkpointing, workspace_snapshots=workspace_snapshots
            )
        )
        return cls(tmp_path, ledger, record, snapshots, limits)

    def server(self, record: SessionRecord) -> tuple[RewindEngine, SessionWorker]:
        """The engine and worker a server makes for the session (at a restart, new ones)."""

        if self.with_snapshots:
            self.snapshots = Snapshots(self.tmp_path / "snapshots", self.ledger, self.limits)
        engine = RewindEngine(self.ledger, self.published.append, self.snapshots)
        ctx = WorkerContext(
            ledger=self.ledger,
            client_factory=self.factory,
            cli_env={},
            claude_config_dir=self.tmp_path / "claude",
            idle_timeout=0,
            resolve_pending=engine.resolve_pending,
            snapshots=self.snapshots,
        )
        return engine, SessionWorker(record, ctx)

    async def restart(self, *, snapshots: bool | None = None) -> None:
        """As if the server died and started again: new worker and engine, same ledger and files
        (`snapshots`: the new server's setting, the same as before unless given)."""
        await self.worker.shutdown(0)
        if self.snapshots is not None:
            self.snapshots.close()
            self.snapshots = None
        if snapshots is not None:
            self.with_snapshots = snapshots
        record = await self.ledger.session(self.sid)
        assert record is not None
        self.engine, self.worker = self.server(record)

    def turn(self, text: str) -> str:
        prompt, answer = str(uuid.uuid4()), str(uuid.uuid4())
        append(self.path, prompt_entry(prompt, self.leaf, text), reply_entry(answer, prompt, "ok"))
        self.prompts.append(prompt)
        self.leaf = self.last = answer
        return prompt

    async def prompt(self, text: str, edits: Edits | None = None) -> str:
        """A real turn of the worker, in which the agent writes `edits`; its prompt id."""
        if edits is not None:
            self.knobs.edits[text] = edits
        async with asyncio.timeout(SOON):
            turn = await self.worker.start_turn(text)
            events = [e async for e in turn.events()]
        assert isinstance(events[-1], ResultEvent), events
        prompt_id: str = turn.prompt_id
        return prompt_id

    def read(self, name: str) -> str | None:
        path = self.cwd / name
        return path.read_text() if path.exists() else None

    def request(self, target: str, mode: Mode, **kw: Any) -> RewindRequest:
        return RewindRequest(session_id=self.sid, message_id=target, mode=mode, **kw)

    def undo_request(self, rewind_id: str, **kw: Any) -> UndoRequest:
        return UndoRequest(session_id=self.sid, rewind_id=rewind_id, **kw)

    async def texts(self) -> list[str]:
        return [p.text for p in (await self.worker.view()).points]

    async def pending(self) -> list[RewindRecord]:
        return await self.ledger.pending_rewinds(self.sid)

    async def resolve(self) -> None:
        """What runs before the session's next prompt or rewind."""
        async with asyncio.timeout(SOON), self.worker.lock:
            await self.engine.resolve_pending(self.worker)

    async def close(self) -> None:
        await self.worker.shutdown(0)
        if self.snapshots is not None:
            self.snapshots.close()
        await self.ledger.close()


MakeSetup = Callable[..., Awaitable[Setup]]


async def within(awaitable: Awaitable[Any], seconds: float = SOON) -> Any:
    async with asyncio.timeout(seconds):
        return await awaitable


def crash_once(monkeypatch: pytest.MonkeyPatch, ledger: SqliteLedger, method: str) -> None:
    """The server dies at this ledger write, once (the write does not happen)."""
    original = getattr(ledger, method)

    async def crash(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(ledger, method, original)
        raise RuntimeError(f"the server died at {method}")

    monkeypatch.setattr(ledger, method, crash)
