"""Which transcript entries are rewind points, checked on transcripts the real CLI wrote.

The truth comes from the CLI's side (expected.json): the prompts it replayed on the live stream,
the messages it streamed as tool results, subagent or synthetic messages, the SDK's own reading
of the conversation, and the CLI's answer to a files dry run for each user message.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from agent_rewind.errors import NotARewindPoint
from agent_rewind.transcript import EntryKind, classify
from agent_rewind.transcript.entries import PREVIEW_CHARS, RewindPoint, parse_timestamp, prompt_text

from .conftest import FIXTURES, Recorded

Make = Callable[..., Recorded]


def _kind_of_refusal(rec: Recorded, message_id: str) -> str:
    with pytest.raises(NotARewindPoint) as refused:
        rec.index.view().resolve(message_id)
    return refused.value.metadata["kind"]


@pytest.mark.parametrize("name", FIXTURES)
def test_points_are_the_prompts_the_user_sent_that_are_still_in_the_conversation(
    recorded: Make, name: str
) -> None:
    rec = recorded(name)
    points = list(rec.index.view().points)
    # The prompts before a compaction stay points, compacted; the rest are what the SDK shows.
    compacted = rec.expected.get("compacted_prompts", [])
    assert name.startswith("compact") == bool(compacted)

    assert [p.message_id for p in points] == compacted + rec.expected["visible_prompts"]
    assert [p.compacted for p in points] == [True] * len(compacted) + [False] * len(
        rec.expected["visible_prompts"]
    )
    assert [p.index for p in points] == list(range(len(points)))
    sent = {t["uuid"]: t["prompt"] for t in rec.turns}
    assert [p.text for p in points] == [sent[p.message_id] for p in points]


def test_points_are_what_the_model_still_sees_after_two_rewinds(recorded: Make) -> None:
    rec = recorded("rewinds")

    # The last turn was `recall`: the model listed every prompt of the conversation it was sent.
    assert [p.text for p in rec.index.view().points] == rec.expected["recall"]


def test_tool_results_are_not_points(recorded: Make) -> None:
    rec = recorded("tools")
    results = [u for t in rec.turns for u in t["tool_results"]]

    assert len(results) >= 7  # several tools in one turn, Bash, Read, the subagent's hand-back
    assert {_kind_of_refusal(rec, u) for u in results} == {EntryKind.TOOL_RESULT.value}


def test_messages_the_cli_made_up_are_not_points(recorded: Make) -> None:
    rec = recorded("synthetic")
    made_up = {t["prompt"]: t["synthetic"] for t in rec.turns if t["synthetic"]}

    # "[Your previous response had no visible output...]" (isMeta), "[Request interrupted by
    # user]" (no promptSource), a background task's notification turn (origin).
    assert sorted(made_up) == ["bgbash sleep 1; echo bg > bg.txt\nsay started", "say", "say slow\nsleep 3"]
    for uuids in made_up.values():
        assert [_kind_of_refusal(rec, u) for u in uuids] == [EntryKind.SYNTHETIC.value]


def test_compaction_summary_and_command_output_are_not_points(recorded: Make) -> None:
    rec = recorded("compact")
    made_up = rec.turn("/compact")["synthetic"]

    assert made_up  # the summary and "<local-command-stdout>Compacted"
    assert {_kind_of_refusal(rec, u) for u in made_up} == {EntryKind.SYNTHETIC.value}


def test_subagent_messages_are_not_points(recorded: Make) -> None:
    rec = recorded("tools")
    subagent = rec.turn("agent write d.txt dee\\nbash ls\\nsay sub done\nsay delegated")["subagent"]

    # Their own prompt, tool calls and results, by uuid and by msg_ id: all in subagents/*.jsonl.
    assert any(s.startswith("msg_") for s in subagent) and any(not s.startswith("msg_") for s in subagent)
    assert {_kind_of_refusal(rec, s) for s in subagent} == {EntryKind.SUBAGENT.value}


@pytest.mark.parametrize("name", ["plain", "tools", "synthetic", "rewinds"])
def test_the_cli_has_a_file_checkpoint_for_each_point_and_for_no_other_message(
    recorded: Make, name: str
) -> None:
    answers: dict[str, Any] = next(c for c in recorded(name).expected["checkpoints"] if c["label"] == "end")
    rec = recorded(name, size=answers["size"])
    view = rec.index.view()
    points = {p.message_id for p in view.points}
    on_chain = {u: can for u, can in answers["can_rewind"].items() if view.contains(u)}

    assert points
    assert len(on_chain) > len(points)  # tool results and synthetic messages were asked too
    assert {u for u, can in on_chain.items() if can} == points
    assert all(p.has_checkpoint for p in view.points)


# --- the rules on minimal entries ---------------------------------------------------------------
def _user(content: Any = "hi", **fields: Any) -> dict[str, Any]:
    return {"type": "user", "uuid": "u", "message": {"role": "user", "content": content}, **fields}


@pytest.mark.parametrize(
    ("entry", "kind"),
    [
        (_user(promptSource="sdk"), EntryKind.PROMPT),
        (_user(promptSource="typed"), EntryKind.PROMPT),
        (_user([{"type": "text", "text": "hi"}], promptSource="sdk"), EntryKind.PROMPT),
        (_user(), EntryKind.SYNTHETIC),  # no prompt marker: an interrupt, a command's echo
        (_user(promptSource="system"), EntryKind.SYNTHETIC),
        (_user(promptSource="sdk", origin={"kind": "task-notification"}), EntryKind.SYNTHETIC),
        (_user(promptSource="sdk", isMeta=True), EntryKind.SYNTHETIC),
        (_user(promptSource="sdk", isCompactSummary=True), EntryKind.SYNTHETIC),
        (_user([{"type": "tool_result", "tool_use_id": "t", "content": "ok"}]), EntryKind.TOOL_RESULT),
        (_user("x", toolUseResult={}), EntryKind.TOOL_RESULT),
        (_user(promptSource="sdk", isSidechain=True), EntryKind.SUBAGENT),
        ({"type": "assistant", "uuid": "a", "message": {"id": "msg_1"}}, EntryKind.ASSISTANT),
        ({"type": "attachment", "uuid": "a"}, EntryKind.ATTACHMENT),
        ({"type": "system", "subtype": "compact_boundary", "uuid": "s"}, EntryKind.SYSTEM),
        ({"type": "progress", "uuid": "p"}, EntryKind.OTHER),
    ],
)
def test_classify_keys_on_the_cli_markers(entry: dict[str, Any], kind: EntryKind) -> None:
    assert classify(entry) is kind


def test_prompt_text_joins_text_blocks_and_skips_others() -> None:
    blocks = [{"type": "text", "text": "a"}, {"type": "image", "source": {}}, {"type": "text", "text": "b"}]

    assert prompt_text(_user(blocks)) == "a\nb"
    assert prompt_text(_user("plain")) == "plain"
    assert prompt_text({"type": "user"}) == ""


def test_timestamps_are_utc_and_bad_ones_are_none() -> None:
    assert parse_timestamp("2026-11-29T23:12:20.877Z") == datetime(
        2026, 11, 29, 23, 12, 20, 877000, tzinfo=UTC
    )
    assert parse_timestamp("2026-11-29T23:12:20") == datetime(2026, 11, 29, 23, 12, 20, tzinfo=UTC)
    assert parse_timestamp("") is None
    assert parse_timestamp("yesterday") is None


def test_preview_is_cut_to_the_preview_length() -> None:
    point = RewindPoint("u", "", "x" * (PREVIEW_CHARS + 5), 0, None, False)

    assert point.preview == "x" * PREVIEW_CHARS
