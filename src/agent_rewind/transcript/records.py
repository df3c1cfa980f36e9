"""What the index keeps of a transcript: slim entries, the CLI's file-history backups, and the
records of one version of the main file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from agent_rewind.transcript.entries import EntryKind, parse_timestamp


@dataclass(frozen=True, slots=True)
class Entry:
    """One transcript line with a uuid, reduced to what rewinding needs."""

    uuid: str
    parent_uuid: str  # "" for none
    kind: EntryKind
    offset: int  # byte offset of its line in the file
    timestamp: str  # as written (ISO 8601); see `create_time`
    text: str  # prompts only: the full prompt text
    api_message_id: str  # assistant entries only: the API's "msg_..." id
    is_message: bool  # a user or assistant message the SDK shows (not isMeta, not a subagent's)
    # Facts about the chain from the root to this entry, inclusive. A parent is counted only if
    # it came earlier in the file (the CLI always writes it first); otherwise this is a root.
    depth: int  # 0 for a root
    prompts: int  # prompts on the chain; a prompt's turn index is prompts - 1
    messages: int  # `is_message` entries on the chain
    last_message: str  # uuid of the newest `is_message` entry on the chain, "" if none
    agent_id: str = ""  # subagent messages only
    # Compaction (transcript/compaction.py). A compact boundary's parent is the entry it
    # summarized up to (`logicalParentUuid`), so a chain runs on through every compaction.
    compactions: int = 0  # compact boundaries on the chain, this entry included
    segment: int = (
        0  # offset of the first entry of its segment: the newest boundary on its chain, or its root
    )
    # The id of the entry this one is a copy of (the service's copy of a compacted conversation,
    # which the CLI can resume), "" for an entry the CLI wrote. Clients see only that id.
    copy_of: str = ""
    tools: tuple[str, ...] = ()  # assistant entries only: the tools it calls

    @property
    def id(self) -> str:
        """The message id clients see: the original's for a copy."""
        return self.copy_of or self.uuid

    @property
    def create_time(self) -> datetime | None:
        return parse_timestamp(self.timestamp)


@dataclass(frozen=True, slots=True)
class Backup:
    """One of the CLI's file-history records: what a file held at some moment of a turn."""

    path: str  # as the CLI tracks it: relative to the workspace, or absolute
    name: str | None  # the backup's file name under file-history/<session>/; None: it did not exist
    time: str  # when the backup was taken (ISO 8601)
    prompt: str  # the prompt whose snapshot (or turn) recorded it


def backup_of(path: Any, raw: Any, prompt: str) -> Backup | None:
    if not isinstance(path, str) or not isinstance(raw, dict) or not isinstance(raw.get("backupTime"), str):
        return None
    name = raw.get("backupFileName")
    return Backup(path, name if isinstance(name, str) else None, raw["backupTime"], prompt)


@dataclass(slots=True)
class Records:
    """Everything read from one version of the main file. Append-only until the file is replaced."""

    entries: dict[str, Entry] = field(default_factory=dict)
    # "msg_..." -> uuid of its first entry, and of the first entry of each copy of it
    api_ids: dict[str, list[str]] = field(default_factory=dict)
    copies: dict[str, list[str]] = field(default_factory=dict)  # an entry's id -> uuids of its copies
    last_boundary: int = -1  # offset of the newest compact boundary in the file: the CLI reads from there
    snapshots: dict[str, int] = field(default_factory=dict)  # prompt uuid -> order of its first snapshot
    # Snapshots before the first one `snapshots` holds: an index of a transcript's tail only
    # (`TranscriptIndex.of_tail`) numbers its snapshots on from those the points index counted.
    snapshot_base: int = 0
    agent_calls: dict[str, str] = field(default_factory=dict)  # Agent tool_use id -> assistant uuid
    # The CLI's file history, every branch's, in the order written.
    backups: list[Backup] = field(default_factory=list)
    tracked: dict[str, dict[str, Backup]] = field(default_factory=dict)  # prompt uuid -> its snapshot
    leaf: str | None = None
