"""transcript/compaction.py: resuming before a compaction through a copy, on real transcripts.

The `compactions` fixture holds a /compact, then a compaction the CLI started by itself, then two
resumes the recorder made through this module's copies, and what the model saw each time
(scripts/record_transcripts.py). These tests replay each copy on the transcript as it was just
before it, and check it against what the CLI did with the recorded one.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import pytest

from agent_rewind.errors import MessageNotFound
from agent_rewind.transcript import compaction
from agent_rewind.transcript.entries import COPY_OF
from tests.unit.transcript.conftest import Recorded

Make = Callable[..., Recorded]


def _resumes(recorded: Make) -> list[dict[str, Any]]:
    resumes: list[dict[str, Any]] = recorded("compactions").expected["resumes"]
    assert len(resumes) == 2
    return resumes


@pytest.mark.parametrize("which", [0, 1], ids=["before-both-compactions", "between-them"])
def test_a_copy_brings_back_the_conversation_the_model_then_saw(recorded: Make, which: int) -> None:
    resume = _resumes(recorded)[which]
    rec = recorded("compactions", size=resume["size_before"])
    anchor = resume["anchor"]
    assert not compaction.resumable(rec.index, anchor)  # the CLI said "No message found" for these
    points_then = [p for p in rec.index.view(anchor).points]

    plan = compaction.plan_resume(rec.index, anchor)
    compaction.append(rec.path, plan.lines)
    rec.index.refresh()

    assert compaction.resumable(rec.index, plan.at)
    view = rec.index.view(plan.at)
    # The same points under the same ids, none compacted that was not before the copy.
    assert [(p.message_id, p.text, p.compacted) for p in view.points] == [
        (p.message_id, p.text, p.compacted) for p in points_then
    ]
    assert view.leaf == plan.at and view.leaf_entry is not None and view.leaf_entry.id == anchor
    # What the model saw when the CLI resumed the recorded copy: the prompts of this conversation
    # (and the CLI's own words around a /compact), then the recall itself.
    shown = [p.text for p in view.points if not p.compacted]
    assert [t for t in resume["recall"][:-1] if t in shown] == shown
    assert resume["recall"][-1] == "recall"


def test_the_copy_is_fresh_lines_that_name_what_they_copy(recorded: Make) -> None:
    resume = _resumes(recorded)[1]
    rec = recorded("compactions", size=resume["size_before"])
    originals = rec.index.view(resume["anchor"])
    plan = compaction.plan_resume(rec.index, resume["anchor"])
    lines = [json.loads(line) for line in plan.lines.splitlines()]

    assert lines and all(rec.index.get(line["uuid"]) is None for line in lines)
    assert lines[0]["subtype"] == "compact_boundary" and lines[0]["parentUuid"] is None
    assert all(b["parentUuid"] == a["uuid"] for a, b in itertools.pairwise(lines))
    copied = {line[COPY_OF] for line in lines}
    assert resume["anchor"] in copied and all(originals.contains(u) for u in copied)
    # The boundary's summary is the copy's; the API message ids are new.
    summary = lines[1]
    assert lines[0]["compactMetadata"]["preservedSegment"]["anchorUuid"] == summary["uuid"]
    ids = [m["message"]["id"] for m in lines if m.get("type") == "assistant"]
    assert ids and not any(rec.index.get(m) for m in ids)


def test_a_copy_is_made_once_and_resumed_again(recorded: Make) -> None:
    resume = _resumes(recorded)[0]
    rec = recorded("compactions", size=resume["size_before"])
    first = compaction.plan_resume(rec.index, resume["anchor"])
    compaction.append(rec.path, first.lines)
    rec.index.refresh()

    again = compaction.plan_resume(rec.index, resume["anchor"])
    assert again == compaction.Resume(first.at, b"")
    # An entry the CLI can read needs none.
    assert compaction.plan_resume(rec.index, first.at) == compaction.Resume(first.at, b"")


def test_a_copy_cut_short_by_a_crash_is_never_resumed_and_is_made_again(recorded: Make) -> None:
    resume = _resumes(recorded)[1]
    rec = recorded("compactions", size=resume["size_before"])
    anchor = resume["anchor"]
    expected = [p.message_id for p in rec.index.view(anchor).points]
    assert expected
    plan = compaction.plan_resume(rec.index, anchor)
    # Killed mid-write: half the copy, its last line cut in the middle.
    compaction.append(rec.path, plan.lines[: len(plan.lines) // 2])
    rec.index.refresh()
    assert rec.index.get(plan.at) is None and not rec.index.copies_of(anchor)

    retry = compaction.plan_resume(rec.index, anchor)
    assert retry.lines and retry.at != plan.at
    compaction.append(rec.path, retry.lines)  # after the torn line, on a line of its own
    rec.index.refresh()
    assert [c.uuid for c in rec.index.copies_of(anchor)] == [retry.at]
    assert [p.message_id for p in rec.index.view(retry.at).points] == expected
    assert [p.message_id for p in rec.index.view(anchor).points] == expected


def test_a_client_id_of_a_copied_reply_still_names_its_turn(recorded: Make) -> None:
    rec = recorded("compactions")
    view = rec.index.view()
    turn = next(t for t in rec.turns if t["prompt"] == "say b one")
    assert turn["assistant_ids"]
    for api_id in turn["assistant_ids"]:
        assert view.resolve(api_id).message_id == turn["uuid"]
    assert view.resolve(turn["uuid"]).message_id == turn["uuid"]


def test_an_unknown_leaf_is_not_found(recorded: Make) -> None:
    rec = recorded("compactions")
    with pytest.raises(MessageNotFound):
        compaction.plan_resume(rec.index, "00000000-0000-0000-0000-000000000000")


def test_any_copy_of_an_entry_finds_the_one_on_the_visible_chain(recorded: Make) -> None:
    resume = _resumes(recorded)[0]
    rec = recorded("compactions", size=resume["size_before"])
    first = compaction.plan_resume(rec.index, resume["anchor"])
    compaction.append(rec.path, first.lines)
    rec.index.refresh()
    on_copy = rec.index.view(first.at)
    # The original, and the copy's own uuid, both name the copy on a view of the copy's chain.
    found = on_copy.find(resume["anchor"])
    assert found is not None and found.uuid == first.at
    assert on_copy.find(first.at) is found and on_copy.contains(first.at)
    # And on a view of the original's chain, the copy's uuid names the original.
    on_original = rec.index.view(resume["anchor"])
    back = on_original.find(first.at)
    assert back is not None and back.uuid == resume["anchor"]
