"""Points whose files retention deleted (storage/retention.py marks them in the ledger): a files
rewind to one is refused with FILES_PRUNED, whatever serves it and however it is narrowed, a dry
run says so in its files half, a conversation rewind to it works; the undo of a rewind to one is
UNDO_UNAVAILABLE once it is marked.

Real turns of the worker with a fake CLI, the server's real workspace snapshots and a real SQLite
ledger; tests/integration/test_retention.py drives the same through a real server and real
Claude Code, with the deletions.
"""

from __future__ import annotations

import asyncio

import pytest

from agent_rewind.errors import AgentRewindError
from agent_rewind.rewind.outcome import TURN, Mode
from tests.unit.rewind.fakes import MakeSetup, Setup, within

P0 = {"a.txt": "v0\n"}
P1 = {"a.txt": "v1\n", "b.txt": "bee\n"}
P2 = {"a.txt": "v2\n", "c.txt": "sea\n"}


async def _three_turns_the_first_two_pruned(make_setup: MakeSetup, **kw: bool) -> tuple[Setup, list[str]]:
    s = await make_setup(**kw)
    ids = []
    for text, edits in (("zero", P0), ("one", P1), ("two", P2)):
        ids.append(await s.prompt(text, edits))
        # The fake CLI's turns take less than the millisecond a point's create_time counts in;
        # the mark is a time, so the kept point must come strictly later than the pruned ones.
        await asyncio.sleep(0.005)
    points = (await s.worker.view()).points
    kept = points[2].create_time
    assert kept is not None and points[1].create_time is not None and points[1].create_time < kept
    await s.ledger.mark_files_pruned(s.sid, "", kept)
    return s, ids


@pytest.mark.parametrize("snapshots", [True, False], ids=["snapshots", "checkpoints"])
async def test_a_files_rewind_to_a_pruned_point_is_files_pruned_and_a_conversation_rewind_works(
    make_setup: MakeSetup, snapshots: bool
) -> None:
    s, ids = await _three_turns_the_first_two_pruned(
        make_setup, snapshots=True, workspace_snapshots=snapshots
    )
    for mode, kw in ((Mode.FILES, {}), (Mode.BOTH, {}), (Mode.FILES, {"paths": ("a.txt",)})):
        preview = await within(s.engine.dry_run(s.worker, s.request(ids[1], mode, **kw)))
        assert preview.files.requested and not preview.files.can_rewind
        assert preview.files.refusal is not None and preview.files.refusal.reason == "FILES_PRUNED"
        assert preview.files.refusal.metadata == {"message_id": ids[1]}
        if mode is Mode.BOTH:
            assert preview.conversation.can_rewind, "only the files half is refused"
        with pytest.raises(AgentRewindError) as caught:
            await within(s.engine.rewind(s.worker, s.request(ids[1], mode, **kw)))
        assert caught.value.reason == "FILES_PRUNED"
    assert s.knobs.applied == [], "the CLI's checkpoints were not asked"
    assert (s.read("a.txt"), s.read("b.txt"), s.read("c.txt")) == ("v2\n", "bee\n", "sea\n")
    # The kept point's files are rewound as ever; the pruned one stays a point for the conversation.
    kept = await within(s.engine.rewind(s.worker, s.request(ids[2], Mode.FILES)))
    assert kept.files.can_rewind
    cut = await within(s.engine.rewind(s.worker, s.request(ids[1], Mode.CONVERSATION)))
    assert cut.conversation.rewound and await s.texts() == ["zero"]


async def test_a_revert_of_a_pruned_points_turn_is_files_pruned(make_setup: MakeSetup) -> None:
    s, ids = await _three_turns_the_first_two_pruned(make_setup, snapshots=True, workspace_snapshots=True)
    with pytest.raises(AgentRewindError) as caught:
        await within(s.engine.rewind(s.worker, s.request(ids[1], Mode.FILES, scope=TURN)))
    assert caught.value.reason == "FILES_PRUNED"


async def test_the_undo_of_a_rewind_to_a_point_marked_since_is_unavailable(make_setup: MakeSetup) -> None:
    s = await make_setup(snapshots=True, workspace_snapshots=True)
    ids = [await s.prompt(text, edits) for text, edits in (("zero", P0), ("one", P1), ("two", P2))]
    rewound = await within(s.engine.rewind(s.worker, s.request(ids[1], Mode.FILES)))
    preview = await within(s.engine.undo(s.worker, s.undo_request(rewound.rewind_id, validate_only=True)))
    assert preview.files.can_rewind, "undoable while its point keeps its files"
    points = (await s.worker.view()).points
    assert points[2].create_time is not None
    await s.ledger.mark_files_pruned(s.sid, "", points[2].create_time)
    with pytest.raises(AgentRewindError) as caught:
        await within(s.engine.undo(s.worker, s.undo_request(rewound.rewind_id)))
    assert caught.value.reason == "UNDO_UNAVAILABLE" and "retention" in caught.value.message
    assert (s.read("a.txt"), s.read("b.txt"), s.read("c.txt")) == ("v0\n", None, None), "nothing undone"
