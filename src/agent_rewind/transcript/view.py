"""A conversation as a view shows it: the chain of entries from a root to one leaf, its rewind
points, and the lookups a rewind makes (resolve a message id, count what it drops, the files the
CLI's history knows held before a point).

Views share their chains (`Chain`) when the chains share a prefix, so a page of points,
`contains`, `resolve` and `messages_from` cost O(1) or O(page) however long the session is.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol, overload

from agent_rewind.errors import InvalidArgument, MessageNotFound, NotARewindPoint
from agent_rewind.transcript.entries import FILE_CHECKPOINT_WINDOW, EntryKind, RewindPoint, parse_timestamp
from agent_rewind.transcript.records import Backup, Entry, Records


class Source(Protocol):
    """What a view reads of the transcript it was made from (`index.TranscriptIndex` is one):
    its file, and which subagent a message belongs to."""

    @property
    def path(self) -> Path: ...

    def subagent_of(self, message_id: str, entry: Entry | None) -> str | None: ...

    def spawn_call(self, agent: str) -> tuple[str | None, str | None]: ...


_UUID_RE = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_MAX_AGENT_NESTING = 16


class Chain:
    """The entries of one chain by depth, and its prompts in order.

    Append-only and shared: a view reads only its first n entries, so a longer chain with the
    same prefix can grow the same lists instead of copying them.
    """

    __slots__ = ("entries", "prompts")

    def __init__(self, entries: list[Entry], prompts: list[Entry]) -> None:
        self.entries = entries
        self.prompts = prompts


class _Points(Sequence[RewindPoint]):
    """A view's rewind points, made on access so a page costs O(page size)."""

    __slots__ = ("_compactions", "_entries", "_n", "_prompts", "_snapshots")

    def __init__(self, prompts: list[Entry], n: int, store: Records, compactions: int) -> None:
        self._prompts = prompts
        self._n = n
        self._snapshots = store.snapshots
        self._entries = store.entries
        self._compactions = compactions  # the leaf's: points under fewer are compacted

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: int) -> RewindPoint: ...
    @overload
    def __getitem__(self, index: slice) -> list[RewindPoint]: ...
    def __getitem__(self, index: int | slice) -> RewindPoint | list[RewindPoint]:
        if isinstance(index, slice):
            return [self._point(self._prompts[i]) for i in range(*index.indices(self._n))]
        if index < 0:
            index += self._n
        if not 0 <= index < self._n:
            raise IndexError(index)
        return self._point(self._prompts[index])

    def __iter__(self) -> Iterator[RewindPoint]:
        for i in range(self._n):
            yield self._point(self._prompts[i])

    def _point(self, entry: Entry) -> RewindPoint:
        compacted = entry.compactions < self._compactions
        # Read the snapshot count now, not when the view was made: the CLI writes a prompt's
        # snapshot lazily (seen at the next prompt or at exit), after its turn's entries.
        count = len(self._snapshots)
        position = self._snapshots.get(entry.uuid)
        if compacted or entry.copy_of:
            # The CLI keeps no checkpoint of a prompt before its last compaction, nor of a copy
            # (it never ran that prompt): their files come from workspace snapshots only.
            has_checkpoint = pending = False
        elif position is None:
            # Not written yet: the live process holds it for the newest prompt.
            has_checkpoint, pending = entry.prompts == self._n, True
        else:
            has_checkpoint, pending = position >= count - FILE_CHECKPOINT_WINDOW, False
        parent = self._entries.get(entry.parent_uuid) if entry.depth else None
        return RewindPoint(
            message_id=entry.id,
            resume_at_message_id=parent.id if parent is not None else "",
            text=entry.text,
            index=entry.prompts - 1,
            create_time=parse_timestamp(entry.timestamp),
            has_checkpoint=has_checkpoint,
            checkpoint_pending=pending,
            compacted=compacted,
            anchor=parent.uuid if parent is not None else "",
        )


