"""The rewind engine's bookkeeping with a fake CLI: intents, failures and recovery.

The real CLI proves the rewinds themselves (tests/integration/test_rewind.py); here a small fake
answers rewind_files so failures can be provoked exactly where they hurt.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent_rewind.errors import AgentRewindError, AgentUnavailable, RewindConflict
from agent_rewind.rewind.engine import Mode, RewindEngine, RewindRequest
from agent_rewind.sessions.adapter import AgentError, ClientSpec
from agent_rewind.sessions.events import ConversationAnswer, FilesAnswer, TurnEvent
from agent_rewind.sessions.worker import SessionWorker, WorkerContext
from agent_rewind.store.ledger import Anchor, Ledger
from agent_rewind.transcript.paths import transcript_path


class FilesClient:
    """Only what a rewind uses: a live process that answers rewind_files."""

    def __init__(self, spec: ClientSpec, fail_apply: bool) -> None:
        self.spec = spec
        self.fail_apply = fail_apply
        self.applied: list[str] = []
        self._alive = False

    @property
    def alive(self) -> bool:
        return self._alive

    @property
    def pid(self) -> int | None:
        return 1 if self._alive else None

    async def start(self) -> None:
        self._alive = True

    async def send_prompt(self, text: str) -> None:
        raise AssertionError("no prompts here")

    async def receive_turn(self) -> AsyncIterator[TurnEvent]:
        raise AssertionError("no turns here")
        yield  # pragma: no cover

    async def interrupt(self) -> None:
        return None

    async def rewind_files(self, message_id: str, *, dry_run: bool) -> FilesAnswer:
        if not dry_run:
            if self.fail_apply:
                raise AgentError("the process died")
            self.applied.append(message_id)
        return FilesAnswer(can_rewind=True, files_changed=("a.txt",), insertions=1, deletions=1)

    async def rewind_conversation(self, target: str, newest_prompt: str) -> ConversationAnswer:
        return ConversationAnswer(True)

    async def close(self) -> None:
        self._alive = False


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
    def __init__(self, tmp_path: Path, *, fail_apply: bool = False) -> None:
        self.ledger = Ledger(tmp_path / "ledger.sqlite3")
        sid = str(uuid.uuid4())
        cwd = tmp_path / "ws"
        cwd.mkdir()
        record = self.ledger.add_session(sid, str(cwd), {}, True, None)
        self.clients: list[FilesClient] = []

        def factory(spec: ClientSpec) -> FilesClient:
            self.clients.append(FilesClient(spec, fail_apply))
            return self.clients[-1]

        self.ctx = WorkerContext(self.ledger, factory, {}, tmp_path / "claude", 0)
        self.worker = SessionWorker(record, self.ctx)
        self.engine = RewindEngine(self.ledger)
        self.path = transcript_path(tmp_path / "claude", str(cwd), sid)
        self.path.parent.mkdir(parents=True)
        self.prompts: list[str] = []
        self.last = ""
        self.leaf: str | None = None

    def turn(self, text: str) -> str:
        prompt, answer = str(uuid.uuid4()), str(uuid.uuid4())
        with self.path.open("a") as f:
            f.write(json.dumps(_entry("user", prompt, self.leaf, text)) + "\n")
            f.write(json.dumps(_entry("assistant", answer, prompt)) + "\n")
        self.prompts.append(prompt)
        self.leaf = self.last = answer
        return prompt

    def request(self, target: str, mode: Mode, **kw: Any) -> RewindRequest:
        return RewindRequest(session_id=self.worker.session_id, message_id=target, mode=mode, **kw)

    async def texts(self) -> list[str]:
        return [p.text for p in (await self.worker.view()).points]


async def test_a_files_apply_that_fails_leaves_no_intent_behind(tmp_path: Path) -> None:
    s = Setup(tmp_path, fail_apply=True)
    s.turn("one")
    two = s.turn("two")
    s.turn("three")
    with pytest.raises(AgentUnavailable):
        await s.engine.rewind(s.worker, s.request(two, Mode.BOTH))
    assert s.ledger.pending_rewinds() == [], "nothing was applied, so nothing is left to finish"
    assert s.ledger.anchor(s.worker.session_id) is None
    # A later recovery (a restart) changes nothing.
    await s.engine.recover({s.worker.session_id: s.worker})
    assert await s.texts() == ["one", "two", "three"]


async def test_recovery_drops_an_intent_the_conversation_has_moved_past(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    s.turn("one")
    two = s.turn("two")
    s.ledger.begin_rewind(
        rewind_id="r1",
        session_id=s.worker.session_id,
        request_id=None,
        fingerprint="f",
        message_id=two,
        mode="conversation",
        principal="",
        plan={
            "target": two,
            "files": False,
            "anchor": Anchor(s.worker.session_id, "not-on-the-chain", two, 0, None, "r1").__dict__,
            "outcome": {
                "rewind_id": "r1",
                "last_message_id": "",
                "files": {
                    "requested": False,
                    "can_rewind": False,
                    "files_changed": [],
                    "insertions": 0,
                    "deletions": 0,
                    "skipped_links": 0,
                    "refusal": None,
                },
                "conversation": {
                    "requested": True,
                    "can_rewind": True,
                    "rewound": False,
                    "messages_dropped": 2,
                    "refusal": None,
                },
            },
        },
    )
    await s.engine.recover({s.worker.session_id: s.worker})
    assert s.ledger.pending_rewinds() == []
    assert s.ledger.anchor(s.worker.session_id) is None
    assert await s.texts() == ["one", "two"]


async def test_a_recorded_files_half_is_finished_not_redone(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    s.turn("one")
    two = s.turn("two")
    original = s.ledger.complete_rewind

    def crash(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("crash after the files half")

    s.ledger.complete_rewind = crash  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        await s.engine.rewind(s.worker, s.request(two, Mode.BOTH))
    s.ledger.complete_rewind = original  # type: ignore[method-assign]
    [pending] = s.ledger.pending_rewinds()
    assert pending.files_applied
    applied_before = sum(len(c.applied) for c in s.clients)
    await s.engine.recover({s.worker.session_id: s.worker})
    assert sum(len(c.applied) for c in s.clients) == applied_before, "files are not restored twice"
    assert s.ledger.pending_rewinds() == []
    assert await s.texts() == ["one"]


async def test_a_stale_expectation_is_a_conflict_even_when_the_target_was_dropped(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    s.turn("one")
    two = s.turn("two")
    three = s.turn("three")
    seen_last = s.last
    await s.engine.rewind(s.worker, s.request(two, Mode.CONVERSATION))  # another client's rewind
    with pytest.raises(RewindConflict) as caught:
        await s.engine.rewind(
            s.worker, s.request(three, Mode.CONVERSATION, expected_last_message_id=seen_last)
        )
    assert caught.value.metadata["last_message_id"] == (await s.worker.view()).last_message_id
    assert isinstance(caught.value, AgentRewindError)
