"""Resuming a conversation from before a compaction.

A compaction (`/compact`, or one the CLI starts by itself when the context fills) writes a
boundary (a `system` entry of subtype `compact_boundary`, no `parentUuid`, its
`logicalParentUuid` the last entry it summarized) and a summary after it. The index follows the
boundary to that entry, so every prompt before a compaction stays a rewind point (`compacted`).
The CLI, though, reads a transcript only from its newest boundary on: resuming at an entry
before it fails ("No message found with message.uuid"), even with the leaf pinned there, and it
keeps the first entry it met with a given uuid, so writing the old entries again under their own
uuids does not help either (measured with CLI 2.1.332; docs/rewind.md).

What it does resume is a copy: the entries of the conversation from the start of the anchor's
segment (the boundary before it, or the first entry) down to the anchor, appended after the
newest boundary under fresh uuids (and fresh API message ids), each parent pointing to the
previous copy, and each marked with the id of the entry it copies (`COPY_OF`). The model then sees that conversation as it was
(not the summary), and the index shows each copy under the original's id, so rewind points keep
their message ids. The originals stay where they are, on a branch nothing shows.

A copy is made only when needed, and at most once for a given state of the file: an existing copy
of the anchor that the CLI can still read is resumed instead. Writing one is an append of whole
lines while no CLI process of the session runs; a crash midway leaves lines no chain reaches.
"""

from __future__ import annotations

import json
import os
import uuid as uuidlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_rewind.errors import MessageNotFound
from agent_rewind.transcript.entries import COPY_OF

if TYPE_CHECKING:
    from agent_rewind.transcript.index import TranscriptIndex
    from agent_rewind.transcript.records import Entry

# Fields of an entry that name another entry of the same chain (beside `parentUuid`).
_LINKS = ("sourceToolAssistantUUID",)


@dataclass(frozen=True, slots=True)
class Resume:
    """Where the CLI resumes for a given leaf, and what must be appended first."""

    at: str  # the uuid to resume at (the leaf, or its copy)
    lines: bytes  # whole JSON lines to append to the transcript first; b"" when none


def resumable(index: TranscriptIndex, uuid: str) -> bool:
    """Whether the CLI can resume at this entry: its segment starts at or after the newest
    compaction boundary in the file."""
    entry = index.get(uuid)
    return entry is not None and entry.segment >= index.last_boundary


def plan_resume(index: TranscriptIndex, leaf: str) -> Resume:
    """How the CLI resumes the conversation that ends at `leaf` (a transcript uuid)."""
    entry = index.get(leaf)
    if entry is None:
        raise MessageNotFound(leaf)
    if entry.segment >= index.last_boundary:
        return Resume(leaf, b"")
    for copy in index.copies_of(entry.id):
        if copy.segment >= index.last_boundary:
            return Resume(copy.uuid, b"")
    return _copy(index, entry)


def _copy(index: TranscriptIndex, leaf: Entry) -> Resume:
    segment: list[Entry] = []
    cur: Entry | None = leaf
    while cur is not None:
        segment.append(cur)
        if cur.offset == cur.segment:
            break
        cur = index.get(cur.parent_uuid)
    segment.reverse()
    fresh = {entry.uuid: str(uuidlib.uuid4()) for entry in segment}
    # An API message's id too: readers (the SDK's among them) take entries with one message id
    # for parts of one message, wherever they are. The index maps the copy's back.
    messages = {e.api_message_id: f"msg_{uuidlib.uuid4().hex}" for e in segment if e.api_message_id}
    lines: list[bytes] = []
    with index.path.open("rb") as f:
        for i, entry in enumerate(segment):
            f.seek(entry.offset)
            raw: dict[str, Any] = json.loads(f.readline())
            raw["uuid"] = fresh[entry.uuid]
            # The segment's first entry starts a chain of its own (a boundary keeps the entry
            # it summarized up to, so the points before it stay, compacted).
            raw["parentUuid"] = fresh[segment[i - 1].uuid] if i else None
            for link in _LINKS:
                if isinstance(raw.get(link), str) and raw[link] in fresh:
                    raw[link] = fresh[raw[link]]
            if isinstance(raw.get("compactMetadata"), dict):
                # A boundary names the summary that follows it (where the messages it kept
                # verbatim go back in): the copy's summary now.
                raw["compactMetadata"] = _renamed(raw["compactMetadata"], fresh)
            message = raw.get("message")
            if isinstance(message, dict) and message.get("id") in messages:
                message["id"] = messages[message["id"]]
            raw[COPY_OF] = entry.id
            lines.append(json.dumps(raw, ensure_ascii=False, separators=(",", ":")).encode() + b"\n")
    return Resume(fresh[leaf.uuid], b"".join(lines))


def _renamed(value: Any, fresh: dict[str, str]) -> Any:
    """`value` with every string that is a copied entry's uuid replaced by its copy's."""
    if isinstance(value, str):
        return fresh.get(value, value)
    if isinstance(value, list):
        return [_renamed(item, fresh) for item in value]
    if isinstance(value, dict):
        return {key: _renamed(item, fresh) for key, item in value.items()}
    return value


def append(transcript: Path, lines: bytes) -> None:
    """Appends whole lines to the transcript, on disk when this returns. Call while no CLI process
    of the session runs. A line a killed CLI left half written is ended first."""
    if not lines:
        return
    with transcript.open("ab+") as f:
        f.seek(0, os.SEEK_END)
        partial = f.tell() > 0 and (f.seek(-1, os.SEEK_END), f.read(1))[1] != b"\n"
        f.write((b"\n" if partial else b"") + lines)
        f.flush()
        os.fsync(f.fileno())
