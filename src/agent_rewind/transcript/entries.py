"""What a rewind point is: the rules that tell a user's prompt from everything else in a transcript.

Measured on transcripts written by Claude Code CLI 2.1.327 (tests/unit/transcript/data/, recorded by
scripts/record_transcripts.py). The CLI marks what it wrote itself, so these rules key on its
markers, never on message text:

- a prompt it took from its input queue carries `promptSource` ("sdk" for the SDK, "typed",
  "queued", ... in the terminal UI);
- a turn it started itself (a background task's notification) carries an `origin` and
  `promptSource: "system"`;
- messages it made up carry `isMeta` ("[Your previous response had no visible output...]", the
  caveat before a slash command's echo), `isCompactSummary`, or no `promptSource` at all
  ("[Request interrupted by user]", a slash command's echo and its output);
- tool results have `toolUseResult` / `sourceToolAssistantUUID` and `tool_result` blocks;
- subagent messages have `isSidechain` (and live in their own files under `subagents/`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

PREVIEW_CHARS = 200
# The CLI keeps file checkpoints for this many most recent prompts (SDK-FACTS.md; measured again
# by the `window` fixture).
FILE_CHECKPOINT_WINDOW = 100

# User entries with one of these set to true are the CLI's own words, not the user's.
_SYNTHETIC_FLAGS = ("isMeta", "isCompactSummary", "isVisibleInTranscriptOnly")
# The field the service adds to its copies of a compacted conversation (transcript/compaction.py):
# the id of the entry copied. The CLI keeps unknown fields and ignores them.
COPY_OF = "agentRewindCopyOf"


class EntryKind(StrEnum):
    """What a transcript entry is. The value is the `kind` a NotARewindPoint error reports."""

    PROMPT = "prompt"
    TOOL_RESULT = "tool_result"
    SYNTHETIC = "synthetic_message"
    ASSISTANT = "assistant_message"
    SUBAGENT = "subagent_message"
    ATTACHMENT = "attachment"
    SYSTEM = "system_message"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class RewindPoint:
    """A turn's opening user prompt, where the conversation and the files can be rewound to."""

    message_id: str  # the prompt's transcript uuid, also its file-checkpoint id
    resume_at_message_id: str  # the prompt's parentUuid: the last entry before it; "" for the first prompt
    text: str  # the full prompt; the RPC layer cuts it to PREVIEW_CHARS
    index: int  # 0-based turn number on the visible chain
    create_time: datetime | None
    has_checkpoint: bool  # the CLI can still rewind files to it (see transcript.py for the rule)
    # The checkpoint is not in the transcript yet: only the process that ran the prompt holds it
    # (the CLI writes the newest prompt's snapshot lazily, so a crash can lose it).
    checkpoint_pending: bool = False
    # Before a compaction on the visible chain: the CLI no longer holds it, and a conversation
    # rewind to it resumes a copy of the conversation as it was (transcript/compaction.py).
    compacted: bool = False
    # The transcript entry the CLI resumes at for a rewind to this point: the uuid of the entry
    # `resume_at_message_id` names (they differ in a copy). "" for the first prompt.
    anchor: str = ""

    @property
    def preview(self) -> str:
        return self.text[:PREVIEW_CHARS]


def is_compact_boundary(raw: Mapping[str, Any]) -> bool:
    """A compaction's boundary: the CLI reads a transcript from its newest one on, and the entries
    after it start from the summary of what came before (`logicalParentUuid`)."""
    return raw.get("type") == "system" and raw.get("subtype") == "compact_boundary"


def classify(raw: Mapping[str, Any]) -> EntryKind:
    """The kind of one parsed transcript line that has a uuid."""
    if raw.get("isSidechain") is True:
        return EntryKind.SUBAGENT
    entry_type = raw.get("type")
    if entry_type == "assistant":
        return EntryKind.ASSISTANT
    if entry_type == "attachment":
        return EntryKind.ATTACHMENT
    if entry_type == "system":
        return EntryKind.SYSTEM
    if entry_type != "user":
        return EntryKind.OTHER
    if "toolUseResult" in raw or "sourceToolAssistantUUID" in raw or _has_tool_result(_content(raw)):
        return EntryKind.TOOL_RESULT
    if any(raw.get(flag) is True for flag in _SYNTHETIC_FLAGS) or raw.get("origin") is not None:
        return EntryKind.SYNTHETIC
    source = raw.get("promptSource")
    if not isinstance(source, str) or source == "system":
        return EntryKind.SYNTHETIC
    return EntryKind.PROMPT


def prompt_text(raw: Mapping[str, Any]) -> str:
    """A user entry's text: the string content, or its text blocks joined by newlines."""
    content = _content(raw)
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            block["text"]
            for block in content
            if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str)
        )
    return ""


def parse_timestamp(value: str) -> datetime | None:
    """An entry's ISO 8601 timestamp ("2026-11-29T23:12:20.877Z") as an aware UTC datetime."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def _content(raw: Mapping[str, Any]) -> Any:
    message = raw.get("message")
    return message.get("content") if isinstance(message, dict) else None


def _has_tool_result(content: Any) -> bool:
    return isinstance(content, list) and any(
        isinstance(block, dict) and block.get("type") == "tool_result" for block in content
    )
