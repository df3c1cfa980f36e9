"""What a turn streams, in domain terms (no SDK or protobuf types)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class PromptEvent:
    """The user prompt that opens a turn (or a subagent's prompt when parent_tool_use_id is set)."""

    message_id: str
    text: str
    parent_tool_use_id: str = ""


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    input: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AssistantEvent:
    message_id: str
    api_message_id: str
    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    model: str = ""
    parent_tool_use_id: str = ""


@dataclass(frozen=True, slots=True)
class ToolResultEvent:
    message_id: str
    tool_use_id: str
    content: str
    is_error: bool
    parent_tool_use_id: str = ""


@dataclass(frozen=True, slots=True)
class ResultEvent:
    subtype: str
    is_error: bool
    num_turns: int
    duration_ms: int
    total_cost_usd: float
    result: str
    stop_reason: str
    interrupted: bool = False


@dataclass(frozen=True, slots=True)
class RewoundEvent:
    """First on a turn whose prompt carried a rewind (PromptRequest.rewind): the rewind applied
    before the prompt ran. `outcome` is the rewind engine's result (sessions/ does not know it)."""

    outcome: Any


TurnEvent = PromptEvent | AssistantEvent | ToolResultEvent | ResultEvent | RewoundEvent


@dataclass(frozen=True, slots=True)
class FilesAnswer:
    """The CLI's full answer to a rewind_files control request."""

    can_rewind: bool
    files_changed: tuple[str, ...] = ()
    insertions: int = 0
    deletions: int = 0
    skipped_links: int = 0
    error: str = ""


@dataclass(frozen=True, slots=True)
class ConversationAnswer:
    """The CLI's answer to an in-place conversation rewind of its live process."""

    rewound: bool
    reason: str = ""  # the CLI's refusal reason (stale_target, turn_running, ...), "" when rewound
    error: str = ""
