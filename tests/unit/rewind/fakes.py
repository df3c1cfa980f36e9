"""The rewind tests' session: a fake CLI, a real SQLite ledger in tmp_path, and, when a test asks,
the server's real workspace snapshots (a git store in tmp_path).

The real CLI proves the rewinds themselves (tests/integration/test_rewind.py); here a small fake
answers rewind_files so failures can be provoked exactly where they hurt. The transcript is
written by the test (`Setup.turn`), or by the fake CLI in a real turn of the worker
(`Setup.prompt`), which snapshots the workspace at the turn's start and end as a server does.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agent_rewind.rewind.engine import RewindEngine, RewindRequest
from agent_rewind.rewind.outcome import Mode
from agent_rewind.rewind.undo import UndoRequest
from agent_rewind.sessions.adapter import AgentError, ClientSpec
from agent_rewind.sessions.events import ConversationAnswer, FilesAnswer, PromptEvent, ResultEvent, TurnEvent
from agent_rewind.sessions.snapshotting import Snapshots
from agent_rewind.sessions.worker import SessionWorker, WorkerContext
from agent_rewind.snapshots import Limits
from agent_rewind.store.ledger import EventRecord, NewSession, RewindRecord, SessionRecord
from agent_rewind.store.sqlite import SqliteLedger
from agent_rewind.transcript.paths import transcript_path

SOON = 2.0

# What an agent's turn writes: relative path -> content, None to delete it.
Edits = dict[str, str | None]


@dataclass
class Knobs:
    """How every fake process of a session behaves (a retry runs in a new process)."""

    apply_failures: int = 0  # restores that fail with the process dying mid-request
    refuse_apply: bool = False  # the restore itself is refused (no checkpoint)
    refuse_plan: str = ""  # a dry run is refused with this error (no checkpoint)
    apply_gate: asyncio.Event | None = None  # a restore waits here
    apply_entered: asyncio.Event = field(default_factory=asyncio.Event)
    applied: list[str] = field(default_factory=list)  # restores that happened
    log: list[str] = field(default_factory=list)  # everything the processes were asked, in order
    # What the CLI's checkpoints hold: a restore writes these (relative paths) into the workspace.
    checkpoint: Edits = field(default_factory=dict)
    # The files a dry run says a restore changes.
    files_changed: tuple[str, ...] = ("a.txt",)
    # What the agent does in the turn of a prompt (by its text).
    edits: dict[str, Edits] = field(default_factory=dict)


def write(root: Path, edits: Edits) -> None:
    for name, text in edits.items():
        path = root / name
        if text is None:
            path.unlink(missing_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)


class FakeClient:
    """Only what a rewind (and a plain turn) uses."""

    def __init__(self, spec: ClientSpec, knobs: Knobs, transcript: Path) -> None:
        self.spec = spec
        self.knobs = knobs
        self._transcript = transcript
        self._alive = False
        self.closed = False
        self.cuts: list[str] = []
        self._prompt = ("", "")
        # Where the CLI's next entry chains to.
        self._leaf = spec.resume_session_at if spec.resume else None

    @property
    def alive(self) -> bool:
        return self._alive

    @property
    def pid(self) -> int | None:
        return 1 if self._alive else None

    async def start(self) -> None:
        self._alive = True

    async def send_prompt(self, text: str, prompt_id: str) -> None:
        self.knobs.log.append(f"prompt {text}")
        self._prompt = (text, prompt_id)
        # The CLI writes the prompt to the transcript before it answers.
        with self._transcript.open("a") as f:
            f.write(json.dumps(_entry("user", prompt_id, self._leaf, text)) + "\n")
        self._leaf = prompt_id

    async def receive_turn(self, prompt_id: str) -> AsyncIterator[TurnEvent]:
        text, sent_id = self._prompt
        assert sent_id == prompt_id
        yield PromptEvent(prompt_id, text)
        write(self.spec.cwd, self.knobs.edits.get(text, {}))  # the agent's tools at work
        yield ResultEvent("success", False, 1, 5, 0.0, "ok", "end_turn")

    async def interrupt(self) -> None:
        return None

    async def rewind_files(self, message_id: str, *, dry_run: bool) -> FilesAnswer:
        knobs = self.knobs
        if dry_run and knobs.refuse_plan:
            return FilesAnswer(can_rewind=False, error=knobs.refuse_plan)
        if dry_run:
            return FilesAnswer(can_rewind=True, files_changed=knobs.files_changed, insertions=1, deletions=1)
        knobs.log.append(f"restore {message_id}")
        knobs.apply_entered.set()
        if knobs.apply_gate is not None:
            await knobs.apply_gate.wait()
        if knobs.apply_failures > 0:
            knobs.apply_failures -= 1
            self._alive = False
            raise AgentError("the process died")
        if knobs.refuse_apply:
            return FilesAnswer(can_rewind=False, error="No file checkpoint found for this message")
        write(self.spec.cwd, knobs.checkpoint)
        knobs.applied.append(message_id)
        knobs.log.append(f"restored {message_id}")
        return FilesAnswer(
            can_rewind=True, files_changed=knobs.files_changed, insertions=1, deletions=1, skipped_links=2
        )

    async def rewind_conversation(self, target: str, newest_prompt: str) -> ConversationAnswer:
        self.knobs.log.append(f"cut {target}")
        self.cuts.append(target)
        entries = [json.loads(line) for line in self._transcript.read_text().splitlines()]
        self._leaf = next(e["parentUuid"] for e in entries if e["uuid"] == target)
        return ConversationAnswer(True)

    async def kill(self) -> None:
        await self.close()

    async def close(self) -> None:
        self._alive = False
        self.closed = True


def _entry(kind: str, uid: str, parent: str | None, text: str = "") -> dict[str, Any]:
    if kind == "user":
        return {
            "type": "user",
            "uuid": uid,
            "parentUuid": parent,
            "promptSource": "sdk",
            "timestamp": "2026-11-29T10:00:00Z",
            "message": {"role": "user", "content": text},
        }
    return {
        "type": "assistant",
        "uuid": uid,
        "parentUuid": parent,
        "timestamp": "2026-11-29T10:00:01Z",
        "message": {"id": f"msg_{uid[:8]}", "role": "assistant", "content": [{"type": "text", "text": "ok"}]},
    }


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
        self.knobs = Knobs()
        self.clients: list[FakeClient] = []
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

        def factory(spec: ClientSpec) -> FakeClient:
            self.clients.append(FakeClient(spec, self.knobs, self.path))
            return self.clients[-1]

        if self.with_snapshots:
            self.snapshots = Snapshots(self.tmp_path / "snapshots", self.ledger, self.limits)
        engine = RewindEngine(self.ledger, self.published.append, self.snapshots)
        ctx = WorkerContext(
            ledger=self.ledger,
            client_factory=factory,
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
        with self.path.open("a") as f:
            f.write(json.dumps(_entry("user", prompt, self.leaf, text)) + "\n")
            f.write(json.dumps(_entry("assistant", answer, prompt)) + "\n")
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
