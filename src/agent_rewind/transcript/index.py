"""An incremental index of a session's transcript, and the visible conversation it holds.

The CLI appends one JSON object per line to `<session_id>.jsonl`. Entries with a `uuid` form a
tree through `parentUuid`; the visible conversation is the path from the newest entry back to a
root. A conversation rewind (`resume_session_at`) makes the next entry's parent an earlier one,
so the dropped turns stay in the file as an abandoned branch. A compaction starts a new root (its
boundary has no parentUuid), and the CLI refuses to resume at an entry from before it: the
conversation, like the SDK's `get_session_messages`, ends there.

`TranscriptIndex.refresh()` reads only the bytes appended since the last call and keeps slim
`Entry` objects. Everything an entry needs to know about its chain (depth, prompts and messages
before it) is computed when it is read, since a parent always comes before its children. A
`ConversationView` is then a list of the chain's entries by depth, which views share when their
chains share a prefix; a page of points, `contains`, `resolve` and `messages_from` cost O(1) or
O(page) however long the session is.

Not thread-safe: the service serializes everything per session.

This module keeps the index itself (reading entries in, building chains, caching views); reading
lines is `reading`, what is kept per entry is `records`, subagent transcripts are `subagents`, and
a view and its points are `view`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_rewind.errors import MessageNotFound
from agent_rewind.transcript.entries import COPY_OF, EntryKind, classify, is_compact_boundary, prompt_text
from agent_rewind.transcript.reading import IndexStats, LineReader, assistant_parts, parse_line, tool_names
from agent_rewind.transcript.records import Backup, Entry, Records, backup_of
from agent_rewind.transcript.subagents import Subagents
from agent_rewind.transcript.view import Chain, ConversationView

# Defined beside the index, and importable from here as before.
__all__ = ["Backup", "ConversationView", "Entry", "IndexStats", "TranscriptIndex"]

_VIEW_CACHE = 8


class TranscriptIndex:
    """The entries of one session's transcript file, kept up to date by `refresh()`."""

    def __init__(self, path: Path) -> None:
        self._path = Path(path)
        self.stats = IndexStats()
        self._reader = LineReader(self._path, self.stats)
        self._store = Records()
        self._subagents = Subagents(self._path.with_suffix("") / "subagents", self.stats)
        self._views: OrderedDict[tuple[str | None, int], ConversationView] = OrderedDict()
        self._base: tuple[Chain, int] | None = None  # the chain of the newest view built

    @property
    def path(self) -> Path:
        return self._path

    @property
    def size(self) -> int:
        """Bytes of complete lines consumed so far (a partial last line waits for the next refresh).

        Every entry read by a later refresh has an `offset` at or past it.
        """
        return self._reader.size

    @property
    def leaf(self) -> str | None:
        """The uuid of the newest non-subagent entry: where the transcript's conversation ends."""
        return self._store.leaf

    def get(self, uuid: str) -> Entry | None:
        return self._store.entries.get(uuid)

    def copies_of(self, message_id: str) -> list[Entry]:
        """The service's copies of the entry with this id (transcript/compaction.py), oldest first."""
        entries = self._store.entries
        return [entries[u] for u in self._store.copies.get(message_id, ())]

    @property
    def last_boundary(self) -> int:
        """Offset of the newest compaction boundary in the file (-1: none): the CLI reads from it."""
        return self._store.last_boundary

    def refresh(self) -> None:
        """Read what the CLI appended since the last call."""
        for offset, line in self._reader.read(on_reset=self._forget):
            raw = parse_line(line, self.stats)
            if raw is not None:
                self._add(raw, offset)

    def _forget(self) -> None:
        # Views already handed out keep the store they were made from, and stay consistent.
        self._store = Records()
        self._views.clear()
        self._base = None

    def _add(self, raw: dict[str, Any], offset: int) -> None:
        store = self._store
        if raw.get("type") == "file-history-snapshot":
            # One snapshot per prompt (an update repeats the messageId): the CLI's file checkpoints.
            message_id = raw.get("messageId")
            if isinstance(message_id, str):
                if message_id not in store.snapshots:
                    store.snapshots[message_id] = store.snapshot_base + len(store.snapshots)
                snapshot = raw.get("snapshot")
                files = snapshot.get("trackedFileBackups") if isinstance(snapshot, dict) else None
                if isinstance(files, dict):
                    tracked = store.tracked.setdefault(message_id, {})
                    for path, value in files.items():
                        if (backup := backup_of(path, value, message_id)) is not None:
                            tracked[path] = backup
                            store.backups.append(backup)
            return
        if raw.get("type") == "file-history-delta":
            # A file first tracked during a turn: its content before the turn changed it.
            prompt = raw.get("snapshotMessageId")
            if isinstance(prompt, str) and (
                backup := backup_of(raw.get("trackingPath"), raw.get("backup"), prompt)
            ):
                store.backups.append(backup)
            return
        uuid = raw.get("uuid")
        if not isinstance(uuid, str) or not uuid or uuid in store.entries:
            return
        kind = classify(raw)
        boundary = is_compact_boundary(raw)
        parent_key = "logicalParentUuid" if boundary and not raw.get("parentUuid") else "parentUuid"
        parent_uuid = raw.get(parent_key) if isinstance(raw.get(parent_key), str) else ""
        parent = store.entries.get(parent_uuid) if parent_uuid else None
        copy_of = raw.get(COPY_OF)
        copy_of = copy_of if isinstance(copy_of, str) and copy_of != uuid else ""
        is_message = (
            raw.get("type") in ("user", "assistant")
            and raw.get("isMeta") is not True
            and kind is not EntryKind.SUBAGENT
        )
        api_id = ""
        tools: tuple[str, ...] = ()
        if raw.get("type") == "assistant":
            api_id, calls = assistant_parts(raw)
            tools = tool_names(raw)
            if kind is EntryKind.ASSISTANT:
                for call in calls:
                    store.agent_calls.setdefault(call, uuid)
        timestamp = raw.get("timestamp")
        agent_id = raw.get("agentId")
        entry = Entry(
            uuid=uuid,
            parent_uuid=parent_uuid or "",
            kind=kind,
            offset=offset,
            timestamp=timestamp if isinstance(timestamp, str) else "",
            text=prompt_text(raw) if kind is EntryKind.PROMPT else "",
            api_message_id=api_id,
            is_message=is_message,
            depth=parent.depth + 1 if parent else 0,
            prompts=(parent.prompts if parent else 0) + (kind is EntryKind.PROMPT),
            messages=(parent.messages if parent else 0) + is_message,
            last_message=uuid if is_message else (parent.last_message if parent else ""),
            agent_id=agent_id if isinstance(agent_id, str) and kind is EntryKind.SUBAGENT else "",
            compactions=(parent.compactions if parent else 0) + boundary,
            segment=offset if boundary or parent is None else parent.segment,
            copy_of=copy_of,
            tools=tools,
        )
        store.entries[uuid] = entry
        if copy_of:
            store.copies.setdefault(copy_of, []).append(uuid)
        if boundary:
            store.last_boundary = offset
        # An API message spans consecutive entries: its first one stands for it, in each chain
        # it is on (the CLI's, and each copy's).
        if api_id and (parent is None or parent.api_message_id != api_id):
            store.api_ids.setdefault(api_id, []).append(uuid)
            # A copy's reply answers to its original's message id too.
            original = store.entries.get(copy_of) if copy_of else None
            if original is not None and original.api_message_id and original.api_message_id != api_id:
                store.api_ids.setdefault(original.api_message_id, []).append(uuid)
        if kind is not EntryKind.SUBAGENT:
            store.leaf = uuid

    @classmethod
    def of_tail(
        cls, path: Path, seeds: list[Entry], snapshot_base: int, known_snapshots: dict[str, int]
    ) -> TranscriptIndex:
        """An index of a transcript's tail only (`add` its lines): its entries' chains go on from
        `seeds` (entries read before, as the points index recorded them; the first is the leaf),
        and its snapshots are numbered on from `snapshot_base` (`known_snapshots`: prompts
        already numbered). Its views are not the transcript's: read its entries
        (transcript/tail.py)."""
        index = cls(path)
        store = index._store
        for seed in seeds:
            store.entries[seed.uuid] = seed
        if seeds:
            store.leaf = seeds[0].uuid
        store.snapshots.update(known_snapshots)
        store.snapshot_base = snapshot_base - len(known_snapshots)
        return index

    def add(self, raw: dict[str, Any], offset: int) -> None:
        """Reads one parsed line at `offset` in (what `refresh` does with each new line)."""
        self._add(raw, offset)

    @property
    def snapshot_ids(self) -> dict[str, int]:
        """Prompt uuid -> the order of its first file-history snapshot."""
        return self._store.snapshots

    def snapshot_count(self) -> int:
        store = self._store
        return store.snapshot_base + len(store.snapshots)

    def view(self, leaf: str | None = None) -> ConversationView:
        """The visible conversation ending at `leaf` (default: the transcript's own leaf).

        A view at an earlier entry is what the conversation will be after a rewind, before the
        next prompt writes it down. Raises MessageNotFound for an unknown or subagent leaf.
        """
        store = self._store
        leaf = store.leaf if leaf is None else leaf
        key = (leaf, len(store.snapshots))
        cached = self._views.get(key)
        if cached is not None:
            self._views.move_to_end(key)
            return cached
        leaf_entry = store.entries.get(leaf) if leaf is not None else None
        if leaf is not None and (leaf_entry is None or leaf_entry.kind is EntryKind.SUBAGENT):
            raise MessageNotFound(leaf)
        if leaf_entry is None:
            chain, n = Chain([], []), 0
        else:
            chain, n = self._chain_to(leaf_entry)
            if leaf == store.leaf or self._base is None:
                # The next default view most likely extends this one. A view at an earlier
                # entry (a pending rewind's anchor) shares this chain without becoming the base.
                self._base = (chain, n)
        view = ConversationView(self, store, chain, n, leaf_entry, len(store.snapshots))
        self._views[key] = view
        if len(self._views) > _VIEW_CACHE:
            self._views.popitem(last=False)
        return view

    def _chain_to(self, leaf: Entry) -> tuple[Chain, int]:
        """The chain ending at `leaf`, reusing the last one built as far as they agree."""
        entries = self._store.entries
        base, base_n = self._base if self._base is not None else (Chain([], []), 0)
        segment: list[Entry] = []
        cur: Entry | None = leaf
        while cur is not None and not (cur.depth < base_n and base.entries[cur.depth] is cur):
            segment.append(cur)
            self.stats.entries_walked += 1
            cur = entries[cur.parent_uuid] if cur.depth else None
        shared = cur.depth + 1 if cur is not None else 0  # entries the chain shares with the base
        if not segment:
            return base, shared
        if shared == len(base.entries):
            chain = base  # the leaf extends the base's chain: grow it in place
        else:
            shared_prompts = cur.prompts if cur is not None else 0
            chain = Chain(base.entries[:shared], base.prompts[:shared_prompts])
            self.stats.entries_copied += shared
        for entry in reversed(segment):
            chain.entries.append(entry)
            if entry.kind is EntryKind.PROMPT:
                chain.prompts.append(entry)
        return chain, leaf.depth + 1

    def subagent_of(self, message_id: str, entry: Entry | None) -> str | None:
        """The subagent whose message `message_id` is (`entry`: its entry in the main file, if any), or None."""
        if entry is not None:  # a sidechain entry written to the main file
            return entry.agent_id
        return self._subagents.agent_of(message_id)

    def spawn_call(self, agent: str) -> tuple[str | None, str | None]:
        """(assistant uuid in the main file, or parent agent id) of the call that started `agent`."""
        call = self._subagents.spawn_call_of(agent)
        if call is None:
            return None, None
        return self._store.agent_calls.get(call), self._subagents.nested_calls.get(call)


@dataclass(frozen=True)
class Reading:
    """The transcript as one read left it: the visible conversation (cut where a pending rewind
    left it) and the whole index it was read into (other leaves' views, the bytes covered)."""

    view: ConversationView
    index: TranscriptIndex
