"""Every URL's cursor moves, written together: the moves that come while a write is under way go
in the next one, so ten URLs done with one event cost the ledger one or two transactions (one
sync to disk each), not ten, and no move waits for a timer."""

from __future__ import annotations

import asyncio

from agent_rewind.store.ledger import WebhookCursors, WebhookMove


class CursorWriter:
    def __init__(self, store: WebhookCursors) -> None:
        self._store = store
        self._pending: list[tuple[WebhookMove, asyncio.Future[bool]]] = []
        self._writing: asyncio.Task[None] | None = None

    async def advance(self, move: WebhookMove) -> bool:
        """Whether the move committed (False: the lease was not current)."""
        answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending.append((move, answer))
        if self._writing is None:
            self._writing = asyncio.create_task(self._write(), name="webhook-cursors")
        return await answer

    async def _write(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    moved = await self._store.advance_webhooks([move for move, _ in batch])
                except Exception as err:
                    for _, answer in batch:
                        if not answer.done():
                            answer.set_exception(err)
                    continue
                for (_, answer), result in zip(batch, moved, strict=True):
                    if not answer.done():
                        answer.set_result(result)
        finally:
            self._writing = None
            for _, answer in self._pending:  # only if this task itself was cancelled
                if not answer.done():
                    answer.cancel()
