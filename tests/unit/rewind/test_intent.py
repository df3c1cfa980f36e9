"""The rewind intent's records (rewind/intent.py): every kind round-trips through the ledger's
JSON, intents the previous version wrote load as they were and are written back so it reads them
still, and an intent this version cannot read is refused clearly, by recovery too.

intents_v1.json holds intents and results exactly as the engine wrote them before these records
existed (its "about" says where each comes from).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent_rewind.rewind.intent import (
    Applied,
    FilesBefore,
    Intent,
    SnapshotRestore,
    UndoFiles,
    UndoIntent,
    UnreadableIntent,
)
from agent_rewind.rewind.outcome import ConversationHalf, FilesHalf, Mode, Refusal, RewindOutcome
from agent_rewind.store.ledger import Anchor, NewRewind
from tests.unit.rewind.fakes import MakeSetup, within

V1: dict[str, Any] = json.loads((Path(__file__).parent / "intents_v1.json").read_text())

RID = "r-1"
TARGET = "prompt-2"
ANCHOR = Anchor("s-1", "reply-1", TARGET, 645, None, RID)
BEFORE, NOW, START = "1" * 40, "2" * 40, "3" * 40


def stored(data: dict[str, Any]) -> Any:
    """What the ledger gives back of what it was given: the JSON of it."""
    return json.loads(json.dumps(data))


NO_FILES, NO_CONVERSATION = FilesHalf(), ConversationHalf()


def _outcome(files: FilesHalf = NO_FILES, conversation: ConversationHalf = NO_CONVERSATION) -> RewindOutcome:
    return RewindOutcome(RID, files, conversation, "")


FILES = FilesHalf(True, True, ("a.txt",), 1, 1)
SNAPSHOT_FILES = FilesHalf(
    True,
    True,
    ("/srv/ws/a.txt", "/srv/ws/c.txt"),
    1,
    3,
    source="snapshot",
    conflicts=(("c.txt", "overwritten"),),
)
CONVERSATION = ConversationHalf(True, True, messages_dropped=2)

INTENTS = {
    "files from checkpoints": Intent(
        TARGET, True, _outcome(files=FILES), None, planned_leaf="reply-2", planned_last_message_id="reply-2"
    ),
    "files from checkpoints, undoable": Intent(
        TARGET,
        True,
        _outcome(files=FILES),
        None,
        files_before=FilesBefore(BEFORE, ("a.txt",)),
        planned_leaf="reply-2",
        planned_last_message_id="reply-2",
        planned_transcript_size=418,
    ),
    "conversation": Intent(
        TARGET,
        False,
        _outcome(conversation=CONVERSATION),
        ANCHOR,
        planned_leaf="reply-2",
        planned_last_message_id="reply-2",
        planned_transcript_size=645,
    ),
    "both from snapshots": Intent(
        TARGET,
        True,
        _outcome(SNAPSHOT_FILES, CONVERSATION),
        ANCHOR,
        snapshot=SnapshotRestore(START, NOW, ("a.txt", "c.txt")),
        files_before=FilesBefore(NOW, ("a.txt", "c.txt")),
        planned_leaf="reply-2",
        planned_last_message_id="reply-2",
        planned_transcript_size=645,
    ),
    "of the first builds": Intent(TARGET, False, _outcome(conversation=CONVERSATION), ANCHOR),
    "a revert, narrowed": Intent(
        TARGET,
        True,
        _outcome(files=SNAPSHOT_FILES),
        None,
        snapshot=SnapshotRestore(START, NOW, ("src/a.txt",)),
        files_before=FilesBefore(NOW, ("src/a.txt",)),
        planned_leaf="reply-2",
        paths=("src",),
        scope="turn",
    ),
    "files from checkpoints, narrowed": Intent(
        TARGET, True, _outcome(files=FILES), None, planned_leaf="reply-2", paths=("a.txt",)
    ),
}

UNDO_FILES = UndoFiles(BEFORE, NOW, ("a.txt",), 1, 1, (("b.txt", "skipped"),), "checkpoint")
UNDOS = {
    "files": UndoIntent(RID, UNDO_FILES, None, _outcome(files=FILES)),
    "files, the whole workspace known": UndoIntent(
        RID,
        UndoFiles(BEFORE, NOW, ("a.txt",), 3, 1, (), "snapshot", whole=START),
        None,
        _outcome(files=FILES),
    ),
    "conversation": UndoIntent(RID, None, "reply-2", _outcome(conversation=CONVERSATION)),
    "both": UndoIntent(RID, UNDO_FILES, "reply-2", _outcome(FILES, CONVERSATION)),
}


# Round trips


@pytest.mark.parametrize("name", INTENTS)
def test_every_kind_of_rewind_intent_round_trips_through_the_ledgers_json(name: str) -> None:
    intent = INTENTS[name]
    assert Intent.from_json(stored(intent.to_json())) == intent


@pytest.mark.parametrize("name", UNDOS)
def test_every_kind_of_undo_intent_round_trips_through_the_ledgers_json(name: str) -> None:
    intent = UNDOS[name]
    assert UndoIntent.from_json(stored(intent.to_json())) == intent


@pytest.mark.parametrize("after", [None, START])
def test_an_applied_rewinds_result_round_trips_with_or_without_the_files_it_left(after: str | None) -> None:
    applied = Applied(RewindOutcome(RID, FILES, ConversationHalf(True, True, True, 2), "reply-1"), after)
    assert Applied.from_json(stored(applied.to_json())) == applied


def test_an_intent_is_written_with_its_version() -> None:
    assert INTENTS["conversation"].to_json()["version"] == 1
    assert UNDOS["conversation"].to_json()["version"] == 1


def test_only_a_narrowed_rewind_from_checkpoints_is_written_as_version_2() -> None:
    """An older server would finish it as version 1 says, by the CLI's restore of every file: it
    must refuse it instead. A narrowed (or reverting) rewind served by snapshots is a snapshot
    restore of its paths, which an older server finishes right: it stays version 1."""
    assert INTENTS["files from checkpoints, narrowed"].to_json()["version"] == 2
    assert INTENTS["a revert, narrowed"].to_json()["version"] == 1
    assert INTENTS["files from checkpoints"].to_json()["version"] == 1
    assert "paths" not in INTENTS["files from checkpoints"].to_json(), "written only when set"
    assert "scope" not in INTENTS["files from checkpoints, narrowed"].to_json()


def test_a_refusal_and_diffs_in_an_outcome_round_trip_too() -> None:
    """Not in a recorded intent (a refused half is never recorded), but the outcome is the same record."""
    files = FilesHalf(
        True,
        refusal=Refusal("EXTERNAL_CHANGES", "someone else changed c.txt", {"paths": "c.txt"}),
        diffs=(
            {
                "path": "a.txt",
                "change": "modified",
                "unified_diff": "-a\n+b\n",
                "binary": False,
                "truncated": False,
            },
        ),
        diffs_truncated=True,
    )
    intent = Intent(TARGET, True, _outcome(files=files), None)
    assert Intent.from_json(stored(intent.to_json())) == intent


# What the previous version wrote


def _kept(written: Any, read: Any) -> None:
    """Every key the previous version wrote is written back with the same value (a server of the
    previous version reads what this one writes)."""
    if isinstance(written, dict):
        assert isinstance(read, dict)
        for key, value in written.items():
            assert key in read, key
            _kept(value, read[key])
    else:
        assert written == read


def _written_back(intent: Intent | UndoIntent, literal: dict[str, Any]) -> None:
    data = stored(intent.to_json())
    _kept(literal, data)
    assert data == {**literal, "version": 1}, "nothing else added"


def test_a_files_intent_of_the_previous_version_loads_and_is_written_back_as_it_was() -> None:
    intent = Intent.from_json(V1["files_from_checkpoints"])
    assert intent.target == "653644de-06bf-4ea4-bc36-a8a768eec585" and intent.restores_files
    assert intent.anchor is None and intent.snapshot is None
    assert intent.files_before == FilesBefore("a8305634c3ce7e8bf76b2870887319b9a6b6345b", ("a.txt",))
    assert intent.outcome.files == FilesHalf(True, True, ("a.txt",), 1, 1, source="checkpoint")
    assert intent.outcome.conversation == ConversationHalf()
    assert intent.planned_leaf == intent.planned_last_message_id == "653644de-06bf-4ea4-bc36-a8a768eec585"
    assert intent.planned_transcript_size == 418
    _written_back(intent, V1["files_from_checkpoints"])


def test_a_conversation_intent_of_the_previous_version_loads_and_is_written_back_as_it_was() -> None:
    intent = Intent.from_json(V1["conversation"])
    assert not intent.restores_files and intent.files_before is None
    assert intent.anchor == Anchor(
        session_id="f3d9c47b-3479-4cae-902d-61616cd224d2",
        anchor_uuid="43a3aff1-6885-40ef-a5d7-b8e128092ca5",
        target_message_id="6ae5a211-7fa5-41fc-8ae9-df401da3ac55",
        transcript_size=645,
        drops_turn=None,
        rewind_id="def286b8-be18-4e86-86d9-54fc04baa74f",
    )
    assert intent.target == intent.anchor.target_message_id
    assert intent.outcome.conversation == ConversationHalf(True, True, False, 2)
    _written_back(intent, V1["conversation"])


def test_a_both_halves_intent_of_the_previous_version_without_snapshots_loads() -> None:
    intent = Intent.from_json(V1["both_from_checkpoints"])
    assert intent.restores_files and intent.anchor is not None
    assert intent.snapshot is None and intent.files_before is None, "a server without snapshots"
    assert intent.outcome.conversation.messages_dropped == 4
    _written_back(intent, V1["both_from_checkpoints"])


def test_a_both_halves_intent_of_the_previous_version_served_by_snapshots_loads() -> None:
    intent = Intent.from_json(V1["both_from_snapshots"])
    paths = ("a.txt", "b.txt", "c.txt")
    assert intent.snapshot == SnapshotRestore(
        "d76b9a8d0bad32279b95930405df2a1b33acb060", "1a1ef69070f349c42eca130df7a2e64dee97bed6", paths
    )
    assert intent.files_before == FilesBefore("1a1ef69070f349c42eca130df7a2e64dee97bed6", paths)
    assert intent.outcome.files.source == "snapshot"
    assert intent.outcome.files.files_changed == tuple(f"/srv/ws/{p}" for p in paths)
    _written_back(intent, V1["both_from_snapshots"])


def test_a_files_intent_of_the_previous_version_with_a_conflict_loads() -> None:
    intent = Intent.from_json(V1["files_from_snapshots_overwriting"])
    assert intent.outcome.files.conflicts == (("c.txt", "overwritten"),)
    _written_back(intent, V1["files_from_snapshots_overwriting"])


def test_an_intent_of_the_first_builds_loads_with_what_it_did_not_record_unknown() -> None:
    intent = Intent.from_json(V1["oldest"])
    assert intent.target == "7c1d0e43-2b70-4b43-9c8e-1f5d3c2a9b10" and not intent.restores_files
    assert intent.anchor is not None and intent.anchor.drops_turn == intent.target, "as it was recorded"
    assert (intent.snapshot, intent.files_before) == (None, None)
    assert (intent.planned_leaf, intent.planned_last_message_id, intent.planned_transcript_size) == (
        None,
    ) * 3
    assert intent.outcome.files == FilesHalf(), "the fields added since take their defaults"
    _kept(V1["oldest"], stored(intent.to_json()))


def test_undo_intents_of_the_previous_version_load_and_are_written_back_as_they_were() -> None:
    files = UndoIntent.from_json(V1["undo_of_files_from_checkpoints"])
    assert files.undoes == "f80337ae-218d-4c6f-a03f-6a0f67f8bc3b" and files.leaf is None
    assert files.files == UndoFiles(
        before="a8305634c3ce7e8bf76b2870887319b9a6b6345b",
        now="379f82bf7253958bbe80a70e6a8afccc625ea00b",
        paths=("a.txt",),
        insertions=1,
        deletions=1,
        conflicts=(),
        source="checkpoint",
    )
    conversation = UndoIntent.from_json(V1["undo_of_conversation"])
    assert conversation.files is None and conversation.leaf == "97f3a113-bb7a-4f80-933f-7217585e8caf"
    assert conversation.outcome.conversation == ConversationHalf(True, True, True, 0)
    both = UndoIntent.from_json(V1["undo_of_both_from_snapshots"])
    assert both.files is not None and both.files.whole == "d76b9a8d0bad32279b95930405df2a1b33acb060"
    assert both.leaf == "458d54c3-8e8e-4a17-a690-b335935050f3"
    for intent, literal in (
        (files, V1["undo_of_files_from_checkpoints"]),
        (conversation, V1["undo_of_conversation"]),
        (both, V1["undo_of_both_from_snapshots"]),
    ):
        _written_back(intent, literal)


def test_an_applied_rewinds_result_of_the_previous_version_loads_with_what_an_undo_needs() -> None:
    applied = Applied.from_json(V1["applied_files_from_checkpoints"])
    assert applied.files_after == "379f82bf7253958bbe80a70e6a8afccc625ea00b"
    assert applied.outcome.last_message_id == "653644de-06bf-4ea4-bc36-a8a768eec585"
    assert stored(applied.to_json()) == V1["applied_files_from_checkpoints"]
    conversation = Applied.from_json(V1["applied_conversation"])
    assert conversation.files_after is None and conversation.outcome.conversation.rewound
    assert stored(conversation.to_json()) == V1["applied_conversation"]


@pytest.mark.parametrize("name", ["conversation", "both_from_checkpoints"])
async def test_recovery_finishes_an_intent_written_as_the_previous_version_wrote_it(
    make_setup: MakeSetup, name: str
) -> None:
    """Every field of today's version 1, no "version" field: the rewind is finished as recorded
    (its ids and sizes made this session's)."""
    s = await make_setup()
    s.turn("one")
    first_reply = s.last
    two = s.turn("two")
    size = s.path.stat().st_size
    written = V1[name]
    mode = Mode.BOTH if written["files"] else Mode.CONVERSATION
    ids = {"anchor_uuid": first_reply, "session_id": s.sid, "target_message_id": two, "rewind_id": "r1"}
    literal = {
        **written,
        "target": two,
        "anchor": {**written["anchor"], **ids, "transcript_size": size},
        "outcome": {**written["outcome"], "rewind_id": "r1"},
        "planned_last_message_id": s.last,
        "planned_leaf": s.last,
        "planned_transcript_size": size,
    }
    await s.ledger.begin_rewind(NewRewind("r1", s.sid, two, mode.value, literal))
    await within(s.engine.recover({s.sid: s.worker}))
    [record] = await s.ledger.rewinds(s.sid)
    assert (record.rewind_id, record.state) == ("r1", "applied") and record.result is not None
    assert Applied.from_json(record.result).outcome.conversation.rewound
    assert s.knobs.applied == ([two] if written["files"] else [])
    assert [(e.kind, e.rewind_id) for e in s.published] == [("REWOUND", "r1")]
    assert await s.texts() == ["one"]


# Intents this version cannot read

UNREADABLE = {
    "a later version": {**V1["conversation"], "version": 3},
    "a version that is not a number": {**V1["conversation"], "version": "1"},
    "not an object": ["target", "files"],
    "no target": {k: v for k, v in V1["conversation"].items() if k != "target"},
    "no outcome": {k: v for k, v in V1["conversation"].items() if k != "outcome"},
    "a files flag that is not a bool": {**V1["conversation"], "files": "no"},
    "an anchor missing a field": {**V1["conversation"], "anchor": {"anchor_uuid": "x"}},
    "an outcome missing a half": {
        **V1["conversation"],
        "outcome": {"rewind_id": "r1", "last_message_id": ""},
    },
    "paths that are not strings": {**V1["both_from_snapshots"], "undo": {"before": BEFORE, "paths": [1]}},
}


@pytest.mark.parametrize("name", UNREADABLE)
def test_an_intent_this_version_cannot_read_is_refused_clearly(name: str) -> None:
    with pytest.raises(UnreadableIntent) as caught:
        Intent.from_json(UNREADABLE[name])
    assert not isinstance(caught.value, (KeyError, TypeError))


def test_an_undo_intent_of_a_later_version_or_without_its_rewind_is_refused() -> None:
    with pytest.raises(UnreadableIntent, match="version 2"):
        UndoIntent.from_json({**V1["undo_of_conversation"], "version": 2})
    with pytest.raises(UnreadableIntent, match="undoes"):
        UndoIntent.from_json({k: v for k, v in V1["undo_of_conversation"].items() if k != "undoes"})
    with pytest.raises(UnreadableIntent, match="conflicts"):
        files = {**V1["undo_of_files_from_checkpoints"]["files"], "conflicts": [["a.txt"]]}
        UndoIntent.from_json({**V1["undo_of_files_from_checkpoints"], "files": files})


@pytest.mark.parametrize("name", ["a later version", "no outcome"])
async def test_recovery_keeps_an_intent_it_cannot_read_and_the_session_s_calls_fail_on_it(
    make_setup: MakeSetup, name: str
) -> None:
    """Recovery at start is bounded per session (issue 36): an intent it cannot read is logged and
    kept, the server serves the other sessions, and this session's next rewind fails the same way
    rather than running on half a rewind."""
    s = await make_setup()
    s.turn("one")
    two = s.turn("two")
    await s.ledger.begin_rewind(NewRewind("r1", s.sid, two, Mode.CONVERSATION.value, UNREADABLE[name]))
    await within(s.engine.recover({s.sid: s.worker}))
    assert [r.rewind_id for r in await s.pending()] == ["r1"]
    with pytest.raises(UnreadableIntent, match="the intent of rewind r1 cannot be read"):
        await within(s.engine.resolve_pending(s.worker))
    with pytest.raises(UnreadableIntent):
        await within(s.engine.rewind(s.worker, s.request(two, Mode.CONVERSATION)))
    assert [r.rewind_id for r in await s.pending()] == ["r1"]
    assert await s.texts() == ["one", "two"]
    assert not s.worker.lock.locked()
