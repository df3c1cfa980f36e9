"""A fake Claude Code client for unit tests: `AgentClient` over a few flags, no process.

It writes the session's transcript as the CLI does (the prompt when it is sent, under the id the
service chose; the model's reply when the turn ends), answers the control requests a rewind
makes, and records how it was used. The real CLI proves the real behaviour (tests/integration);
this one lets a unit test provoke exactly the failure it is about.

- `FakeClient`: one process. Its knobs (set by a test, or by its factory's `setup`) shape its
  turns: gates to hold a turn or a start, errors, no echo, an ignored Interrupt, a refused cut.
- `Knobs`: what every process of one session does to files and what they were all asked, in
  order: a retry runs in a new process, and what the test set up must hold for it too.
- `FakeFactory`: the `WorkerContext.client_factory`; it numbers the processes it makes (their
  pids) and lets a test wait for a start or a close.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent_rewind.sessions.adapter import AgentError, ClientSpec
from agent_rewind.sessions.turn_events import (
    AssistantEvent,
    ConversationAnswer,
    FilesAnswer,
    PromptEvent,
    ResultEvent,
    TurnEvent,
)
from agent_rewind.transcript.paths import transcript_path

# What an agent's turn writes: relative path -> content, None to delete it.
Edits = dict[str, str | None]

# How long `FakeFactory.until` waits by default: generous for what should happen "at once".
SOON = 2.0


def prompt_entry(uid: str, parent: str | None, text: str) -> dict[str, Any]:
    """A prompt as the CLI writes it to the transcript."""
    return {
        "type": "user",
        "uuid": uid,
        "parentUuid": parent,
        "isSidechain": False,
        "promptSource": "sdk",
        "message": {"role": "user", "content": text},
        "timestamp": _now(),
    }


def reply_entry(uid: str, parent: str, text: str) -> dict[str, Any]:
    """The model's answer as the CLI writes it to the transcript."""
    return {
        "type": "assistant",
        "uuid": uid,
        "parentUuid": parent,
        "isSidechain": False,
        "message": {"id": f"msg_{uid[:8]}", "role": "assistant", "content": [{"type": "text", "text": text}]},
        "timestamp": _now(),
    }


def _now() -> str:
    """The time as the CLI writes it ("2026-11-29T23:27:38.962Z"): prompts sent one after another
    have increasing times, as retention (storage/retention.py) relies on."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def append(path: Path, *entries: dict[str, Any]) -> None:
    """Appends transcript entries, as the CLI does."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for entry in entries:
            f.write(json.dumps(entry) + "\n")


def write(root: Path, edits: Edits) -> None:
    """Makes `edits` to the files under `root`."""
    for name, text in edits.items():
        path = root / name
        if text is None:
            path.unlink(missing_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)


@dataclass
class Knobs:
    """How every fake process of a session treats files, and what they were all asked."""

    apply_failures: int = 0  # restores that fail with the process dying mid-request
    refuse_apply: bool = False  # the restore itself is refused (no checkpoint)
    refuse_plan: str = ""  # a dry run is refused with this error (no checkpoint)
    apply_gate: asyncio.Event | None = None  # a restore waits here
    apply_entered: asyncio.Event = field(default_factory=asyncio.Event)
    applied: list[str] = field(default_factory=list)  # restores that happened
    log: list[str] = field(default_factory=list)  # everything the processes were asked, in order
    # What the CLI's checkpoints hold: a restore writes these (relative paths) into the workspace.
    checkpoint: Edits = field(default_factory=dict)
    # What a restore and its dry run say it changes, and what a restore says it skipped.
    files_changed: tuple[str, ...] = ()
    insertions: int = 0
    deletions: int = 0
    skipped_links: int = 0
    # What the agent does in the turn of a prompt (by its text).
    edits: dict[str, Edits] = field(default_factory=dict)


