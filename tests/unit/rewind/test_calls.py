"""The engine's calls (rewind/calls.py): one `Call` for what a Rewind and an UndoRewind both carry.
A fingerprint is what a retry is matched on, so those an earlier version recorded are pinned here
as it wrote them: a retry of an old request id still matches."""

from __future__ import annotations

import pytest

from agent_rewind.rewind.calls import RewindRequest, UndoRequest
from agent_rewind.rewind.outcome import Mode
from agent_rewind.store.ledger import NewRequest

SID, RID = "s-1", "9b2f3c1e-1a2b-4c3d-8e9f-0a1b2c3d4e5f"


@pytest.mark.parametrize(
    ("call", "fingerprint"),
    [
        (RewindRequest(session_id=SID, message_id="p-1", mode=Mode.BOTH), '["s-1", "p-1", "both", null]'),
        (
            RewindRequest(session_id=SID, message_id="p-1", mode=Mode.FILES, expected_last_message_id="m-9"),
            '["s-1", "p-1", "files", "m-9"]',
        ),
        (
            RewindRequest(session_id=SID, message_id="p-1", mode=Mode.FILES, conflict_policy="skip"),
            '["s-1", "p-1", "files", null, "skip"]',
        ),
        (
            RewindRequest(session_id=SID, message_id="p-1", mode=Mode.FILES, paths=("src", "a.txt")),
            '["s-1", "p-1", "files", null, "refuse", ["src", "a.txt"], "since"]',
        ),
        (
            RewindRequest(
                session_id=SID, message_id="p-1", mode=Mode.FILES, scope="turn", conflict_policy="skip"
            ),
            '["s-1", "p-1", "files", null, "skip", [], "turn"]',
        ),
        (UndoRequest(session_id=SID, rewind_id="r-1"), '["s-1", "r-1", "refuse"]'),
        (
            UndoRequest(session_id=SID, rewind_id="r-1", conflict_policy="overwrite"),
            '["s-1", "r-1", "overwrite"]',
        ),
    ],
)
def test_a_calls_fingerprint_is_as_earlier_versions_recorded_it(
    call: RewindRequest | UndoRequest, fingerprint: str
) -> None:
    assert call.fingerprint() == fingerprint


def test_what_is_not_the_call_is_not_in_its_fingerprint() -> None:
    """Who asks, a preview's diffs or validate_only, and the request id itself."""
    rewind = RewindRequest(session_id=SID, message_id="p-1", mode=Mode.BOTH)
    other = RewindRequest(
        session_id=SID, message_id="p-1", mode=Mode.BOTH, principal="bob", include_diff=True
    )
    assert rewind.fingerprint() == other.fingerprint()
    undo = UndoRequest(session_id=SID, rewind_id="r-1")
    assert (
        undo.fingerprint() == UndoRequest(session_id=SID, rewind_id="r-1", validate_only=True).fingerprint()
    )


def test_a_call_is_recorded_under_its_method_and_session_only_with_a_request_id() -> None:
    rewind = RewindRequest(session_id=SID, message_id="p-1", mode=Mode.BOTH, request_id=RID)
    assert rewind.request() == NewRequest(RID, "Rewind", rewind.fingerprint(), SID)
    undo = UndoRequest(session_id=SID, rewind_id="r-1", request_id=RID)
    assert undo.request() == NewRequest(RID, "UndoRewind", undo.fingerprint(), SID)
    assert RewindRequest(session_id=SID, message_id="p-1", mode=Mode.BOTH).request() is None
    assert UndoRequest(session_id=SID, rewind_id="r-1", request_id="").request() is None


def test_a_revert_a_narrowed_rewind_and_a_rewind_of_everything_are_different_calls() -> None:
    """A request id reused for a revert of the point it rewound (or for other paths) is another
    call: REQUEST_ID_REUSED, never the first call's result."""
    base = RewindRequest(session_id=SID, message_id="p-1", mode=Mode.FILES, request_id=RID)
    others = [
        RewindRequest(session_id=SID, message_id="p-1", mode=Mode.FILES, request_id=RID, scope="turn"),
        RewindRequest(session_id=SID, message_id="p-1", mode=Mode.FILES, request_id=RID, paths=("a",)),
        RewindRequest(session_id=SID, message_id="p-1", mode=Mode.FILES, request_id=RID, paths=("b",)),
    ]
    prints = {call.fingerprint() for call in [base, *others]}
    assert len(prints) == 4
