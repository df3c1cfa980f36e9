"""Following one turn: print each TurnEvent the moment it arrives and remember what matters."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TextIO

from agent_rewind.api.v1 import session_pb2

from ._formatting import format_turn_event, to_json


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
    events: Iterable[session_pb2.TurnEvent], out: TextIO, *, json_lines: bool = False
) -> TurnOutcome:
    """Print every event as it arrives (one JSON object per line with `json_lines`), flushing each."""
    outcome = TurnOutcome()
    for event in events:
        if json_lines:
            out.write(to_json(event, compact=True) + "\n")
        else:
            for line in format_turn_event(event):
                out.write(line + "\n")
        out.flush()
        kind = event.WhichOneof("event")
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
