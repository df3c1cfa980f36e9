"""What a session worker accepts now: its phase, the turn that holds it, and whether it stops.

One object answers every "may this run?" the worker asks, and every change of it is a method
here, so the rules read in one place:

- `Phase`: OPEN, then (DeleteSession) RETIRING, then DELETED at the ledger's commit; a deletion
  that fails before its commit makes the session OPEN again. RETIRING and DELETED are both
  `gone`: nothing new runs (SESSION_NOT_FOUND).
- The claimed turn: from the moment a prompt is accepted (its CLI may still be starting) until
  its turn ends, rewinds and second prompts are refused (TURN_IN_FLIGHT). A claim is not a phase:
  a deletion or a server stop that begins while a turn runs waits for it, so the two overlap.
- Stopping: the server is stopping, or the session is deleted, and no process of it may start
  again. The process keeps that rule itself (`AgentProcess.stopped`); this reads and sets it.

`State` is what the RPC layer shows of it (with the process and the session's `closed`).
"""

from __future__ import annotations

import enum

from agent_rewind.sessions.process import AgentProcess
from agent_rewind.sessions.turns import Turn


class State:
    """A session's state as ListSessions and GetSession show it."""

    IDLE = "IDLE"
    RUNNING = "RUNNING"
    HIBERNATED = "HIBERNATED"
    CLOSED = "CLOSED"


class Phase(enum.Enum):
    OPEN = "open"
    # DeleteSession is ending the session's work; OPEN again if it fails before its commit.
    RETIRING = "retiring"
    # From the ledger's commit of the deletion on.
    DELETED = "deleted"


class Status:
    def __init__(self, process: AgentProcess) -> None:
        self._process = process
        self.phase = Phase.OPEN
        # The turn that holds the session, None when no turn does.
        self.claimed: Turn | None = None

    @property
    def gone(self) -> bool:
        """Being deleted, or deleted: nothing new runs on the session."""
        return self.phase is not Phase.OPEN

    @property
    def deleted(self) -> bool:
        return self.phase is Phase.DELETED

    @property
    def turn_running(self) -> bool:
        return self.claimed is not None

    @property
    def stopping(self) -> bool:
        """No process of the session may start again: the server is stopping (or it is deleted)."""
        return self._process.stopped

    def state(self, *, closed: bool) -> str:
        if self.turn_running:
            return State.RUNNING
        if closed:
            return State.CLOSED
        if self._process.alive:
            return State.IDLE
        return State.HIBERNATED

    # The transitions

    def claim(self, turn: Turn) -> None:
        """`turn` holds the session (the caller checked that none does)."""
        self.claimed = turn

    def release(self) -> None:
        """The turn that held the session ended (or never began)."""
        self.claimed = None

    def retire(self) -> None:
        if self.phase is Phase.OPEN:
            self.phase = Phase.RETIRING

    def retired(self) -> None:
        """A deletion's hold ended: without its commit the session is usable again; with it, no
        process of it ever starts again."""
        if self.phase is Phase.RETIRING:
            self.phase = Phase.OPEN
        elif self.phase is Phase.DELETED:
            self._process.stopped = True

    def delete(self) -> None:
        """The ledger committed the session's deletion."""
        self.phase = Phase.DELETED

    def stop(self) -> None:
        """The server is stopping."""
        self._process.stopped = True
