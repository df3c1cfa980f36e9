"""A new session's arguments (CreateSession's, and a fork's). The request-id retry rule its
calls keep is `agent_rewind/retries.py`'s, as every call's is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent_rewind.store.ledger import ForkOrigin, dumps


@dataclass(frozen=True)
class NewSessionRequest:
    """CreateSession's arguments, checked by the RPC layer (ids are canonical UUIDs or empty)."""

    cwd: str
    session_id: str
    options: dict[str, Any]
    checkpointing: bool
    workspace_snapshots: bool
    request_id: str
    principal: str = ""
    # The directory the caller's workspaces lie under in each root (authentication on, not an
    # admin: workspace_paths.py); None: anywhere under a root.
    workspace_home: str | None = None
    # A fork: the workspace must be new or empty (the fork writes into it), and where it came from.
    fresh_workspace: bool = False
    forked_from: ForkOrigin | None = None

    def fingerprint(self) -> str:
        call: list[Any] = [
            self.cwd,
            self.session_id,
            self.options,
            self.checkpointing,
            self.workspace_snapshots,
            self.principal,
        ]
        if self.forked_from is not None:  # (a create's fingerprint is as it always was)
            call.append([self.forked_from.session_id, self.forked_from.message_id])
        return dumps(call)
