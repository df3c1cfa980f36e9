"""ListRewindPoints' last page per session, encoded: a page asked for again (a UI polling, many
clients of one session) is the same bytes while nothing it shows has changed.

What a page shows changes with the session's view (a new object after any change to the
transcript or a cut), its flags and its snapshots' availability; the page is kept with all of
them and served only while they are the same. It goes when the session frees its view (it
hibernates or is deleted: `SessionWorker.on_forget`) and when its worker is dropped.
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable, Mapping
from dataclasses import dataclass

from agent_rewind.sessions.worker import SessionWorker
from agent_rewind.transcript.index import ConversationView


@dataclass(frozen=True)
class _Page:
    view: ConversationView
    key: Hashable
    encoded: bytes
    # Held so that its id, which the key may name, is not reused while the page is kept.
    snapshots: Mapping[str, bool]


class PointPages:
    def __init__(self) -> None:
        self._pages: weakref.WeakKeyDictionary[SessionWorker, _Page] = weakref.WeakKeyDictionary()

    def get(self, worker: SessionWorker, view: ConversationView, key: Hashable) -> bytes | None:
        """The page kept for `worker` when it was made from this `view` and `key`."""
        page = self._pages.get(worker)
        if page is not None and page.view is view and page.key == key:
            return page.encoded
        return None

    def put(
        self,
        worker: SessionWorker,
        view: ConversationView,
        key: Hashable,
        encoded: bytes,
        snapshots: Mapping[str, bool],
    ) -> None:
        if worker not in self._pages:
            pages = weakref.ref(self)
            target = weakref.ref(worker)
            worker.on_forget(lambda: _drop(pages, target))
        self._pages[worker] = _Page(view, key, encoded, snapshots)


def _drop(pages: weakref.ref[PointPages], worker: weakref.ref[SessionWorker]) -> None:
    held, session = pages(), worker()
    if held is not None and session is not None:
        held._pages.pop(session, None)
