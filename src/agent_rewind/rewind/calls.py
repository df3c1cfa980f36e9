"""What a Rewind (or DryRun, or a prompt's rewind) and an UndoRewind call ask of the engine, and
the request ids they keep: one `Call` for what both carry, with the fingerprint its request id is
recorded under, and the rewind (or undo) a request id started (the retry rule itself is
`agent_rewind/retries.py`'s).

A fingerprint is what a retry is matched on, so it never changes for a call an earlier version
recorded: new arguments are added to it only when they differ from what those calls had.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

from agent_rewind import retries
from agent_rewind.rewind import workspace
from agent_rewind.rewind.outcome import SINCE, TURN, Mode
from agent_rewind.store.ledger import Ledger, NewRequest, RewindRecord


@dataclass(frozen=True, kw_only=True)
class Call:
    """What every call of the engine carries: the session, the request id a retry of it names,
    who asks, and what becomes of paths someone else changed (rewind/workspace.py)."""

    # The RPC method the request id is recorded for.
    METHOD: ClassVar[str]

    session_id: str
    request_id: str | None = None
    principal: str = ""
    conflict_policy: str = workspace.REFUSE

    def fingerprint(self) -> str:
        raise NotImplementedError

    def request(self) -> NewRequest | None:
        """What the ledger records under the call's request id; None for a call without one."""
        if not self.request_id:
            return None
        return NewRequest(self.request_id, self.METHOD, self.fingerprint(), self.session_id)


@dataclass(frozen=True, kw_only=True)
class RewindRequest(Call):
    """Rewind, DryRun or PromptRequest.rewind: the point, the halves, the guard."""

    METHOD = "Rewind"

    message_id: str
    mode: Mode
    expected_last_message_id: str | None = None
    include_diff: bool = False  # DryRun only
    # Workspace-relative paths the files half is narrowed to (rewind/paths.py `normalized`);
    # empty: every path.
    paths: tuple[str, ...] = ()
    scope: str = SINCE

    @property
    def reverts(self) -> bool:
        return self.scope == TURN

    def fingerprint(self) -> str:
        call: list[Any] = [self.session_id, self.message_id, self.mode.value, self.expected_last_message_id]
        # The fingerprints of older calls stay as they were: what they did not have is not added.
        if self.conflict_policy != workspace.REFUSE or self.paths or self.reverts:
            call.append(self.conflict_policy)
        if self.paths or self.reverts:
            call += [list(self.paths), self.scope]
        return json.dumps(call)


@dataclass(frozen=True, kw_only=True)
class UndoRequest(Call):
    """UndoRewind (or its preview, `validate_only`): the rewind it undoes."""

    METHOD = "UndoRewind"

    rewind_id: str
    validate_only: bool = False

    def fingerprint(self) -> str:
        return json.dumps([self.session_id, self.rewind_id, self.conflict_policy])


async def recorded(ledger: Ledger, call: Call) -> RewindRecord | None:
    """The rewind (or undo) this call's request id started, if any; REQUEST_ID_REUSED when the id
    was used for another call."""
    found = await retries.recorded(ledger, call.request())
    rewind_id = (found.result or {}).get("rewind_id") if found is not None else None
    return await ledger.rewind(str(rewind_id)) if rewind_id else None
