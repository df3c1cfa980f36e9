"""What a rewind (or an undo) did, or would do: the result both halves report, kept in the ledger
as JSON and turned into events. Shared by the engine and the undo, which build on it."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any

from agent_rewind.errors import AgentRewindError
from agent_rewind.rewind.side_effects import SideEffect


class Mode(enum.Enum):
    FILES = "files"
    CONVERSATION = "conversation"
    BOTH = "both"

    @property
    def files(self) -> bool:
        return self in (Mode.FILES, Mode.BOTH)

    @property
    def conversation(self) -> bool:
        return self in (Mode.CONVERSATION, Mode.BOTH)


@dataclass(frozen=True)
class Refusal:
    """Why one half would be refused: the reason and message of the error Rewind fails with."""

    reason: str
    message: str
    metadata: dict[str, str] = field(default_factory=dict)


def refuse(err: AgentRewindError) -> Refusal:
    return Refusal(err.reason, err.message, dict(err.metadata))


class RefusedHalf(AgentRewindError):
    """Raised by Rewind for a refused half; carries the refusal's own reason."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message, metadata=refusal.metadata)
        self.reason = refusal.reason


@dataclass(frozen=True)
class FilesHalf:
    requested: bool = False
    can_rewind: bool = False
    files_changed: tuple[str, ...] = ()
    insertions: int = 0
    deletions: int = 0
    skipped_links: int = 0
    refusal: Refusal | None = None
    # "checkpoint" (the CLI's) or "snapshot" (the service's workspace snapshots).
    source: str = "checkpoint"
    conflicts: tuple[tuple[str, str], ...] = ()  # (path, resolution)
    diffs: tuple[dict[str, Any], ...] = ()
    diffs_truncated: bool = False


@dataclass(frozen=True)
class ConversationHalf:
    requested: bool = False
    can_rewind: bool = False
    rewound: bool = False
    messages_dropped: int = 0
    refusal: Refusal | None = None


@dataclass(frozen=True)
class RewindOutcome:
    rewind_id: str
    files: FilesHalf
    conversation: ConversationHalf
    last_message_id: str
    # What the turns it takes back did that no rewind undoes (rewind/side_effects.py).
    side_effects: tuple[SideEffect, ...] = ()

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        if not self.side_effects:
            del data["side_effects"]  # as earlier versions wrote it, so they read it back the same
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RewindOutcome:
        def refusal(raw: dict[str, Any]) -> Refusal | None:
            return Refusal(**raw["refusal"]) if raw.get("refusal") else None

        files = data["files"]
        conversation = data["conversation"]
        return cls(
            rewind_id=data["rewind_id"],
            files=FilesHalf(
                **{
                    **files,
                    "files_changed": tuple(files["files_changed"]),
                    "refusal": refusal(files),
                    "conflicts": tuple(tuple(c) for c in files.get("conflicts", ())),
                    "diffs": tuple(files.get("diffs", ())),
                }
            ),
            conversation=ConversationHalf(**{**conversation, "refusal": refusal(conversation)}),
            last_message_id=data["last_message_id"],
            # Absent from what earlier versions wrote: none were listed then.
            side_effects=tuple(SideEffect(**e) for e in data.get("side_effects", ())),
        )


def event_data(target: str, mode: str, outcome: RewindOutcome, owner: str) -> dict[str, Any]:
    """What a REWOUND event tells watchers: ids, the mode, the files summary, counts. No text.
    `owner`: the session's principal, who (with admins) may see the event."""
    files = outcome.files
    return {
        "owner": owner,
        "message_id": target,
        "mode": mode,
        "files": {
            "requested": files.requested,
            "can_rewind": files.can_rewind,
            "files_changed": list(files.files_changed),
            "insertions": files.insertions,
            "deletions": files.deletions,
            "skipped_links": files.skipped_links,
            "source": files.source if files.requested else "",
        },
        "messages_dropped": outcome.conversation.messages_dropped,
        "conversation_changed": outcome.conversation.rewound,
        "last_message_id": outcome.last_message_id,
    }
