"""The transcript index: visible chains after rewinds, id resolution, incremental reads, the
file-checkpoint window and the cost of a view."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

import agent_rewind.transcript.view as transcript_module
from agent_rewind.errors import InvalidArgument, MessageNotFound, NotARewindPoint
from agent_rewind.transcript import FILE_CHECKPOINT_WINDOW, EntryKind, RewindPoint, TranscriptIndex

from .conftest import FIXTURES, Recorded

Make = Callable[..., Recorded]


def _ids(points: Any) -> list[str]:
    return [p.message_id for p in points]


# --- the visible conversation --------------------------------------------------------------------
def test_turns_dropped_by_two_rewinds_are_not_found(recorded: Make) -> None:
    rec = recorded("rewinds")
    view = rec.index.view()
    dropped = [t for t in rec.turns if not t["visible"]]

    assert [t["prompt"] for t in dropped] == [
        "edit a.txt one => two\nsay edited",
        "agent say deep\nsay delegated again",
        "write c.txt cee\nsay six",
        "say seven",
    ]
    for turn in dropped:
        for message_id in [
            turn["uuid"],
            *turn["assistant_uuids"],
            *turn["assistant_ids"],
            *turn["tool_results"],
        ]:
            assert not view.contains(message_id)
            with pytest.raises(MessageNotFound):
                view.resolve(message_id)


def test_a_subagent_started_by_a_dropped_turn_is_not_found(recorded: Make) -> None:
    rec = recorded("rewinds")
    view = rec.index.view()
    kept = rec.turn("agent write s.txt sub\\nsay sub done\nsay delegated")["subagent"]
    dropped = rec.turn("agent say deep\nsay delegated again")["subagent"]

    assert kept and dropped
    for message_id in kept:
        with pytest.raises(NotARewindPoint):
            view.resolve(message_id)
    for message_id in dropped:
        with pytest.raises(MessageNotFound):
            view.resolve(message_id)


def test_the_first_prompt_has_no_resume_anchor_and_the_others_resume_at_their_parent(recorded: Make) -> None:
    rec = recorded("plain")
    view = rec.index.view()
    data = rec.full_transcript()
    first, *rest = view.points

    assert first.resume_at_message_id == ""
    assert rest, "the fixture has more than one prompt"
    for point in rest:
        anchor = rec.index.get(point.resume_at_message_id)
        assert anchor is not None and view.contains(anchor.uuid)
        line = data[anchor.offset : data.index(b"\n", anchor.offset)]
        assert json.loads(line)["uuid"] == anchor.uuid  # `offset` is where its line starts
        prompt = rec.index.get(point.message_id)
        assert prompt is not None and prompt.parent_uuid == anchor.uuid and anchor.offset < prompt.offset


@pytest.mark.parametrize("name", ["rewinds", "compact"])
def test_resume_at_is_the_anchor_the_cli_accepted_for_the_rewind(recorded: Make, name: str) -> None:
    # The recorder resumed at each of these anchors and the CLI went on from there; in `compact`
    # the anchor is an attachment entry, not a message.
    rewinds = recorded(name).expected["rewinds"]
    assert rewinds, f"{name} records no rewind"
    for rewind in rewinds:
        rec = recorded(name, size=rewind["size_before"])

        assert rec.index.view().resolve(rewind["to"]).resume_at_message_id == rewind["anchor"]


def test_a_view_at_the_anchor_is_the_conversation_once_the_next_prompt_is_written(recorded: Make) -> None:
    second_rewind = recorded("rewinds").expected["rewinds"][1]
    before = recorded("rewinds", size=second_rewind["size_before"])
    after = recorded("rewinds")
    anchor = before.index.view().resolve(second_rewind["to"]).resume_at_message_id

    pending = before.index.view(anchor)

    assert pending.leaf == anchor
    assert _ids(pending.points) == _ids(after.index.view().points)[:-1]
    assert pending.last_message_id == anchor  # an assistant reply
    assert not pending.contains(second_rewind["to"])


def test_the_prompts_before_a_compaction_stay_points_the_cli_cannot_resume_at(recorded: Make) -> None:
    rec = recorded("compact")
    view = rec.index.view()
    before = rec.turns[:2]
    assert [t["prompt"] for t in before] == ["say one", "write a.txt A\nsay wrote"]

    # The chain runs on through the compaction's boundary to the entry it summarized up to.
    assert view.contains(rec.expected["pre_compact_anchor"])
    points = [view.resolve(turn["uuid"]) for turn in before]
    assert [p.index for p in points] == [0, 1]
    assert all(p.compacted for p in points)
    # The CLI refused to resume at an entry from before the compaction, and keeps no checkpoint
    # of such a prompt: both come from the service (a copy; workspace snapshots).
    assert "No message found" in rec.expected["pre_compact_resume_error"]
    assert points[1].anchor == points[1].resume_at_message_id == rec.expected["pre_compact_anchor"]
    assert not any(p.has_checkpoint or p.checkpoint_pending for p in points)
    # A view that ends before the compaction has nothing compacted.
    earlier = rec.index.view(rec.expected["pre_compact_anchor"])
    assert [(p.message_id, p.compacted) for p in earlier.points] == [(before[0]["uuid"], False)]


@pytest.mark.parametrize("name", FIXTURES)
def test_last_message_and_messages_dropped_agree_with_the_sdk(recorded: Make, name: str) -> None:
    rec = recorded(name)
    view = rec.index.view()
    # The SDK names the CLI's entries; a copy of a compacted conversation shows the original's id.
    sdk = [_shown_id(rec, m["uuid"]) for m in rec.expected["sdk_messages"]]

    assert view.last_message_id == sdk[-1]
    assert view.points, f"{name} has no rewind points"
    for point in view.points:
        if not point.compacted:  # the SDK shows the conversation from the newest compaction on
            assert view.messages_from(point) == len(sdk) - sdk.index(point.message_id)
    compacted = [p for p in view.points if p.compacted]
    assert [p.message_id for p in compacted] == rec.expected.get("compacted_prompts", [])
    if compacted:
        # Back to the first prompt: every message before the compaction too (each turn's
        # prompt, replies and tool results, as the live stream reported them).
        turns = rec.turns[: len(compacted)]
        before = sum(1 + len(t["assistant_uuids"]) + len(t["tool_results"]) for t in turns)
        assert view.messages_from(compacted[0]) == before + len(sdk)


def _shown_id(rec: Recorded, uuid: str) -> str:
    entry = rec.index.get(uuid)
    return entry.id if entry is not None else uuid


# --- resolving a client's message id -------------------------------------------------------------
@pytest.mark.parametrize("name", ["tools", "synthetic", "rewinds"])
def test_an_assistant_msg_id_resolves_to_the_turn_that_contains_it(recorded: Make, name: str) -> None:
    rec = recorded(name)
    view = rec.index.view()
    visible = [t for t in rec.turns if t["visible"] and t["uuid"]]

    assert sum(len(t["assistant_ids"]) for t in visible) > len(visible)
    for turn in visible:
        for api_id in turn["assistant_ids"]:
            assert view.resolve(api_id).message_id == turn["uuid"]


def test_a_reply_to_a_turn_the_cli_injected_belongs_to_the_prompt_before_it(recorded: Make) -> None:
    rec = recorded("synthetic")
    turn = rec.turn("bgbash sleep 1; echo bg > bg.txt\nsay started")
    injected = rec.index.get(turn["synthetic"][0])
    reply = rec.turns[3]["assistant_ids"][-1]  # "Done.", answering the task notification

    assert injected is not None and injected.kind is EntryKind.SYNTHETIC
    assert rec.index.view().resolve(reply).message_id == turn["uuid"]


def test_a_prompt_uuid_resolves_to_its_point(recorded: Make) -> None:
    rec = recorded("tools")
    view = rec.index.view()

    assert view.points
    for i, point in enumerate(view.points):
        assert view.resolve(point.message_id) == point == view.points[i]


def test_an_assistant_uuid_is_not_a_rewind_point(recorded: Make) -> None:
    rec = recorded("tools")
    view = rec.index.view()

    assert any(turn["assistant_uuids"] for turn in rec.turns)
    for turn in rec.turns:
        for message_id in turn["assistant_uuids"]:
            with pytest.raises(NotARewindPoint) as refused:
                view.resolve(message_id)
            assert refused.value.metadata == {"message_id": message_id, "kind": "assistant_message"}


def test_unknown_ids_are_not_found_and_malformed_ones_are_invalid(recorded: Make) -> None:
    view = recorded("plain").index.view()

    for unknown in (str(uuid.uuid4()), "msg_0123456789"):
        with pytest.raises(MessageNotFound):
            view.resolve(unknown)
    for malformed in ("", "hello", "1234", "msg", f"{uuid.uuid4()}x"):
        with pytest.raises(InvalidArgument) as refused:
            view.resolve(malformed)
        assert refused.value.field == "message_id"


def test_a_view_at_an_unknown_leaf_is_refused(recorded: Make) -> None:
    with pytest.raises(MessageNotFound):
        recorded("plain").index.view(str(uuid.uuid4()))


# --- the file-checkpoint window -------------------------------------------------------------------
def test_checkpoints_match_the_cli_that_wrote_the_prompts_even_after_a_rewind(recorded: Make) -> None:
    answers = {c["label"]: c for c in recorded("window").expected["checkpoints"]}
    expected_without = {
        "live, before rewind": 10,
        "rewound, before the next prompt": 10,
        "live, after rewind": 15,
    }

    for label, without in expected_without.items():
        rec = recorded("window", size=answers[label]["size"])
        points = rec.index.view().points
        cli = answers[label]["can_rewind"]

        assert [p.has_checkpoint for p in points] == [cli[p.message_id] for p in points], label
        assert [p.index for p in points if not p.has_checkpoint] == list(range(without)), label


def test_checkpoints_never_claim_more_than_a_freshly_resumed_cli_has(recorded: Make) -> None:
    fresh = next(c for c in recorded("window").expected["checkpoints"] if c["label"] == "fresh process")
    points = recorded("window", size=fresh["size"]).index.view().points
    cli = fresh["can_rewind"]

    assert any(p.has_checkpoint for p in points)
    assert all(cli[p.message_id] for p in points if p.has_checkpoint)
    # A fresh process loads only the chain's checkpoints: the 50 prompts the rewind dropped no
    # longer take places in its window, so it can rewind files to all 65 prompts, the first 15
    # included, which the process that made them could not (and the index does not claim).
    assert [p.index for p in points if cli[p.message_id] and not p.has_checkpoint] == list(range(15))
    assert len(points) == 65 and FILE_CHECKPOINT_WINDOW == 100


# --- incremental reads -----------------------------------------------------------------------------
def test_a_half_written_line_is_completed_by_the_next_refresh(recorded: Make, tmp_path: Path) -> None:
    rec = recorded("plain")
    data = rec.full_transcript()
    third = rec.index.get(rec.expected["visible_prompts"][2])
    assert third is not None
    cut = third.offset + 40
    path = tmp_path / "t.jsonl"
    path.write_bytes(data[:cut])
    index = TranscriptIndex(path)

    index.refresh()
    assert _ids(index.view().points) == rec.expected["visible_prompts"][:2]
    assert index.size == third.offset  # the cut line is held back, not consumed

    with path.open("ab") as f:
        f.write(data[cut:])
    index.refresh()
    assert _ids(index.view().points) == rec.expected["visible_prompts"]
    assert index.stats.bytes_read == len(data) and index.size == len(data)
    again = index.get(third.uuid)
    assert again is not None and again.offset == third.offset


def test_refresh_reads_each_byte_once_however_the_file_grows(recorded: Make, tmp_path: Path) -> None:
    rec = recorded("rewinds")
    data = rec.full_transcript()
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"")
    index = TranscriptIndex(path)

    for start in range(0, len(data), 7919):  # a prime: cuts fall everywhere inside lines
        with path.open("ab") as f:
            f.write(data[start : start + 7919])
        index.refresh()
        index.view()

    assert index.stats.bytes_read == len(data)
    assert index.stats.lines_parsed == rec.index.stats.lines_parsed
    assert _ids(index.view().points) == rec.expected["visible_prompts"]
    assert index.leaf == rec.index.leaf


def test_a_missing_file_is_an_empty_transcript(tmp_path: Path) -> None:
    index = TranscriptIndex(tmp_path / "absent.jsonl")

    index.refresh()
    view = index.view()

    assert index.leaf is None and index.size == 0
    assert list(view.points) == [] and view.last_message_id == "" and view.leaf is None


def test_a_replaced_or_shrunk_file_is_read_again(recorded: Make) -> None:
    rec = recorded("plain")
    other = recorded("rewinds")
    index = rec.index

    os.replace(other.path, rec.path)  # a new file under the same name
    index.refresh()
    assert _ids(index.view().points) == other.expected["visible_prompts"]

    first_prompt = index.get(other.expected["visible_prompts"][1])
    assert first_prompt is not None
    with rec.path.open("r+b") as f:  # the same file, cut short
        f.truncate(first_prompt.offset)
    index.refresh()
    assert _ids(index.view().points) == other.expected["visible_prompts"][:1]

    rec.path.unlink()
    index.refresh()
    assert index.leaf is None and list(index.view().points) == []
    assert index.stats.resets == 3


# --- cost ------------------------------------------------------------------------------------------
def _line(entry: dict[str, Any]) -> str:
    return json.dumps(entry, separators=(",", ":")) + "\n"


def _turns(first: int, count: int, parent: str | None) -> tuple[str, str]:
    """`count` turns in the CLI's shape (prompt, snapshot, attachment, request, reply), and the last uuid."""
    lines: list[str] = []
    for i in range(first, first + count):
        prompt, attachment, reply = (str(uuid.uuid4()) for _ in range(3))
        lines += [
            _line({"type": "queue-operation", "operation": "enqueue", "content": f"say {i}"}),
            _line(
                {
                    "parentUuid": parent,
                    "isSidechain": False,
                    "type": "user",
                    "message": {"role": "user", "content": f"say {i}"},
                    "uuid": prompt,
                    "timestamp": "2026-11-29T23:12:20.877Z",
                    "promptSource": "sdk",
                }
            ),
            _line({"type": "file-history-snapshot", "messageId": prompt, "snapshot": {"messageId": prompt}}),
            _line({"parentUuid": prompt, "isSidechain": False, "type": "attachment", "uuid": attachment}),
            _line({"type": "api-request", "params": {"padding": "x" * 2000}}),
            _line(
                {
                    "parentUuid": attachment,
                    "isSidechain": False,
                    "message": {
                        "id": f"msg_{i}",
                        "role": "assistant",
                        "content": [{"type": "text", "text": str(i)}],
                    },
                    "type": "assistant",
                    "uuid": reply,
                }
            ),
            _line({"type": "last-prompt", "lastPrompt": f"say {i}", "leafUuid": reply}),
        ]
        parent = reply
    return "".join(lines), reply


