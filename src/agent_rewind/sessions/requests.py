"""What the sessions layer is asked: a new session's arguments, and the request-id retry rule.

A call that carries a `request_id` is recorded with it (store/ledger.py, `NewRequest`). A call
that finds its id already recorded is a retry when it is the same call (the same method, the
same arguments, on the same session): it is answered as the first one was. Any other call under
that id is REQUEST_ID_REUSED. That rule is `check` here, written once for every call that keeps
request ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent_rewind.errors import RequestIdReused
from agent_rewind.store.ledger import ForkOrigin, NewRequest, RequestRecord, Requests, dumps


def check(recorded: RequestRecord, request: NewRequest, *, new_session: bool = False) -> RequestRecord:
    """`recorded`, if `request` is the same call (a retry, to be answered as that one was);
    REQUEST_ID_REUSED otherwise. `new_session`: a CreateSession, where a retry that asked for no
    session id is given a new one, so the session it names does not count."""
    same = (
        (recorded.method, recorded.fingerprint) == (request.method, request.fingerprint)
        if new_session
        else recorded.same_call(request)
    )
    if not same:
        raise RequestIdReused(request.request_id)
    return recorded


async def recorded(
    ledger: Requests, request: NewRequest | None, *, new_session: bool = False
) -> RequestRecord | None:
    """The call this request id was recorded for, if any (and it is this call: `check`)."""
    if request is None:
        return None
    found = await ledger.request(request.request_id)
    return check(found, request, new_session=new_session) if found is not None else None


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
