"""Turns: a turn's event log, and what a retried Prompt (same request_id) gets back.

A turn is written by the task that runs it and read by any number of listeners. It runs on
whether or not anyone listens (API.md: a turn a client stops listening to runs on to its end), so
its events are kept until it ends and readers replay them from the start. A turn that ended
before the server restarted is known only from the ledger: its prompt and its result are replayed
from there.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from agent_rewind.errors import AgentRewindError
from agent_rewind.sessions.turn_events import PromptEvent, ResultEvent, TurnEvent

# Runs under the session lock before the prompt is sent (PromptRequest.rewind); returns the event
# the stream opens with.
Prelude = Callable[[], Awaitable[TurnEvent | None]]


class Turn:
    def __init__(
        self, session_id: str, text: str, *, request_id: str = "", prelude: Prelude | None = None
    ) -> None:
        self.session_id = session_id
        self.text = text
        self.request_id = request_id
        self.prelude = prelude
        # Chosen here and sent with the prompt: the CLI makes it the prompt's transcript uuid, so
        # the rewind point id is known before the model answers.
        self.prompt_id = str(uuid.uuid4())
        # True once the prompt reached the CLI; before that the CLI may still be starting.
        self.sent = False
        # True once the prompt event was published (from the transcript, or the CLI's echo).
        self.announced = False
        # Asked to stop. Asked before the prompt reached the CLI, the Interrupt is sent with it.
        self.interrupted = False
        # Set when the turn ignored Interrupt and its process was killed.
        self.killed = False
        self.watchdog: asyncio.Task[None] | None = None
        self._events: list[TurnEvent] = []
        self._error: AgentRewindError | None = None
        self._done = False
        self._changed = asyncio.Condition()

    @property
    def done(self) -> bool:
        return self._done

    @property
    def result(self) -> ResultEvent | None:
        last = self._events[-1] if self._events else None
        return last if isinstance(last, ResultEvent) else None

    @property
    def error(self) -> AgentRewindError | None:
        return self._error

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

    def record(self) -> dict[str, Any]:
        """What the ledger keeps of a finished turn for a retry with its request_id."""
        out: dict[str, Any] = {"prompt_id": self.prompt_id if self.sent else ""}
        if self.result is not None:
            r = self.result
            out["result"] = {
                "subtype": r.subtype,
                "is_error": r.is_error,
                "num_turns": r.num_turns,
                "duration_ms": r.duration_ms,
                "total_cost_usd": r.total_cost_usd,
                "result": r.result,
                "stop_reason": r.stop_reason,
                "interrupted": r.interrupted,
            }
        if self._error is not None:
            out["error"] = error_record(self._error)
        return out

    @classmethod
    async def replayed(cls, session_id: str, text: str, request_id: str, record: dict[str, Any]) -> Turn:
        """A turn that ended before this server started, as its ledger record tells it."""
        turn = cls(session_id, text, request_id=request_id)
        turn.prompt_id = str(record.get("prompt_id") or "")
        turn.sent = bool(turn.prompt_id)
        if turn.prompt_id:
            await turn.publish(PromptEvent(turn.prompt_id, text))
        if isinstance(record.get("result"), dict):
            await turn.publish(ResultEvent(**record["result"]))
        error = None
        if isinstance(record.get("error"), dict):
            raw = record["error"]
            metadata = raw.get("metadata") if isinstance(raw.get("metadata"), dict) else {}
            error = AgentRewindError(
                str(raw.get("message", "")), metadata={str(k): str(v) for k, v in metadata.items()}
            )
            error.reason = str(raw.get("reason", "INTERNAL"))
        await turn.finish(error)
        return turn


def error_record(error: AgentRewindError) -> dict[str, Any]:
    """An error as the ledger keeps it, to be replayed to a retry."""
    return {"reason": error.reason, "message": error.message, "metadata": dict(error.metadata)}