def _long_session(tmp_path: Path, turns: int) -> tuple[TranscriptIndex, Path, str]:
    text, last = _turns(0, turns, None)
    path = tmp_path / f"long-{turns}.jsonl"
    path.write_text(text)
    index = TranscriptIndex(path)
    index.refresh()
    return index, path, last


def test_only_lines_that_matter_are_parsed(tmp_path: Path) -> None:
    index, _, _ = _long_session(tmp_path, 100)

    # Per turn: prompt, snapshot, attachment, reply. Queue, request and last-prompt lines are skipped.
    assert index.stats.lines_parsed == 4 * 100


def test_an_unchanged_transcript_gives_the_same_view_at_no_cost(tmp_path: Path) -> None:
    index, _, _ = _long_session(tmp_path, 5000)
    view = index.view()
    walked, parsed = index.stats.entries_walked, index.stats.lines_parsed

    index.refresh()

    assert index.view() is view
    assert (index.stats.entries_walked, index.stats.lines_parsed) == (walked, parsed)


def test_a_new_turn_extends_the_view_without_walking_the_old_ones(tmp_path: Path) -> None:
    index, path, last = _long_session(tmp_path, 5000)
    old = index.view()
    walked, parsed = index.stats.entries_walked, index.stats.lines_parsed

    with path.open("a") as f:
        f.write(_turns(5000, 1, last)[0])
    index.refresh()
    new = index.view()

    assert index.stats.lines_parsed - parsed == 4
    assert index.stats.entries_walked - walked == 3  # the new prompt, attachment and reply
    assert index.stats.entries_copied == 0  # the old chain grew in place
    assert len(new.points) == 5001 and new.points[-1].text == "say 5000"
    assert len(old.points) == 5000 and not old.contains(new.points[-1].message_id)  # old views hold still


