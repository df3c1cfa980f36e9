"""Following one turn: each TurnEvent as the lines it prints as, printed the moment it arrives,
and what matters of the turn remembered."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TextIO

from google.protobuf import json_format, struct_pb2

from agent_rewind.api.v1 import session_pb2

from ._formatting import format_size, json_whole, one_line, to_json

_INDENT_SUBAGENT = "    "
# Tool input keys shown first, in this order: what the call acts on.
_LEADING_KEYS = {
    k: i for i, k in enumerate(["file_path", "notebook_path", "path", "command", "pattern", "url"])
}


# --- one event -----------------------------------------------------------------------------------


def summarize_input(struct: struct_pb2.Struct, *, value_limit: int = 60, limit: int = 160) -> str:
    """A tool's input as `{key: value, ...}`, each value cut to `value_limit`, the whole to `limit`.

    A Struct keeps no key order, so the keys that say what a call is about come first, the rest sorted.
    """
    values = json_whole(json_format.MessageToDict(struct))
    parts = []
    for key in sorted(values, key=lambda k: (_LEADING_KEYS.get(k, len(_LEADING_KEYS)), k)):
        value = values[key]
        shown = json.dumps(value, ensure_ascii=False)
        if len(shown) > value_limit:
            shown = shown[: value_limit - 1] + "…"
        parts.append(f"{key}: {shown}")
    text = "{" + ", ".join(parts) + "}"
    return text if len(text) <= limit else text[: limit - 2] + "…}"


def _first_line(text: str, limit: int = 120) -> str:
    lines = text.strip().splitlines()
    if not lines:
        return "(empty)"
    first = lines[0].strip()
    more = len(lines) > 1
    if len(first) > limit:
        first, more = first[: limit - 1], True
    return first + " …" if more else first


def format_duration(ms: int) -> str:
    if ms < 1000:
        return f"{ms}ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes}m{rest:02d}s"


# A Bash result (the command's output) is shown under its line, cut at what a screen holds unless
# the whole is asked for (`prompt --full`); other tools' results are one line, their first.
TOOL_OUTPUT_LINES = 40
TOOL_OUTPUT_BYTES = 4096
_OUTPUT_TOOLS = frozenset({"Bash"})


def _cut_output(lines: list[str]) -> tuple[list[str], str | None]:
    """The lines within TOOL_OUTPUT_LINES and TOOL_OUTPUT_BYTES (a longer first line cut), and a
    line saying what was left out, if anything."""
    kept: list[str] = []
    size = 0
    partial = False
    for line in lines:
        width = len(line.encode()) + 1
        if len(kept) == TOOL_OUTPUT_LINES or size + width > TOOL_OUTPUT_BYTES:
            break
        kept.append(line)
        size += width
    if not kept:  # one line longer than the whole budget: its start
        kept = [lines[0].encode()[:TOOL_OUTPUT_BYTES].decode(errors="ignore")]
        size, partial = len(kept[0].encode()), True
    total = sum(len(line.encode()) + 1 for line in lines) - 1
    if size >= total:
        return kept, None
    rest = len(lines) - len(kept)
    more = [f"{rest} more line{'' if rest == 1 else 's'}"] if rest else []
    what = " and ".join(["the rest of the line"] * partial + more)
    return kept, f"… {what} ({format_size(total - size)}) not shown: --full shows every tool result whole"


def _tool_result_lines(result: session_pb2.ToolResult, tool_name: str, full: bool) -> list[str]:
    head = "↳ tool result" + (" (error)" if result.is_error else "")
    if not (full or tool_name in _OUTPUT_TOOLS):
        return [f"{head} {_first_line(result.content)}"]
    # Only the blank lines around it go: a line's own indentation may be the output's layout.
    lines = result.content.strip("\n").split("\n")
    if not result.content.strip():
        return [f"{head} (empty)"]
    if len(lines) == 1 and len(lines[0]) <= 120:
        return [f"{head} {lines[0]}"]
    left_out = None
    if not full:
        lines, left_out = _cut_output(lines)
    return [head, *(f"  {line}".rstrip() for line in lines), *([f"  {left_out}"] if left_out else [])]


def format_turn_event(event: session_pb2.TurnEvent, *, tool_name: str = "", full: bool = False) -> list[str]:
    """The lines one TurnEvent prints as. A subagent's messages are indented under its tool call.

    `tool_name`, for a tool result: the tool that was called (a ToolResult does not say; its call,
    earlier in the turn, does). A Bash result is shown whole up to TOOL_OUTPUT_LINES and
    TOOL_OUTPUT_BYTES, any other result as its first line; `full` shows every result whole."""
    indent = _INDENT_SUBAGENT if event.parent_tool_use_id else ""
    kind = event.WhichOneof("event")
    lines: list[str] = []
    if kind == "user_prompt":
        lines.append(f"› prompt {event.message_id or '-'}  {one_line(event.user_prompt.text)}")  # noqa: RUF001
    elif kind == "assistant_message":
        msg = event.assistant_message
        text_lines = msg.text.strip().splitlines()
        if text_lines:
            lines.append(f"● {text_lines[0]}")
            lines.extend(f"  {line}" for line in text_lines[1:])
        lines.extend(f"⚙ {use.name} {summarize_input(use.input)}" for use in msg.tool_uses)
    elif kind == "tool_result":
        lines.extend(_tool_result_lines(event.tool_result, tool_name, full))
    elif kind == "result":
        lines.extend(format_turn_result(event.result))
    elif kind == "rewind":
        rewound = event.rewind
        files = len(rewound.files.files_changed)
        lines.append(
            f"↶ rewound {rewound.rewind_id} · {files} file{'' if files == 1 else 's'} changed"
            f" · {rewound.conversation.messages_dropped} messages dropped"
        )
    return [indent + line for line in lines]


def format_turn_result(result: session_pb2.TurnResult) -> list[str]:
    mark = "✗" if result.is_error or result.interrupted else "✓"
    parts = [
        f"{mark} result {result.subtype or '-'}",
        f"{result.num_turns} model call{'' if result.num_turns == 1 else 's'}",
        format_duration(result.duration_ms),
    ]
    if result.total_cost_usd > 0:  # 0: the offline model, which nobody pays for
        parts.append(f"${result.total_cost_usd:.4f}")
    if result.interrupted:
        parts.append("interrupted")
    lines = [" · ".join(parts)]
    if result.is_error and result.result:
        lines.append(f"  {_first_line(result.result)}")
    return lines


# --- the turn -----------------------------------------------------------------------------------


@dataclass
class TurnOutcome:
    """What a followed turn produced."""

    # The message_id of the turn's own prompt: the rewind point for this turn.
    prompt_message_id: str = ""
    # The text of each top-level assistant message, in order.
    assistant_texts: list[str] = field(default_factory=list)
    result: session_pb2.TurnResult | None = None

    @property
    def ok(self) -> bool:
        return self.result is not None and not self.result.is_error and not self.result.interrupted


def follow_turn(
    events: Iterable[session_pb2.TurnEvent], out: TextIO, *, json_lines: bool = False, full: bool = False
) -> TurnOutcome:
    """Print every event as it arrives (one JSON object per line with `json_lines`), flushing each.

    A Bash result is shown whole up to a cap, other tools' results as one line; `full`: every
    result whole."""
    outcome = TurnOutcome()
    # tool_use_id -> the tool's name: a result names only its call, and the call comes first.
    tool_names: dict[str, str] = {}
    for event in events:
        kind = event.WhichOneof("event")
        if kind == "assistant_message":
            tool_names.update((use.id, use.name) for use in event.assistant_message.tool_uses)
        if json_lines:
            out.write(to_json(event, compact=True) + "\n")
        else:
            name = tool_names.get(event.tool_result.tool_use_id, "") if kind == "tool_result" else ""
            for line in format_turn_event(event, tool_name=name, full=full):
                out.write(line + "\n")
        out.flush()
        top_level = not event.parent_tool_use_id
        if kind == "user_prompt" and top_level and not outcome.prompt_message_id:
            outcome.prompt_message_id = event.message_id
        elif kind == "assistant_message" and top_level and event.assistant_message.text:
            outcome.assistant_texts.append(event.assistant_message.text)
        elif kind == "result":
            result = session_pb2.TurnResult()
            result.CopyFrom(event.result)
            outcome.result = result
    return outcome
