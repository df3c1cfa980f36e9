"""A rewind's outcome is defined once (rewind/outcome.py) and made into the ledger's JSON, an
event's data and the protobuf from that one definition: here the three agree, field by field,
for an outcome with every field set, so a field that one of them misses fails here.

And what earlier versions wrote reads the same: the ledger's rows (tests/unit/rewind/
test_intent.py) and the events (below, as each version's `event_data` wrote them).
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from agent_rewind.api.v1 import rewind_pb2
from agent_rewind.rewind.outcome import (
    ConversationHalf,
    FilesHalf,
    Refusal,
    RewindOutcome,
    event_data,
    from_event,
)
from agent_rewind.rewind.side_effects import SideEffect
from agent_rewind.rpc.convert import rewind_event, rewind_result
from agent_rewind.store.ledger import EventRecord

# Every field set, none at its default (`test_the_outcome_here_has_every_field_set`).
FULL = RewindOutcome(
    rewind_id="r-1",
    files=FilesHalf(
        requested=True,
        can_rewind=True,
        files_changed=("/ws/a.txt", "/ws/b.txt"),
        insertions=3,
        deletions=4,
        skipped_links=5,
        refusal=Refusal("EXTERNAL_CHANGES", "someone else changed b.txt", {"paths": "b.txt"}),
        source="snapshot",
        conflicts=(("b.txt", "overwritten"), ("c.txt", "skipped")),
        diffs=(
            {
                "path": "a.txt",
                "change": "modified",
                "unified_diff": "-a\n+b\n",
                "binary": True,
                "truncated": True,
            },
            {"path": "d.txt", "change": "added", "unified_diff": "+d\n", "binary": True, "truncated": True},
        ),
        diffs_truncated=True,
    ),
    conversation=ConversationHalf(
        requested=True,
        can_rewind=True,
        rewound=True,
        messages_dropped=6,
        refusal=Refusal("NO_CONVERSATION_ANCHOR", "no anchor", {"message_id": "p-1"}),
    ),
    last_message_id="m-7",
    side_effects=(
        SideEffect("p-1", "WebFetch", "https://example.com/"),
        SideEffect("p-2", "Bash", "pypi.org:443"),
    ),
)
TARGET, OWNER = "p-1", "alice"


def stored(data: Any) -> Any:
    """What the ledger gives back of what it was given: the JSON of it."""
    return json.loads(json.dumps(data))


def _event(data: dict[str, Any], kind: str = "REWOUND") -> EventRecord:
    return EventRecord(7, kind, "s-1", "r-1", "bob", datetime(2026, 1, 2, tzinfo=UTC), stored(data))


def _default(f: dataclasses.Field[Any]) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _set_everywhere(value: Any, where: str) -> None:
    if dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            inner = getattr(value, f.name)
            assert inner != _default(f), f"{where}.{f.name} is at its default: set it here"
            _set_everywhere(inner, f"{where}.{f.name}")
    elif isinstance(value, tuple) and value:
        _set_everywhere(value[0], f"{where}[0]")
    elif isinstance(value, dict):
        assert value, f"{where} is empty"
        for key, inner in value.items():
            assert inner not in ("", 0, False, None), f"{where}[{key!r}] is at its default: set it here"


def _agrees(value: Any, pb: Any, where: str, field: FieldDescriptor | None = None) -> None:
    """`value` (the outcome's) and `pb` (the protobuf's) say the same, field by field: a field of
    the outcome's that the message lacks, or one the message has that the outcome does not fill,
    fails."""
    if dataclasses.is_dataclass(value) or (isinstance(value, dict) and isinstance(pb, Message)):
        assert isinstance(pb, Message), where
        names = (
            [f.name for f in dataclasses.fields(value)] if dataclasses.is_dataclass(value) else list(value)
        )
        fields = pb.DESCRIPTOR.fields_by_name
        assert set(names) == set(fields), (
            f"{where}: the outcome has {sorted(names)}, the message {sorted(fields)}"
        )
        for name in names:
            inner = getattr(value, name) if dataclasses.is_dataclass(value) else value[name]
            if inner is None:  # a message not set
                assert not pb.HasField(name), f"{where}.{name} is set"
                continue
            _agrees(inner, getattr(pb, name), f"{where}.{name}", fields[name])
    elif isinstance(value, dict):  # a map
        assert dict(pb) == value, where
    elif isinstance(value, tuple) and field is not None and field.is_repeated:
        assert len(pb) == len(value), where
        for n, (item, pb_item) in enumerate(zip(value, pb, strict=True)):
            _agrees(item, pb_item, f"{where}[{n}]", None)
    elif isinstance(value, tuple):  # a pair: the message's fields in order
        assert isinstance(pb, Message), where
        fields = pb.DESCRIPTOR.fields
        assert len(fields) == len(value), f"{where}: {len(value)} values for {len(fields)} fields"
        for item, f in zip(value, fields, strict=True):
            _agrees(item, getattr(pb, f.name), f"{where}.{f.name}", f)
    elif field is not None and field.enum_type is not None:
        name = field.enum_type.values_by_number[pb].name
        assert name.endswith("_" + str(value).upper()), f"{where}: {value!r} became {name}"
    else:
        assert pb == value, f"{where}: {value!r} became {pb!r}"


def _told_of(outcome: RewindOutcome) -> RewindOutcome:
    """What an event tells of `outcome`: the files half without its RESULT_ONLY fields, whether the
    conversation changed and how many messages left it, the newest message."""
    untold = {f.name: _default(f) for f in dataclasses.fields(FilesHalf) if not f.metadata.get("event", True)}
    conversation = ConversationHalf(
        rewound=outcome.conversation.rewound, messages_dropped=outcome.conversation.messages_dropped
    )
    return RewindOutcome(
        "", dataclasses.replace(outcome.files, **untold), conversation, outcome.last_message_id
    )


def test_the_outcome_here_has_every_field_set() -> None:
    """A field added to the outcome and not set in FULL fails here first."""
    _set_everywhere(FULL, "FULL")


def test_the_ledgers_json_reads_back_as_the_outcome() -> None:
    assert RewindOutcome.from_json(stored(FULL.to_json())) == FULL


def test_the_result_in_protobuf_says_what_the_outcome_says() -> None:
    _agrees(FULL, rewind_result(FULL), "RewindResult")


def test_the_event_tells_what_the_result_tells_but_for_what_events_do_not_tell() -> None:
    result = rewind_result(FULL)
    data = stored(event_data(TARGET, "both", FULL, owner=OWNER))
    event = rewind_event(_event(data))
    # The event's data reads back as what it tells of the outcome ...
    told = _told_of(FULL)
    assert from_event(data) == told
    # ... and its protobuf says that, as the result says it.
    _agrees(told.files, event.files, "RewindEvent.files")
    untold = [f.name for f in dataclasses.fields(FilesHalf) if not f.metadata.get("event", True)]
    assert untold == ["refusal", "conflicts", "diffs", "diffs_truncated"], "what events have never told"
    expected = rewind_pb2.FilesRewindResult()
    expected.CopyFrom(result.files)
    for name in untold:
        expected.ClearField(name)
    assert event.files == expected
    assert (event.messages_dropped, event.conversation_changed, event.last_message_id) == (
        result.conversation.messages_dropped,
        result.conversation.rewound,
        result.last_message_id,
    )
    assert (event.message_id, event.mode, event.rewind_id) == (TARGET, rewind_pb2.REWIND_MODE_BOTH, "r-1")
    assert (data["owner"], event.principal) == (OWNER, "bob")


# Events as earlier versions wrote them

_FILES = {
    "requested": True,
    "can_rewind": True,
    "files_changed": ["/ws/a.txt"],
    "insertions": 1,
    "deletions": 2,
    "skipped_links": 3,
}
EARLIER = {
    # The first events: no owner, no source.
    "the first": {
        "message_id": TARGET,
        "mode": "both",
        "files": _FILES,
        "messages_dropped": 2,
        "conversation_changed": True,
        "last_message_id": "m-1",
    },
    # With the owner and the source ("" when the files half was not asked for).
    "with a source": {
        "owner": OWNER,
        "message_id": TARGET,
        "mode": "files",
        "files": {**_FILES, "source": "snapshot"},
        "messages_dropped": 0,
        "conversation_changed": False,
        "last_message_id": "m-1",
    },
    "of a conversation alone": {
        "owner": OWNER,
        "message_id": TARGET,
        "mode": "conversation",
        "files": {**_FILES, "requested": False, "can_rewind": False, "files_changed": [], "source": ""},
        "messages_dropped": 4,
        "conversation_changed": True,
        "last_message_id": "m-1",
    },
}
EXPECTED = {
    "the first": rewind_pb2.FilesRewindResult(
        requested=True,
        can_rewind=True,
        files_changed=["/ws/a.txt"],
        insertions=1,
        deletions=2,
        skipped_links=3,
        source=rewind_pb2.FILES_SOURCE_CHECKPOINT,
    ),
    "with a source": rewind_pb2.FilesRewindResult(
        requested=True,
        can_rewind=True,
        files_changed=["/ws/a.txt"],
        insertions=1,
        deletions=2,
        skipped_links=3,
        source=rewind_pb2.FILES_SOURCE_SNAPSHOT,
    ),
    "of a conversation alone": rewind_pb2.FilesRewindResult(insertions=1, deletions=2, skipped_links=3),
}


@pytest.mark.parametrize("name", EARLIER)
def test_an_event_an_earlier_version_wrote_reads_as_it_did(name: str) -> None:
    written = EARLIER[name]
    event = rewind_event(_event(written))
    assert event.HasField("files") and event.files == EXPECTED[name]
    assert (event.messages_dropped, event.conversation_changed, event.last_message_id) == (
        written["messages_dropped"],
        written["conversation_changed"],
        "m-1",
    )
    assert event.message_id == TARGET and event.mode != rewind_pb2.REWIND_MODE_UNSPECIFIED


def test_this_versions_event_keeps_every_key_an_earlier_version_wrote() -> None:
    """A server of the previous version (a rollback, another replica) reads what this one writes."""
    data = stored(
        event_data(
            TARGET, "files", RewindOutcome("r-1", FilesHalf(**_FILES), ConversationHalf(), "m-1"), OWNER
        )
    )
    earlier = EARLIER["with a source"]
    assert data.keys() == earlier.keys() and data["files"].keys() == earlier["files"].keys()
    assert {**data, "files": {**data["files"], "source": "snapshot"}} == earlier


def test_a_session_deleted_event_tells_no_outcome() -> None:
    event = rewind_event(_event({"owner": OWNER}, kind="SESSION_DELETED"))
    assert from_event({"owner": OWNER}) is None
    assert not event.HasField("files")
    assert (event.messages_dropped, event.conversation_changed, event.last_message_id, event.message_id) == (
        0,
        False,
        "",
        "",
    )
    assert event.kind == rewind_pb2.REWIND_EVENT_KIND_SESSION_DELETED
