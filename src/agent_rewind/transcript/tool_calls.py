"""The tool calls a transcript records: for the turns a rewind drops, what the agent called.

The index keeps slim entries (their offsets in the file, not their content), so the calls of a few
turns are read back from the lines at those offsets when a rewind asks, and a subagent's from its
own transcript (`<session_id>/subagents/agent-<id>.jsonl`, found through the `toolUseId` its
`.meta.json` names). A subagent a dropped turn started was dropped with it, and so were its calls,
its own subagents' included.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_AGENT_TOOLS = frozenset({"Agent", "Task"})
# A subagent's subagents are followed this deep at most (a loop in damaged metadata ends here).
_MAX_NESTING = 8


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One `tool_use` block of an assistant message."""

    call_id: str
    name: str
    input: Any


def calls_in_line(line: bytes) -> list[ToolCall]:
    """The tool calls of one transcript line (none for anything but an assistant message)."""
    try:
        raw = json.loads(line)
    except ValueError:
        return []
    if not isinstance(raw, dict) or raw.get("type") != "assistant":
        return []
    message = raw.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list):
        return []
    return [
        ToolCall(str(block.get("id", "")), block["name"], block.get("input"))
        for block in content
        if isinstance(block, dict) and block.get("type") == "tool_use" and isinstance(block.get("name"), str)
    ]


def calls_at(path: Path, offsets: Iterable[int]) -> Iterator[tuple[int, ToolCall]]:
    """The tool calls of the lines starting at these byte offsets of `path`, in the given order,
    each with its line's offset. A line that is gone or unreadable has none."""
    try:
        f = path.open("rb")
    except OSError:
        return
    with f:
        for offset in offsets:
            f.seek(offset)
            for call in calls_in_line(f.readline()):
                yield offset, call


def subagent_calls(transcript: Path, spawn_calls: Iterable[str]) -> dict[str, list[ToolCall]]:
    """For each Agent call id in `spawn_calls`, every tool call its subagent made (and the
    subagents it started made), in the order written. Ids with no subagent transcript are left
    out."""
    directory = transcript.with_suffix("") / "subagents"
    by_spawn = _agents_by_spawn_call(directory)
    found: dict[str, list[ToolCall]] = {}
    for spawn in spawn_calls:
        calls: list[ToolCall] = []
        _collect(directory, by_spawn, spawn, calls, 0)
        if spawn in by_spawn:
            found[spawn] = calls
    return found


def _collect(directory: Path, by_spawn: dict[str, str], spawn: str, into: list[ToolCall], depth: int) -> None:
    agent = by_spawn.get(spawn)
    if agent is None or depth >= _MAX_NESTING:
        return
    try:
        lines = (directory / f"agent-{agent}.jsonl").read_bytes().splitlines()
    except OSError:
        return
    for line in lines:
        for call in calls_in_line(line):
            into.append(call)
            if call.name in _AGENT_TOOLS and call.call_id:
                _collect(directory, by_spawn, call.call_id, into, depth + 1)


def _agents_by_spawn_call(directory: Path) -> dict[str, str]:
    """Agent call id -> the agent id whose transcript it started, from the subagents' metadata."""
    found: dict[str, str] = {}
    try:
        names = sorted(entry.name for entry in os.scandir(directory))
    except OSError:
        return found
    for name in names:
        if not (name.startswith("agent-") and name.endswith(".meta.json")):
            continue
        try:
            meta: Any = json.loads((directory / name).read_bytes())
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict) and isinstance(meta.get("toolUseId"), str):
            found[meta["toolUseId"]] = name[len("agent-") : -len(".meta.json")]
    return found
