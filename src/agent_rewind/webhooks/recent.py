"""The events this process published lately, shared by every URL's loop: a loop whose next event
is here takes it from memory rather than the ledger, and its CloudEvent document is made once for
every URL. The ledger stays the truth: whatever is not here, in order from a loop's cursor (an
event another replica committed, one older than this memory, any gap), is read from the log.
A deleted session's events are dropped, as the event hub drops them (the ledger's copies no
longer name its files)."""

from __future__ import annotations

from collections import OrderedDict

from agent_rewind.store.ledger import EventLog, EventRecord
from agent_rewind.webhooks.envelope import Encode, Envelope, envelope

SIZE = 1024


class Recent:
    def __init__(self, store: EventLog, encode: Encode, size: int = SIZE) -> None:
        self._store = store
        self._encode = encode
        self._size = size
        self._events: OrderedDict[int, EventRecord] = OrderedDict()
        self._envelopes: OrderedDict[int, tuple[EventRecord, Envelope]] = OrderedDict()
        self.newest = 0  # the newest cursor published here

    def remember(self, event: EventRecord) -> None:
        if event.kind == "SESSION_DELETED":
            for cursor in [c for c, e in self._events.items() if e.session_id == event.session_id]:
                del self._events[cursor]
                self._envelopes.pop(cursor, None)
        self._events[event.cursor] = event
        self.newest = max(self.newest, event.cursor)
        while len(self._events) > self._size:
            self._events.popitem(last=False)

    async def after(self, cursor: int, limit: int) -> list[EventRecord]:
        """Events after `cursor`, in order: from memory while it holds the next, else the log."""
        found: list[EventRecord] = []
        while cursor + 1 + len(found) in self._events and len(found) < limit:
            found.append(self._events[cursor + 1 + len(found)])
        return found or await self._store.events_after(cursor, limit=limit)

    def envelope(self, event: EventRecord) -> Envelope:
        """The event's document, made once whichever URL asks (for the same record)."""
        made = self._envelopes.get(event.cursor)
        if made is not None and made[0] is event:
            return made[1]
        sealed = envelope(event, self._encode)
        self._envelopes[event.cursor] = (event, sealed)
        while len(self._envelopes) > self._size:
            self._envelopes.popitem(last=False)
        return sealed
