"""A session's own state, which its parts share: its record, its lock, what it accepts now
(`status.Status`) and its live process (`process.AgentProcess`).

The worker (`worker.py`) makes one and hands it to each of its parts (`lifecycle.py`,
`running.py`, `points.py`); a part reaches another part only through the narrow calls it is
given when it is made, never through the worker.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from agent_rewind.errors import SessionNotFound, TurnInFlight
from agent_rewind.sessions.process import AgentProcess
from agent_rewind.sessions.status import Status
from agent_rewind.store.ledger import SessionRecord


class SessionState:
    def __init__(self, record: SessionRecord, process: AgentProcess, log: Any) -> None:
        self.session_id = record.session_id
        # As the ledger has it (the parts that write the ledger keep this in step).
        self.record = record
        self.update_time: datetime = record.update_time
        # Held by every prompt, rewind and rebuild of the process (API.md rule 4).
        self.lock = asyncio.Lock()
        self.log = log
        self.process = process
        self.status = Status(process)

    @property
    def turn_running(self) -> bool:
        return self.status.turn_running

    @property
    def gone(self) -> bool:
        """Being deleted, or deleted: nothing new runs on the session."""
        return self.status.gone

    @property
    def deleted(self) -> bool:
        return self.status.deleted

    def check_no_turn(self) -> None:
        if self.turn_running:
            raise TurnInFlight(self.session_id)

    def check_not_deleted(self) -> None:
        """SESSION_NOT_FOUND for work that reached the session while it was being deleted."""
        if self.gone:
            raise SessionNotFound(self.session_id)
