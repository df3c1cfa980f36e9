"""Every configured URL's delivery loop (`delivery.Deliverer`), started and stopped together.

Each loop is detached work (`tasks.detach`), one per URL, so none waits on another; `publish`
(wired beside the event hub's) wakes them all when this process commits an event, and each
also looks in the log every second for events another replica committed. `stop` cancels the
loops, each giving back its lease, before the ledger closes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import structlog

from agent_rewind import tasks
from agent_rewind.access import AccessFile
from agent_rewind.store.ledger import EventRecord
from agent_rewind.webhooks.cursors import CursorWriter
from agent_rewind.webhooks.delivery import Deliverer, Settings, Store
from agent_rewind.webhooks.envelope import Encode
from agent_rewind.webhooks.recent import Recent
from agent_rewind.webhooks.signing import Signer
from agent_rewind.webhooks.subscriptions import Subscription, visibility

log = structlog.get_logger(__name__)

# How long after a publish the loops are woken (as the event hub wakes its watchers).
WAKE_DELAY = 0.002


class Webhooks:
    def __init__(
        self,
        subscriptions: Sequence[Subscription],
        store: Store,
        settings: Settings,
        keys: Sequence[str],
        encode: Encode,
        access: AccessFile | None = None,
    ) -> None:
        self.deliverers: list[Deliverer] = []
        if subscriptions:
            signer, cursors = Signer(keys), CursorWriter(store)
            self._recent = Recent(store, encode)
            self.deliverers = [
                Deliverer(s, store, settings, signer, encode, visibility(s, access), cursors, self._recent)
                for s in subscriptions
            ]
        self._tasks: list[asyncio.Task[None]] = []
        self._wake_scheduled = False

    async def start(self) -> None:
        """Claims each URL once before its loop starts (a URL first seen starts at the newest
        cursor: it is sent every event committed after this start), then starts the loops."""
        for deliverer in self.deliverers:
            first = await deliverer.claim()
            name = f"webhook {deliverer.subscription.shown}"
            self._tasks.append(tasks.detach(deliverer.run(first), name=name))
        if self.deliverers:
            log.info("webhook delivery started", urls=[d.subscription.shown for d in self.deliverers])

    def publish(self, event: EventRecord) -> None:
        """An event this process just committed: every loop looks in the log a moment later
        (whoever published, a Rewind, answers its caller first; a burst wakes them once)."""
        if not self.deliverers:
            return
        self._recent.remember(event)
        if not self._wake_scheduled:
            self._wake_scheduled = True
            asyncio.get_running_loop().call_later(WAKE_DELAY, self._wake_all)

    def _wake_all(self) -> None:
        self._wake_scheduled = False
        for deliverer in self.deliverers:
            deliverer.wake()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
