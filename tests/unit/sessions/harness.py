"""The session worker's tests' harness: a fake AgentClient, a ledger that fails on demand, and
the helpers that read a turn's events within a bound.

No CLI process runs in these tests. The fake client (agent_rewind.testing.fake_agent) scripts a
turn (its prompt, then an optional wait on a gate, then an assistant message and a result),
writes the prompt and the reply to the session's transcript as the CLI would, and records how
the worker used it. The ledger is a real SQLite one in tmp_path, behind a wrapper that can make
any of its methods fail or wait. The fixtures that make both are in conftest.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from agent_rewind.errors import StorageUnavailable
from agent_rewind.sessions.turn_events import PromptEvent, TurnEvent
from agent_rewind.sessions.turns import Turn
from agent_rewind.sessions.worker import SessionWorker
from agent_rewind.store.ledger import Anchor, NewEvent, NewRewind
from agent_rewind.store.sqlite import SqliteLedger
from agent_rewind.testing.fake_agent import FakeClient, FakeFactory

# Generous bound on anything that should happen "at once"; a hang fails instead of blocking.
SOON = 2.0
CLI_ENV = {"CLAUDE_CONFIG_DIR": "/state/claude", "HOME": "/state/home"}


class FlakyLedger:
    """The SQLite ledger, with any method made to fail (`fail`) or wait (`gates`) on demand."""

    def __init__(self, inner: SqliteLedger) -> None:
        self.inner = inner
        self.fail: set[str] = set()
        self.gates: dict[str, asyncio.Event] = {}
        self.entered: dict[str, asyncio.Event] = {}
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)
        if not callable(method):
            return method

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            self.entered.setdefault(name, asyncio.Event()).set()
            gate = self.gates.get(name)
            if gate is not None:
                await gate.wait()
            if name in self.fail:
                # What SqliteLedger raises for a disk that is full or failing.
                raise StorageUnavailable(f"disk I/O error ({name})")
            return await method(*args, **kwargs)

        return call


MakeWorker = Callable[..., Awaitable[tuple[SessionWorker, FakeFactory]]]


async def within(awaitable: Awaitable[Any], seconds: float = SOON) -> Any:
    async with asyncio.timeout(seconds):
        return await awaitable


async def collect(turn: Turn) -> list[TurnEvent]:
    async def run() -> list[TurnEvent]:
        return [e async for e in turn.events()]

    result: list[TurnEvent] = await within(run())
    return result


async def first_event(turn: Turn) -> TurnEvent:
    """The turn's first event (its prompt, published once the prompt reached the CLI)."""
    events = turn.events()
    try:
        event: TurnEvent = await within(anext(events))
    finally:
        await events.aclose()
    return event


async def sent(accepting: Awaitable[Turn]) -> Turn:
    """Accepts a prompt and waits until it reached the (fake) CLI."""
    turn: Turn = await within(accepting)
    assert isinstance(await first_event(turn), PromptEvent)
    assert turn.sent
    return turn


def setup(**knobs: Any) -> FakeFactory:
    """A factory whose clients all get these knobs."""

    def apply(client: FakeClient) -> None:
        for name, value in knobs.items():
            setattr(client, name, value)

    return FakeFactory(apply)


def kinds(events: list[TurnEvent]) -> list[str]:
    return [type(e).__name__ for e in events]


async def _cut_recorded(ledger: FlakyLedger, sid: str, anchor: Anchor) -> None:
    await ledger.begin_rewind(NewRewind(anchor.rewind_id, sid, anchor.target_message_id, "conversation", {}))
    await ledger.complete_rewind(anchor.rewind_id, {}, anchor, NewEvent("REWOUND", sid, anchor.rewind_id))
