"""The request-id retry rule (agent_rewind/retries.py), written once for every call that keeps
request ids: the same call under an id is a retry, any other is REQUEST_ID_REUSED."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from agent_rewind import retries
from agent_rewind.errors import RequestIdReused
from agent_rewind.store.ledger import NewRequest, RequestRecord

RID = "3f0c1e4a-7d3b-4c55-9a41-0c6f1a2b3c4d"
CALL = NewRequest(RID, "Rewind", '["s1", "p1", "both", null]', "s1")


def _record(request: NewRequest) -> RequestRecord:
    return RequestRecord(
        request.request_id,
        request.method,
        request.fingerprint,
        request.session_id,
        True,
        {},
        datetime.now(UTC),
    )


class _Ledger:
    def __init__(self, *recorded: NewRequest) -> None:
        self.recorded = {r.request_id: _record(r) for r in recorded}

    async def request(self, request_id: str) -> RequestRecord | None:
        return self.recorded.get(request_id)


def test_the_same_call_is_a_retry_answered_as_the_first() -> None:
    record = _record(CALL)
    assert retries.check(record, CALL) is record


@pytest.mark.parametrize(
    "other",
    [
        NewRequest(RID, "UndoRewind", CALL.fingerprint, "s1"),
        NewRequest(RID, "Rewind", '["s1", "p2", "both", null]', "s1"),
        NewRequest(RID, "Rewind", CALL.fingerprint, "s2"),
    ],
    ids=["another method", "other arguments", "another session"],
)
def test_any_other_call_under_the_id_is_request_id_reused(other: NewRequest) -> None:
    with pytest.raises(RequestIdReused) as caught:
        retries.check(_record(CALL), other)
    assert caught.value.metadata == {"request_id": RID}


def test_a_new_session_retry_is_the_same_call_whatever_session_it_was_given() -> None:
    made = _record(NewRequest(RID, "CreateSession", "[]", "s-made"))
    assert retries.check(made, NewRequest(RID, "CreateSession", "[]", ""), new_session=True) is made
    with pytest.raises(RequestIdReused):
        retries.check(made, NewRequest(RID, "CreateSession", "[1]", ""), new_session=True)


async def test_recorded_finds_the_call_only_when_there_is_one_and_it_is_this_one() -> None:
    assert await retries.recorded(_Ledger(CALL), None) is None, "a call without a request id"
    assert await retries.recorded(_Ledger(), CALL) is None, "a first call"
    found = await retries.recorded(_Ledger(CALL), CALL)
    assert found is not None and found.fingerprint == CALL.fingerprint
    with pytest.raises(RequestIdReused):
        await retries.recorded(_Ledger(CALL), NewRequest(RID, "Rewind", "[]", "s1"))
