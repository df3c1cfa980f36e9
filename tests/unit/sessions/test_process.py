"""AgentProcess (sessions/process.py): one live CLI process per session, never two at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from agent_rewind.errors import AgentUnavailable, ShuttingDown
from agent_rewind.sessions.adapter import AgentError, ClientSpec
from agent_rewind.sessions.process import AgentProcess
from agent_rewind.sessions.turn_events import ConversationAnswer, FilesAnswer, TurnEvent

SID = "0b7f3c1e-5a8d-4d6e-9f10-2a3b4c5d6e7f"
SOON = 2.0
SPEC = ClientSpec(session_id=SID, cwd=Path("/ws"), options={}, checkpointing=True, env={}, resume=False)


class Client:
    """Only the lifecycle of a process."""

    def __init__(self, spec: ClientSpec, pid: int, log: list[str]) -> None:
        self.spec = spec
        self._pid = pid
        self._log = log
        self._alive = False
        self.start_error: AgentError | None = None
        self.start_gate: asyncio.Event | None = None
        self.close_gate: asyncio.Event | None = None
        self.starting = asyncio.Event()
        self.closing = asyncio.Event()
        self.closed = False
        self.killed = False

    @property
    def alive(self) -> bool:
        return self._alive

    @property
    def pid(self) -> int | None:
        return self._pid if self._alive else None

    async def start(self) -> None:
        self._log.append(f"start {self._pid}")
        self.starting.set()
        if self.start_gate is not None:
            await self.start_gate.wait()
        if self.start_error is not None:
            raise self.start_error
        self._alive = True

    async def send_prompt(self, text: str, prompt_id: str) -> None:
        raise AssertionError("not used")

    async def receive_turn(self, prompt_id: str) -> AsyncIterator[TurnEvent]:
        raise AssertionError("not used")
        yield  # pragma: no cover

    async def interrupt(self) -> None:
        raise AssertionError("not used")

    async def rewind_files(self, message_id: str, *, dry_run: bool) -> FilesAnswer:
        raise AssertionError("not used")

    async def rewind_conversation(self, target: str, newest_prompt: str) -> ConversationAnswer:
        raise AssertionError("not used")

    async def kill(self) -> None:
        self._log.append(f"kill {self._pid}")
        self.killed = True
        self._alive = False
        await self.close()

    async def close(self) -> None:
        self.closing.set()
        if self.close_gate is not None:
            await self.close_gate.wait()
        self._alive = False
        if not self.closed:
            self._log.append(f"closed {self._pid}")
        self.closed = True


class Factory:
    def __init__(self) -> None:
        self.clients: list[Client] = []
        self.log: list[str] = []
        self.specs: list[ClientSpec] = []
        self.setup: dict[int, dict[str, Any]] = {}  # client number -> attributes to set
        self.made = asyncio.Event()

    def __call__(self, spec: ClientSpec) -> Client:
        number = len(self.clients)
        client = Client(spec, 100 + number, self.log)
        for name, value in self.setup.get(number, {}).items():
            setattr(client, name, value)
        self.clients.append(client)
        self.specs.append(spec)
        self.made.set()
        return client


@pytest.fixture
def factory() -> Factory:
    return Factory()


@pytest.fixture
def process(factory: Factory) -> AgentProcess:
    return AgentProcess(SID, factory, structlog.get_logger("test"))


async def within(awaitable: Any, seconds: float = SOON) -> Any:
    async with asyncio.timeout(seconds):
        return await awaitable


async def test_start_makes_the_live_client(process: AgentProcess, factory: Factory) -> None:
    assert not process.alive and process.pid is None and process.client is None
    client = await within(process.start(SPEC))
    assert client is factory.clients[0] is process.client
    assert factory.specs == [SPEC]
    assert process.alive and process.pid == 100


async def test_a_start_that_fails_is_agent_unavailable_and_leaves_no_client(
    process: AgentProcess, factory: Factory
) -> None:
    factory.setup[0] = {"start_error": AgentError("the Claude Code CLI did not start: boom")}
    with pytest.raises(AgentUnavailable) as caught:
        await within(process.start(SPEC))
    assert "boom" in caught.value.message
    assert caught.value.metadata == {"session_id": SID}
    assert process.client is None and not process.alive
    # The next start tries again.
    await within(process.start(SPEC))
    assert process.alive


async def test_let_go_ends_the_process_in_the_background_and_settle_waits_for_it(
    process: AgentProcess, factory: Factory
) -> None:
    gate = asyncio.Event()
    factory.setup[0] = {"close_gate": gate}
    client = await within(process.start(SPEC))
    process.let_go()
    assert process.client is None and not process.alive and process.pid is None
    await within(client.closing.wait())
    settled = asyncio.create_task(process.settle())
    await asyncio.sleep(0.02)  # nothing to await: settle must still be waiting
    assert not settled.done()
    gate.set()
    await within(settled)
    assert client.closed


async def test_let_go_and_settle_without_a_process_do_nothing(
    process: AgentProcess, factory: Factory
) -> None:
    process.let_go()
    await within(process.settle())
    assert factory.clients == []


async def test_a_new_process_starts_only_after_the_one_let_go_has_exited(
    process: AgentProcess, factory: Factory
) -> None:
    """Two processes never write one transcript at once."""
    gate = asyncio.Event()
    factory.setup[0] = {"close_gate": gate}
    await within(process.start(SPEC))
    process.let_go()
    starting = asyncio.create_task(process.start(SPEC))
    await within(factory.clients[0].closing.wait())
    await asyncio.sleep(0.02)  # nothing to await: the new process must not be asked for yet
    assert len(factory.clients) == 1
    gate.set()
    second = await within(starting)
    assert second is factory.clients[1]
    assert factory.log == ["start 100", "closed 100", "start 101"]


async def test_start_over_a_dead_process_lets_it_go_first(process: AgentProcess, factory: Factory) -> None:
    gate = asyncio.Event()
    factory.setup[0] = {"close_gate": gate}
    first = await within(process.start(SPEC))
    first._alive = False  # the CLI exited on its own
    assert not process.alive
    starting = asyncio.create_task(process.start(SPEC))
    await within(first.closing.wait())
    assert len(factory.clients) == 1
    gate.set()
    second = await within(starting)
    assert process.client is second is not first
    assert factory.log == ["start 100", "closed 100", "start 101"]


async def test_kill_ends_the_process_at_once(process: AgentProcess, factory: Factory) -> None:
    client = await within(process.start(SPEC))
    await within(process.kill())
    assert client.killed and client.closed
    assert process.client is None and not process.alive
    await within(process.kill())  # nothing left to kill
    assert factory.log == ["start 100", "kill 100", "closed 100"]


async def test_stopped_refuses_to_start(process: AgentProcess, factory: Factory) -> None:
    process.stopped = True
    with pytest.raises(ShuttingDown):
        await within(process.start(SPEC))
    assert factory.clients == []


async def test_a_process_that_finishes_starting_after_the_stop_is_closed(
    process: AgentProcess, factory: Factory
) -> None:
    gate = asyncio.Event()
    factory.setup[0] = {"start_gate": gate}
    starting = asyncio.create_task(process.start(SPEC))
    await within(factory.made.wait())
    await within(factory.clients[0].starting.wait())
    process.stopped = True
    gate.set()
    with pytest.raises(ShuttingDown):
        await within(starting)
    assert factory.clients[0].closed
    assert process.client is None and process.pid is None