class FakeClient:
    """An AgentClient whose process is a few flags, and which writes the transcript as the CLI does."""

    def __init__(self, spec: ClientSpec, pid: int, transcript: Path, factory: FakeFactory) -> None:
        self.spec = spec
        self._pid = pid
        self._transcript = transcript
        self._factory = factory
        self.knobs = factory.knobs
        self._alive = False
        self.started = False
        self.closed = False
        self.killed = False
        self.prompts: list[str] = []
        self.prompt_ids: list[str] = []
        self.interrupts = 0
        # How many prompts the CLI had been sent at each Interrupt it got.
        self.interrupted_after: list[int] = []
        self.turn_cancelled = False
        # The prompt each cut was asked to drop, and with it the newest prompt the caller named.
        self.cuts: list[str] = []
        self.cut_calls: list[tuple[str, str]] = []
        # Where the next entry chains to: the CLI resumes at resume_session_at.
        self.leaf = spec.resume_session_at if spec.resume else None
        # Behaviour knobs, set by a test (or the factory's setup) before use.
        self.start_error: AgentError | None = None
        self.start_gate: asyncio.Event | None = None
        self.turn_gate: asyncio.Event | None = None  # the turn waits here after its prompt
        self.turn_error: AgentError | None = None  # raised after the prompt (and the gate)
        self.echo = True  # the CLI echoes the prompt at once; else only after the gate
        self.only_result = False  # the CLI answers with a result alone (a command: no echo, no reply)
        self.replies = True  # the model's answer is written and streamed; else a turn is its prompt alone
        self.ignore_interrupt = False
        self.interrupt_error: AgentError | None = None
        self.cut_answer = ConversationAnswer(True)
        self.cut_error: AgentError | None = None
        # Seconds after the prompt is sent before the CLI writes it to the transcript (None: at once).
        self.transcript_delay: float | None = None
        self._stop = asyncio.Event()  # an honoured interrupt, a kill or a close ends the wait
        self._interrupted = False

    @property
    def alive(self) -> bool:
        return self._alive

    @property
    def pid(self) -> int | None:
        return self._pid if self.started else None

    def die(self) -> None:
        """The CLI process exits on its own."""
        self._alive = False
        self._stop.set()

    async def start(self) -> None:
        await self._factory.changed_now(lambda: self._factory.starting.append(self))
        if self.start_gate is not None:
            await self.start_gate.wait()
        if self.start_error is not None:
            raise self.start_error
        self.started = True
        self._alive = True

    async def send_prompt(self, text: str, prompt_id: str) -> None:
        if not self._alive:
            raise AgentError("not running")
        self.knobs.log.append(f"prompt {text}")
        self.prompts.append(text)
        self.prompt_ids.append(prompt_id)
        entry = prompt_entry(prompt_id, self.leaf, text)
        if self.transcript_delay is None:
            append(self._transcript, entry)
        else:
            asyncio.get_running_loop().call_later(self.transcript_delay, append, self._transcript, entry)
        self.leaf = prompt_id

    async def receive_turn(self, prompt_id: str) -> AsyncIterator[TurnEvent]:
        assert self.prompt_ids and prompt_id == self.prompt_ids[-1], "the turn of the prompt just sent"
        n = len(self.prompts)
        text = self.prompts[-1]
        if self.only_result:
            yield ResultEvent("success", False, 0, 1, 0.0, "", "")
            return
        if self.echo:
            yield PromptEvent(prompt_id, text)
        try:
            await self._wait_for_gate()
        except asyncio.CancelledError:
            self.turn_cancelled = True
            raise
        if not self._alive:
            raise AgentError("the Claude Code process exited during the turn")
        if self.turn_error is not None:
            raise self.turn_error
        if not self.echo:
            yield PromptEvent(prompt_id, text)
        if self._interrupted:
            self._interrupted = False
            yield ResultEvent("error_during_execution", False, 1, 5, 0.0, "", "")
            return
        write(self.spec.cwd, self.knobs.edits.get(text, {}))  # the agent's tools at work
        if self.replies:
            reply = str(uuid.uuid4())
            append(self._transcript, reply_entry(reply, prompt_id, f"echo: {text}"))
            self.leaf = reply
            yield AssistantEvent(reply, f"msg_{self._pid}_{n}", f"echo: {text}")
        yield ResultEvent("success", False, 1, 5, 0.0, f"echo: {text}", "end_turn")

    async def _wait_for_gate(self) -> None:
        if self.turn_gate is None:
            return
        waiters = [asyncio.ensure_future(self.turn_gate.wait()), asyncio.ensure_future(self._stop.wait())]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    async def interrupt(self) -> None:
        self.interrupts += 1
        self.interrupted_after.append(len(self.prompts))
        if self.interrupt_error is not None:
            raise self.interrupt_error
        if not self.ignore_interrupt:
            self._interrupted = True
            self._stop.set()

    async def rewind_files(self, message_id: str, *, dry_run: bool) -> FilesAnswer:
        knobs = self.knobs
        if dry_run and knobs.refuse_plan:
            return FilesAnswer(can_rewind=False, error=knobs.refuse_plan)
        changes = FilesAnswer(
            can_rewind=True,
            files_changed=knobs.files_changed,
            insertions=knobs.insertions,
            deletions=knobs.deletions,
        )
        if dry_run:
            return changes
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
        return replace(changes, skipped_links=knobs.skipped_links)

    async def rewind_conversation(self, target: str, newest_prompt: str) -> ConversationAnswer:
        self.knobs.log.append(f"cut {target}")
        self.cuts.append(target)
        self.cut_calls.append((target, newest_prompt))
        if self.cut_error is not None:
            raise self.cut_error
        if self.cut_answer.rewound:
            # The CLI's next entry chains to what preceded the prompt cut.
            for line in self._transcript.read_text().splitlines() if self._transcript.exists() else ():
                entry = json.loads(line)
                if entry.get("uuid") == target:
                    self.leaf = entry.get("parentUuid")
        return self.cut_answer

    async def kill(self) -> None:
        self.killed = True
        await self.close()

    async def close(self) -> None:
        self._alive = False
        self._stop.set()
        await self._factory.changed_now(lambda: setattr(self, "closed", True))


