"""The request-id retry rule, written once for every call that keeps request ids (CreateSession,
Prompt, DeleteSession in `sessions/`; Rewind and UndoRewind in `rewind/`).

A call that carries a `request_id` is recorded with it (store/ledger.py, `NewRequest`). A call
that finds its id already recorded is a retry when it is the same call (the same method, the
same arguments, on the same session): it is answered as the first one was. Any other call under
that id is REQUEST_ID_REUSED.

(Not `rpc/requests.py`, which checks a request's fields, nor `sessions/new_session.py`, a new
session's arguments.)
"""

from __future__ import annotations

from agent_rewind.errors import RequestIdReused
from agent_rewind.store.ledger import NewRequest, RequestRecord, Requests


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
