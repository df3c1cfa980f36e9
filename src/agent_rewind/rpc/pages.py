"""ListRewindPoints' pages, kept: a page asked for again (a UI polling, many clients of one
session, on any replica) is the same bytes while the session's points index has the same head.

Every write of the index writes its head anew, and the head names what the rows were made from
(the transcript bytes covered, the leaf, the cut, the counts), so a page read with a head is
still the index's page while the head read now equals it. The flags a page is rendered with
(the session's checkpointing, its snapshots' availability for the page's points) key its bytes.
A deleted session's pages go with it (they hold its prompts' text).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field

from agent_rewind.store.ledger import PointsHead
from agent_rewind.transcript.entries import RewindPoint


@dataclass
class _Page:
    head: PointsHead
    points: list[RewindPoint]
    encoded: dict[Hashable, bytes] = field(default_factory=dict)


class PointPages:
    def __init__(self, size: int = 1024) -> None:
        self._size = size
        self._pages: OrderedDict[tuple[str, int, int], _Page] = OrderedDict()

    def points(self, session_id: str, start: int, size: int, head: PointsHead) -> list[RewindPoint] | None:
        """The page's points as read with `head`, if that is the head now."""
        page = self._pages.get((session_id, start, size))
        if page is None or page.head != head:
            return None
        self._pages.move_to_end((session_id, start, size))
        return page.points

    def put(
        self, session_id: str, start: int, size: int, head: PointsHead, points: list[RewindPoint]
    ) -> None:
        self._pages[(session_id, start, size)] = _Page(head, points)
        while len(self._pages) > self._size:
            self._pages.popitem(last=False)

    def encoded(self, session_id: str, start: int, size: int, key: Hashable) -> bytes | None:
        page = self._pages.get((session_id, start, size))
        return page.encoded.get(key) if page is not None else None

    def keep_encoded(self, session_id: str, start: int, size: int, key: Hashable, encoded: bytes) -> None:
        page = self._pages.get((session_id, start, size))
        if page is not None:
            if len(page.encoded) >= 4:  # a session's flags change rarely: the newest few
                page.encoded.pop(next(iter(page.encoded)))
            page.encoded[key] = encoded

    def forget(self, session_id: str) -> None:
        for key in [k for k in self._pages if k[0] == session_id]:
            del self._pages[key]
