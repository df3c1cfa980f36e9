"""What the RPC layer keeps between calls, and drops with a deleted session.

Made once by the server and handed to the event hub (which tells it of every deleted session)
and to the servicers that read and fill it; nothing is registered on either after it is made.
A deleted session's entries go with it: its events named its files, its pages hold its prompts'
text, its record names its principal.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

from agent_rewind.access import Principal
from agent_rewind.api.v1 import rewind_service_pb2
from agent_rewind.errors import QuotaExceeded, SessionNotFound
from agent_rewind.rpc import convert
from agent_rewind.rpc.pages import PointPages
from agent_rewind.store.ledger import EventRecord, SessionRecord


class EventMessages:
    """Each event's response built and encoded once, however many watchers send it (the
    registration passes bytes through as they are): the newest `size` of them, up to `max_bytes`
    in all."""

    def __init__(self, size: int = 4096, max_bytes: int = 64 << 20) -> None:
        self._size = size
        self._max_bytes = max_bytes
        self._bytes = 0
        self._messages: OrderedDict[int, tuple[str, bytes]] = OrderedDict()

    def response(self, event: EventRecord) -> bytes:
        found = self._messages.get(event.cursor)
        if found is not None and found[0] == event.session_id:
            return found[1]
        encoded = rewind_service_pb2.WatchRewindEventsResponse(
            event=convert.rewind_event(event)
        ).SerializeToString()
        self._messages[event.cursor] = (event.session_id, encoded)
        self._bytes += len(encoded)
        while (self._bytes > self._max_bytes or len(self._messages) > self._size) and self._messages:
            _, (_, dropped) = self._messages.popitem(last=False)
            self._bytes -= len(dropped)
        return encoded

    @property
    def held(self) -> tuple[int, int]:
        """(messages, bytes) kept now."""
        return len(self._messages), self._bytes

    def forget(self, session_id: str) -> None:
        for cursor in [c for c, (s, _) in self._messages.items() if s == session_id]:
            self._bytes -= len(self._messages.pop(cursor)[1])


Load = Callable[[str, Principal], Awaitable[SessionRecord]]


class StoredRecords:
    """Sessions other replicas own, as the ledger recorded them at their creation (what a page
    of points reads of one never changes): the newest `size` of them."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._records: OrderedDict[str, SessionRecord] = OrderedDict()

    async def get(self, session_id: str, principal: Principal, load: Load) -> SessionRecord:
        """The session's record, loaded by `load` when not kept; SESSION_NOT_FOUND to a
        principal that may not see it, whoever loaded it first."""
        record = self._records.get(session_id)
        if record is None:
            record = await load(session_id, principal)
            self._records[session_id] = record
            while len(self._records) > self._size:
                self._records.popitem(last=False)
        if not principal.owns(record.principal):
            raise SessionNotFound(session_id)
        return record

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._records

    def forget(self, session_id: str) -> None:
        self._records.pop(session_id, None)


class WatchStreams:
    """How many watch streams each principal holds open here (--max-watch-streams-per-principal)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: dict[str, int] = {}

    def open(self, principal: str) -> int:
        return self._open.get(principal, 0)

    @contextlib.contextmanager
    def held(self, principal: str) -> Iterator[None]:
        if self._open.get(principal, 0) >= self.limit:
            raise QuotaExceeded("watch_streams", self.limit)
        self._open[principal] = self._open.get(principal, 0) + 1
        try:
            yield
        finally:
            self._open[principal] -= 1
            if not self._open[principal]:
                del self._open[principal]


@dataclass(frozen=True)  # gremlin: pardon[equivalent] nothing assigns to or hashes one
class ServiceCaches:
    events: EventMessages = field(default_factory=EventMessages)
    pages: PointPages = field(default_factory=PointPages)
    records: StoredRecords = field(default_factory=StoredRecords)

    def forget(self, session_id: str) -> None:
        """A session was deleted: whatever is kept of it goes."""
        self.events.forget(session_id)
        self.pages.forget(session_id)
        self.records.forget(session_id)
