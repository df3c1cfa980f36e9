"""A turn's event log: written by the task running the turn, read by any number of listeners.

The turn runs on whether or not anyone listens (API.md: a turn a client stops listening
to runs on to its end), so events are kept until the turn ends and readers replay them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from agent_rewind.errors import AgentRewindError
from agent_rewind.sessions.events import TurnEvent


class Turn:
    def __init__(self, session_id: str, text: str) -> None:
        self.session_id = session_id
        self.text = text
        self.prompt_id = ""
        # True once the prompt reached the CLI; before that the CLI may still be starting.
        self.sent = False
        self.interrupted = False
        self._events: list[TurnEvent] = []
        self._error: AgentRewindError | None = None
        self._done = False
        self._changed = asyncio.Condition()

    @property
    def done(self) -> bool:
        return self._done

    async def publish(self, event: TurnEvent) -> None:
        async with self._changed:
            self._events.append(event)
            self._changed.notify_all()

    async def finish(self, error: AgentRewindError | None = None) -> None:
        async with self._changed:
            self._error = error
            self._done = True
            self._changed.notify_all()

    async def wait(self) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self._done)

    async def events(self) -> AsyncIterator[TurnEvent]:
        """Every event of the turn from its start; raises the turn's error at the end."""
        index = 0

        def ready() -> bool:
            return index < len(self._events) or self._done

        while True:
            async with self._changed:
                await self._changed.wait_for(ready)
                batch = self._events[index:]
                finished, error = self._done, self._error
            for event in batch:
                yield event
            index += len(batch)
            if finished and index >= len(self._events):
                if error is not None:
                    raise error
                return