class FakeFactory:
    """The WorkerContext.client_factory: records every spec and client it made.

    `setup` gives each new client its knobs; `knobs` is what all of them share (a new `Knobs`
    when not given); `config_dir` is the CLI's configuration directory, under which each
    session's transcript is written (a test may set it after making the factory).
    """

    def __init__(
        self,
        setup: Callable[[FakeClient], None] | None = None,
        *,
        knobs: Knobs | None = None,
        config_dir: Path | None = None,
    ) -> None:
        self.setup = setup
        self.knobs = knobs or Knobs()
        self.specs: list[ClientSpec] = []
        self.clients: list[FakeClient] = []
        self.starting: list[FakeClient] = []
        self.config_dir = config_dir
        self._changed = asyncio.Condition()

    def __call__(self, spec: ClientSpec) -> FakeClient:
        assert self.config_dir is not None, "the factory needs the CLI's configuration directory"
        path = transcript_path(self.config_dir, str(spec.cwd), spec.session_id)
        client = FakeClient(spec, 1000 + len(self.clients), path, self)
        if self.setup is not None:
            self.setup(client)
        self.specs.append(spec)
        self.clients.append(client)
        return client

    @property
    def last(self) -> FakeClient:
        return self.clients[-1]

    async def changed_now(self, change: Callable[[], Any]) -> None:
        async with self._changed:
            change()
            self._changed.notify_all()

    async def until(self, condition: Callable[[], bool], seconds: float = SOON) -> None:
        """Waits until a client's start or close makes `condition` true."""
        async with asyncio.timeout(seconds), self._changed:
            await self._changed.wait_for(condition)