class ConversationView:
    """The visible conversation ending at one leaf, at one moment of the transcript.

    `has_checkpoint` is conservative: the CLI keeps the file checkpoints of the 100 most recent
    prompts it has seen, and a process that resumed before a conversation rewind still holds the
    dropped prompts' checkpoints, which take places in that window. Counting every prompt
    snapshot in the file (dropped branches included) is exactly right for such a process, and
    never claims a checkpoint a freshly resumed process (which loads only the chain's) lacks.
    """

    __slots__ = ("_chain", "_index", "_leaf", "_n", "_store", "points")

    def __init__(
        self,
        index: Source,
        store: Records,
        chain: Chain,
        n: int,
        leaf: Entry | None,
        snapshot_count: int,
    ) -> None:
        self._index = index
        self._store = store
        self._chain = chain
        self._n = n
        self._leaf = leaf
        n_prompts = leaf.prompts if leaf is not None else 0
        compactions = leaf.compactions if leaf is not None else 0
        self.points: Sequence[RewindPoint] = _Points(chain.prompts, n_prompts, store, compactions)

    @property
    def leaf(self) -> str | None:
        """The transcript uuid of the entry the view ends at (what the CLI resumes at)."""
        return self._leaf.uuid if self._leaf is not None else None

    @property
    def leaf_entry(self) -> Entry | None:
        return self._leaf

    def prompt_entry(self, index: int) -> Entry:
        """The entry of the visible point at `index` (0-based)."""
        return self._chain.prompts[index]

    def entry(self, uuid: str) -> Entry | None:
        """The transcript's entry of this uuid, on the chain or not."""
        return self._store.entries.get(uuid)

    @property
    def snapshot_ids(self) -> dict[str, int]:
        """Prompt uuid -> the order of its first file-history snapshot (every branch's), as read
        when the view was made or since."""
        return self._store.snapshots

    @property
    def transcript(self) -> Path:
        """The transcript file the view was read from."""
        return self._index.path

    def offsets(self) -> list[int]:
        """Where the visible chain's lines are in the transcript, root first (to copy it)."""
        return [entry.offset for entry in self._chain.entries[: self._n]]

    @property
    def last_message_id(self) -> str:
        """The newest visible user or assistant message, "" if none."""
        if self._leaf is None or not self._leaf.last_message:
            return ""
        return self._store.entries[self._leaf.last_message].id

    def contains(self, message_id: str) -> bool:
        """Whether the entry a client's id names (or a transcript uuid) is on the visible chain."""
        return self.find(message_id) is not None

    def find(self, message_id: str) -> Entry | None:
        """The visible chain's entry with this id: the entry itself or one of its copies (a
        client's id), or the entry of this transcript uuid."""
        entries = self._store.entries
        known = entries.get(message_id)
        key = known.id if known is not None else message_id  # a copy's uuid names its original too
        for uuid in (key, *self._store.copies.get(key, ())):
            entry = entries.get(uuid)
            if entry is not None and self._on_chain(entry):
                return entry
        return None

    def _on_chain(self, entry: Entry) -> bool:
        return entry.depth < self._n and self._chain.entries[entry.depth] is entry

    def resolve(self, message_id: str) -> RewindPoint:
        """The point a client's message id names: a prompt's uuid, or the msg_ id of a reply in its turn."""
        if not message_id:
            raise InvalidArgument("message_id", "must not be empty")
        is_api_id = message_id.startswith("msg_")
        if not is_api_id and not _UUID_RE.fullmatch(message_id):
            raise InvalidArgument(
                "message_id", "must be a prompt's transcript UUID or an assistant message id (msg_...)"
            )
        entries = self._store.entries
        entry = self.find(message_id)
        if entry is None and is_api_id:
            owners = self._store.api_ids.get(message_id, ())
            entry = next((e for o in owners if (e := entries[o]) and self._on_chain(e)), None)
        if entry is None:
            # Not visible: an entry of a dropped branch, or a subagent's (told apart below).
            entry = entries.get(message_id)
            first = self._store.api_ids.get(message_id) if is_api_id else None
            if entry is None and first:
                entry = entries[first[0]]
        if entry is not None and entry.kind is not EntryKind.SUBAGENT:
            if not self._on_chain(entry):
                raise MessageNotFound(message_id)
            if is_api_id and entry.prompts:
                return self.points[entry.prompts - 1]  # the turn this reply belongs to
            if entry.kind is EntryKind.PROMPT:
                return self.points[entry.prompts - 1]
            raise NotARewindPoint(message_id, entry.kind.value)
        agent = self._index.subagent_of(message_id, entry)
        if agent is not None and self._agent_visible(agent):
            raise NotARewindPoint(message_id, EntryKind.SUBAGENT.value)
        raise MessageNotFound(message_id)

    def _agent_visible(self, agent: str) -> bool:
        """Whether the subagent was started from this conversation (not from a dropped turn)."""
        for _ in range(_MAX_AGENT_NESTING):
            owner, parent_agent = self._index.spawn_call(agent)
            if owner is not None:
                return self.contains(owner)
            if parent_agent is None:
                return True  # started from somewhere we cannot see: say what it is
            agent = parent_agent
        return True

    @property
    def backups(self) -> Sequence[Backup]:
        """The CLI's file-history records, every branch's, in the order written."""
        return self._store.backups

    @property
    def tracked_files(self) -> set[str]:
        """Every path the CLI's file history has recorded (on any branch), as it names it:
        relative to the workspace, or absolute."""
        return {backup.path for backup in self._store.backups}

    def files_before(self, point: RewindPoint) -> dict[str, str | None]:
        """What each file the CLI's file history knows held just before `point` was sent, for the
        files it first recorded after that (on any branch): a backup's name, or None when the file
        did not exist. Files its snapshot at the point tracked are the CLI's own to restore."""
        entry = self.find(point.message_id) or self._store.entries.get(point.message_id)
        start = parse_timestamp(entry.timestamp) if entry is not None else None
        if start is None:
            return {}
        tracked = self._store.tracked.get(point.message_id, {})
        later = [
            (when, b) for b in self._store.backups if (when := parse_timestamp(b.time)) and when >= start
        ]
        before: dict[str, str | None] = {}
        for _, backup in sorted(later, key=lambda item: item[0]):
            if backup.path not in tracked and backup.path not in before:
                before[backup.path] = backup.name
        return before

    def checkpoint_files(self, point: RewindPoint) -> dict[str, str | None]:
        """What each file the CLI's file history knows held just before `point` was sent: those
        its snapshot at the point tracks, as that snapshot holds them, and the ones it first
        recorded later (`files_before`). A backup's name, or None when the file did not exist."""
        tracked = self._store.tracked.get(point.message_id, {})
        return {path: backup.name for path, backup in tracked.items()} | self.files_before(point)

    def tool_calls_from(self, point: RewindPoint) -> list[tuple[str, Entry]]:
        """The assistant entries that call tools, from `point` to the end of the conversation,
        each with the id of the prompt whose turn it is in (the turns a rewind to it takes back)."""
        entry = self.find(point.message_id)
        if entry is None:
            raise MessageNotFound(point.message_id)
        prompts = self._chain.prompts
        return [
            (prompts[e.prompts - 1].id, e)
            for e in self._chain.entries[entry.depth : self._n]
            if e.tools and e.kind is EntryKind.ASSISTANT
        ]

    def messages_from(self, point: RewindPoint) -> int:
        """How many visible messages a conversation rewind to `point` drops (the point included)."""
        entry = self.find(point.message_id)
        if entry is None or self._leaf is None:
            raise MessageNotFound(point.message_id)
        return self._leaf.messages - entry.messages + entry.is_message