def test_a_rewind_in_a_long_session_walks_only_the_new_branch(tmp_path: Path) -> None:
    index, path, _ = _long_session(tmp_path, 5000)
    before = index.view()
    target = before.points[4000]
    walked = index.stats.entries_walked

    with path.open("a") as f:  # what the CLI writes after resume_session_at=<target's anchor>
        f.write(_turns(9000, 1, target.resume_at_message_id)[0])
    index.refresh()
    after = index.view()

    assert index.stats.entries_walked - walked == 3
    assert len(after.points) == 4001 and after.points[-1].text == "say 9000"
    assert after.points[3999] == before.points[3999]
    assert not after.contains(target.message_id) and before.contains(target.message_id)
    with pytest.raises(MessageNotFound):
        after.resolve(before.points[4500].message_id)


def test_a_page_costs_the_same_at_50_and_5000_turns(tmp_path: Path) -> None:
    made: dict[int, int] = {}
    for turns in (50, 5000):
        index, _, _ = _long_session(tmp_path, turns)
        view = index.view()
        walked = index.stats.entries_walked
        with mock.patch.object(transcript_module, "RewindPoint", wraps=RewindPoint) as constructor:
            page = view.points[turns - 20 : turns]
            resolved = view.resolve(page[-1].message_id)
            dropped = view.messages_from(page[0])
        made[turns] = constructor.call_count
        assert index.stats.entries_walked == walked
        assert len(page) == 20 and resolved == page[-1] and dropped == 40

    assert made[50] == made[5000] == 21
