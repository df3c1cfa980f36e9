"""transcript/tool_calls.py: the tool calls recorded by real transcripts, a subagent's included."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from agent_rewind.transcript.tool_calls import calls_at, calls_in_line, subagent_calls
from tests.unit.transcript.conftest import Recorded


def _offsets(path: Path, uuids: list[str]) -> list[int]:
    """Byte offsets of the lines of these entries, found by reading the file line by line."""
    found: dict[str, int] = {}
    offset = 0
    for line in path.read_bytes().splitlines(keepends=True):
        raw = json.loads(line)
        if raw.get("uuid") in uuids:
            found[raw["uuid"]] = offset
        offset += len(line)
    assert set(found) == set(uuids)
    return [found[u] for u in uuids]


def test_the_calls_of_a_turn_are_read_from_its_lines(recorded: Callable[..., Recorded]) -> None:
    rec = recorded("tools")
    turns = [t for t in rec.turns if t["assistant_uuids"]]
    assert turns
    calls = [
        call.name
        for turn in turns
        for _, call in calls_at(rec.path, _offsets(rec.path, turn["assistant_uuids"]))
    ]
    # Every tool the fixture's prompts use, in the order the model called them.
    assert calls
    assert {"Write", "Edit", "Bash"} <= set(calls)


def test_a_subagents_calls_are_found_through_the_call_that_started_it(
    recorded: Callable[..., Recorded],
) -> None:
    rec = recorded("rewinds")
    turn = rec.turn("agent write s.txt sub\\nsay sub done\nsay delegated")
    spawns = [
        call.call_id
        for _, call in calls_at(rec.path, _offsets(rec.path, turn["assistant_uuids"]))
        if call.name == "Agent"
    ]
    assert len(spawns) == 1
    found = subagent_calls(rec.path, spawns)
    assert [c.name for c in found[spawns[0]]] == ["Write"]
    assert found[spawns[0]][0].input["file_path"].endswith("s.txt")
    # An id no subagent answers to is left out.
    assert subagent_calls(rec.path, ["toolu_none"]) == {}


def test_lines_that_are_not_assistant_messages_have_no_calls() -> None:
    assert calls_in_line(b'{"type":"user","message":{"content":[{"type":"tool_use","name":"X"}]}}') == []
    assert calls_in_line(b"not json") == []
    assert calls_in_line(b'{"type":"assistant","message":{"content":"text"}}') == []
    line = b'{"type":"assistant","message":{"content":[{"type":"text"},{"type":"tool_use","id":"t","name":"N","input":{"a":1}}]}}'
    [call] = calls_in_line(line)
    assert (call.call_id, call.name, call.input) == ("t", "N", {"a": 1})


def test_a_missing_transcript_has_no_calls(tmp_path: Path) -> None:
    assert list(calls_at(tmp_path / "gone.jsonl", [0])) == []
    assert subagent_calls(tmp_path / "gone.jsonl", ["t"]) == {}
