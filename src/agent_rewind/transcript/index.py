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
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, overload

from agent_rewind.errors import InvalidArgument, MessageNotFound, NotARewindPoint
from agent_rewind.transcript.entries import (
    FILE_CHECKPOINT_WINDOW,
    EntryKind,
    RewindPoint,
    classify,
    parse_timestamp,
    prompt_text,
)

_CHUNK = 1 << 20
# Bookkeeping lines we never need, recognised by how the CLI starts them (`{"type":"...`), so
# their often large bodies (a 30 KB request shape) are not parsed. A line that starts any other
# way is parsed, so a change in key order costs time, never correctness.
_SKIPPED_TYPES = frozenset(
    {
        b"api-request",
        b"api-request-blob",
        b"api-request-shape",
        b"queue-operation",
        b"atis-latch",
        b"tools-used",
        b"cost-state",
        b"last-prompt",
        b"mode",
    }
)
_TYPE_PREFIX = b'{"type":"'
_UUID_RE = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_AGENT_TOOLS = frozenset({"Agent", "Task"})
# Tools whose edits the CLI's file checkpoints track, and the input key naming the file.
_EDIT_TOOLS = {
    "Write": "file_path",
    "Edit": "file_path",
    "MultiEdit": "file_path",
    "NotebookEdit": "notebook_path",
}
_VIEW_CACHE = 8
_MAX_AGENT_NESTING = 16


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

    @property
    def create_time(self) -> datetime | None:
        return parse_timestamp(self.timestamp)


@dataclass(slots=True)
class IndexStats:
    """Counters that let tests check the index does no more work than the new bytes need."""

    bytes_read: int = 0
    lines_parsed: int = 0  # json.loads calls (skipped bookkeeping lines are not parsed)
    entries_walked: int = 0  # entries visited while building chains for views
    entries_copied: int = 0  # entries copied from a shared chain (a view on another branch)
    resets: int = 0  # re-reads from scratch (file replaced, shrunk or removed)


class _LineReader:
    """Reads the complete lines appended to a file since the last call.

    A partial last line (the CLI is mid-write) is kept and completed on the next call. A file
    that was replaced (new inode, different first bytes), shrank or vanished is read again from
    the start, after a call to `on_reset`.
    """

    _HEAD = 64

    def __init__(self, path: Path, stats: IndexStats) -> None:
        self.path = path
        self.position = 0  # bytes read so far, a partial last line included
        self._partial = b""
        self._identity: tuple[int, int] | None = None
        self._head = b""
        self._stats = stats

    def read(self, on_reset: Callable[[], None]) -> Iterator[tuple[int, bytes]]:
        """Yield (offset, line) for each new complete line, one chunk in memory at a time."""
        try:
            f = self.path.open("rb")
        except OSError as err:
            # Not written yet (or a name the file system cannot hold): an empty transcript.
            if err.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ENAMETOOLONG):
                raise
            if self.position:
                self._restart(None, on_reset)
            return
        with f:
            st = os.fstat(f.fileno())
            identity = (st.st_dev, st.st_ino)
            if self.position and (
                identity != self._identity
                or st.st_size < self.position
                or os.pread(f.fileno(), len(self._head), 0) != self._head
            ):
                self._restart(identity, on_reset)
            self._identity = identity
            f.seek(self.position)
            while chunk := f.read(_CHUNK):
                if len(self._head) < self._HEAD:  # then it holds every byte read so far
                    self._head = (self._head + chunk)[: self._HEAD]
                self._stats.bytes_read += len(chunk)
                data = self._partial + chunk
                start = self.position - len(self._partial)
                self.position += len(chunk)
                end = data.rfind(b"\n") + 1
                self._partial = data[end:]
                pos = 0
                while pos < end:
                    nl = data.index(b"\n", pos)
                    if nl > pos:
                        yield start + pos, data[pos:nl]
                    pos = nl + 1

    @property
    def size(self) -> int:
        """Bytes of complete lines read: every entry at an offset from here on is still to come."""
        return self.position - len(self._partial)

    def _restart(self, identity: tuple[int, int] | None, on_reset: Callable[[], None]) -> None:
        self._stats.resets += 1
        self.position = 0
        self._partial = b""
        self._head = b""
        self._identity = identity
        on_reset()


def _parse(line: bytes, stats: IndexStats) -> dict[str, Any] | None:
    if line.startswith(_TYPE_PREFIX):
        end = line.find(b'"', len(_TYPE_PREFIX))
        if line[len(_TYPE_PREFIX) : end] in _SKIPPED_TYPES:
            return None
    stats.lines_parsed += 1
    try:
        raw = json.loads(line)
    except (ValueError, RecursionError):  # a corrupt (or absurdly nested) line: the CLI skips those too
        return None
    return raw if isinstance(raw, dict) else None


def _assistant_parts(raw: Mapping[str, Any]) -> tuple[str, list[str]]:
    """An assistant entry's API message id and the ids of the subagent calls it makes."""
    message = raw.get("message")
    if not isinstance(message, dict):
        return "", []
    api_id = message.get("id")
    content = message.get("content")
    calls = (
        [
            str(block["id"])
            for block in content
            if isinstance(block, dict)
            and block.get("type") == "tool_use"
            and block.get("name") in _AGENT_TOOLS
            and isinstance(block.get("id"), str)
        ]
        if isinstance(content, list)
        else []
    )
    return (api_id if isinstance(api_id, str) else ""), calls


@dataclass(frozen=True, slots=True)
class Backup:
    """One of the CLI's file-history records: what a file held at some moment of a turn."""

    path: str  # as the CLI tracks it: relative to the workspace, or absolute
    name: str | None  # the backup's file name under file-history/<session>/; None: it did not exist
    time: str  # when the backup was taken (ISO 8601)
    prompt: str  # the prompt whose snapshot (or turn) recorded it


def _backup(path: Any, raw: Any, prompt: str) -> Backup | None:
    if not isinstance(path, str) or not isinstance(raw, dict) or not isinstance(raw.get("backupTime"), str):
        return None
    name = raw.get("backupFileName")
    return Backup(path, name if isinstance(name, str) else None, raw["backupTime"], prompt)


@dataclass(slots=True)
class _Store:
    """Everything read from one version of the main file. Append-only until the file is replaced."""

    entries: dict[str, Entry] = field(default_factory=dict)
    api_ids: dict[str, str] = field(default_factory=dict)  # "msg_..." -> uuid of its first entry
    snapshots: dict[str, int] = field(default_factory=dict)  # prompt uuid -> order of its first snapshot
    agent_calls: dict[str, str] = field(default_factory=dict)  # Agent tool_use id -> assistant uuid
    # The CLI's file history, every branch's, in the order written.
    backups: list[Backup] = field(default_factory=list)
    tracked: dict[str, dict[str, Backup]] = field(default_factory=dict)  # prompt uuid -> its snapshot
    leaf: str | None = None


class _Subagents:
    """The subagent transcripts in `<session_id>/subagents/`, read lazily and incrementally.

    Only needed to tell a subagent's message id (NOT_A_REWIND_POINT) from an unknown one
    (MESSAGE_NOT_FOUND), so they are read only when a lookup misses the main file.
    """

    def __init__(self, directory: Path, stats: IndexStats) -> None:
        self.directory = directory
        self._stats = stats
        self._readers: dict[str, _LineReader] = {}
        self.agents: dict[str, str] = {}  # message uuid or msg id -> agent id
        self.spawned_by: dict[str, str] = {}  # agent id -> the tool_use id that started it
        self.nested_calls: dict[str, str] = {}  # tool_use id of a call made by a subagent -> its agent id

    def agent_of(self, message_id: str) -> str | None:
        if message_id not in self.agents:
            self._refresh()
        return self.agents.get(message_id)

    def _refresh(self) -> None:
        try:
            names = sorted(p.name for p in os.scandir(self.directory))
        except OSError:
            return
        for name in names:
            if not (name.startswith("agent-") and name.endswith(".jsonl")):
                continue
            agent = name[len("agent-") : -len(".jsonl")]
            reader = self._readers.setdefault(name, _LineReader(self.directory / name, self._stats))
            for _, line in reader.read(on_reset=lambda: None):  # ids only ever get added
                raw = _parse(line, self._stats)
                if raw is None:
                    continue
                agent_id = raw.get("agentId")
                entry_agent = agent_id if isinstance(agent_id, str) else agent
                if isinstance(raw.get("uuid"), str):
                    self.agents[raw["uuid"]] = entry_agent
                if raw.get("type") == "assistant":
                    api_id, calls = _assistant_parts(raw)
                    if api_id:
                        self.agents[api_id] = entry_agent
                    for call in calls:
                        self.nested_calls[call] = entry_agent
            if agent not in self.spawned_by:
                self._read_meta(agent)

    def spawn_call_of(self, agent: str) -> str | None:
        if agent not in self.spawned_by:
            self._read_meta(agent)
        return self.spawned_by.get(agent)

    def _read_meta(self, agent: str) -> None:
        try:
            meta = json.loads((self.directory / f"agent-{agent}.meta.json").read_bytes())
        except (OSError, ValueError):
            return
        if isinstance(meta, dict) and isinstance(meta.get("toolUseId"), str):
            self.spawned_by[agent] = meta["toolUseId"]


class _Chain:
    """The entries of one chain by depth, and its prompts in order.

    Append-only and shared: a view reads only its first n entries, so a longer chain with the
    same prefix can grow the same lists instead of copying them.
    """

    __slots__ = ("entries", "prompts")

    def __init__(self, entries: list[Entry], prompts: list[Entry]) -> None:
        self.entries = entries
        self.prompts = prompts


class TranscriptIndex:
    """The entries of one session's transcript file, kept up to date by `refresh()`."""

    def __init__(self, path: Path) -> None:
        self._path = Path(path)
        self.stats = IndexStats()
        self._reader = _LineReader(self._path, self.stats)
        self._store = _Store()
        self._subagents = _Subagents(self._path.with_suffix("") / "subagents", self.stats)
        self._views: OrderedDict[tuple[str | None, int], ConversationView] = OrderedDict()
        self._base: tuple[_Chain, int] | None = None  # the chain of the newest view built

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

    def refresh(self) -> None:
        """Read what the CLI appended since the last call."""
        for offset, line in self._reader.read(on_reset=self._forget):
            raw = _parse(line, self.stats)
            if raw is not None:
                self._add(raw, offset)

    def _forget(self) -> None:
        # Views already handed out keep the store they were made from, and stay consistent.
        self._store = _Store()
        self._views.clear()
        self._base = None

    def _add(self, raw: dict[str, Any], offset: int) -> None:
        store = self._store
        if raw.get("type") == "file-history-snapshot":
            # One snapshot per prompt (an update repeats the messageId): the CLI's file checkpoints.
            message_id = raw.get("messageId")
            if isinstance(message_id, str):
                if message_id not in store.snapshots:
                    store.snapshots[message_id] = len(store.snapshots)
                snapshot = raw.get("snapshot")
                files = snapshot.get("trackedFileBackups") if isinstance(snapshot, dict) else None
                if isinstance(files, dict):
                    tracked = store.tracked.setdefault(message_id, {})
                    for path, value in files.items():
                        if (backup := _backup(path, value, message_id)) is not None:
                            tracked[path] = backup
                            store.backups.append(backup)
            return
        if raw.get("type") == "file-history-delta":
            # A file first tracked during a turn: its content before the turn changed it.
            prompt = raw.get("snapshotMessageId")
            if isinstance(prompt, str) and (
                backup := _backup(raw.get("trackingPath"), raw.get("backup"), prompt)
            ):
                store.backups.append(backup)
            return
        uuid = raw.get("uuid")
        if not isinstance(uuid, str) or not uuid or uuid in store.entries:
            return
        kind = classify(raw)
        parent_uuid = raw.get("parentUuid") if isinstance(raw.get("parentUuid"), str) else ""
        parent = store.entries.get(parent_uuid) if parent_uuid else None
        is_message = (
            raw.get("type") in ("user", "assistant")
            and raw.get("isMeta") is not True
            and kind is not EntryKind.SUBAGENT
        )
        api_id = ""
        if raw.get("type") == "assistant":
            api_id, calls = _assistant_parts(raw)
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
        )
        store.entries[uuid] = entry
        if api_id:
            store.api_ids.setdefault(api_id, uuid)
        if kind is not EntryKind.SUBAGENT:
            store.leaf = uuid

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
            chain, n = _Chain([], []), 0
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

    def _chain_to(self, leaf: Entry) -> tuple[_Chain, int]:
        """The chain ending at `leaf`, reusing the last one built as far as they agree."""
        entries = self._store.entries
        base, base_n = self._base if self._base is not None else (_Chain([], []), 0)
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
            chain = _Chain(base.entries[:shared], base.prompts[:shared_prompts])
            self.stats.entries_copied += shared
        for entry in reversed(segment):
            chain.entries.append(entry)
            if entry.kind is EntryKind.PROMPT:
                chain.prompts.append(entry)
        return chain, leaf.depth + 1

    def _subagent_of(self, message_id: str, entry: Entry | None) -> str | None:
        if entry is not None:  # a sidechain entry written to the main file
            return entry.agent_id
        return self._subagents.agent_of(message_id)

    def _spawn_call(self, agent: str) -> tuple[str | None, str | None]:
        """(assistant uuid in the main file, or parent agent id) of the call that started `agent`."""
        call = self._subagents.spawn_call_of(agent)
        if call is None:
            return None, None
        return self._store.agent_calls.get(call), self._subagents.nested_calls.get(call)


class _Points(Sequence[RewindPoint]):
    """A view's rewind points, made on access so a page costs O(page size)."""

    __slots__ = ("_n", "_prompts", "_snapshots")

    def __init__(self, prompts: list[Entry], n: int, snapshots: Mapping[str, int]) -> None:
        self._prompts = prompts
        self._n = n
        self._snapshots = snapshots

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
        # Read the snapshot count now, not when the view was made: the CLI writes a prompt's
        # snapshot lazily (seen at the next prompt or at exit), after its turn's entries.
        count = len(self._snapshots)
        position = self._snapshots.get(entry.uuid)
        if position is None:
            # Not written yet: the live process holds it for the newest prompt.
            has_checkpoint = entry.prompts == self._n
        else:
            has_checkpoint = position >= count - FILE_CHECKPOINT_WINDOW
        return RewindPoint(
            message_id=entry.uuid,
            resume_at_message_id=entry.parent_uuid if entry.depth else "",
            text=entry.text,
            index=entry.prompts - 1,
            create_time=parse_timestamp(entry.timestamp),
            has_checkpoint=has_checkpoint,
            checkpoint_pending=position is None,
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
        index: TranscriptIndex,
        store: _Store,
        chain: _Chain,
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
        self.points: Sequence[RewindPoint] = _Points(chain.prompts, n_prompts, store.snapshots)

    @property
    def leaf(self) -> str | None:
        return self._leaf.uuid if self._leaf is not None else None

    def offsets(self) -> list[int]:
        """Where the visible chain's lines are in the transcript, root first (to copy it)."""
        return [entry.offset for entry in self._chain.entries[: self._n]]

    @property
    def last_message_id(self) -> str:
        """The newest visible user or assistant message, "" if none."""
        return self._leaf.last_message if self._leaf is not None else ""

    def contains(self, uuid: str) -> bool:
        entry = self._store.entries.get(uuid)
        return entry is not None and self._on_chain(entry)

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
        entry = self._store.entries.get(message_id)
        if entry is None and is_api_id:
            owner = self._store.api_ids.get(message_id)
            entry = self._store.entries.get(owner) if owner else None
        if entry is not None and entry.kind is not EntryKind.SUBAGENT:
            if not self._on_chain(entry):
                raise MessageNotFound(message_id)
            if is_api_id and entry.prompts:
                return self.points[entry.prompts - 1]  # the turn this reply belongs to
            if entry.kind is EntryKind.PROMPT:
                return self.points[entry.prompts - 1]
            raise NotARewindPoint(message_id, entry.kind.value)
        agent = self._index._subagent_of(message_id, entry)
        if agent is not None and self._agent_visible(agent):
            raise NotARewindPoint(message_id, EntryKind.SUBAGENT.value)
        raise MessageNotFound(message_id)

    def _agent_visible(self, agent: str) -> bool:
        """Whether the subagent was started from this conversation (not from a dropped turn)."""
        for _ in range(_MAX_AGENT_NESTING):
            owner, parent_agent = self._index._spawn_call(agent)
            if owner is not None:
                return self.contains(owner)
            if parent_agent is None:
                return True  # started from somewhere we cannot see: say what it is
            agent = parent_agent
        return True

    def files_before(self, point: RewindPoint) -> dict[str, str | None]:
        """What each file the CLI's file history knows held just before `point` was sent, for the
        files it first recorded after that (on any branch): a backup's name, or None when the file
        did not exist. Files its snapshot at the point tracked are the CLI's own to restore."""
        entry = self._store.entries.get(point.message_id)
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

    def messages_from(self, point: RewindPoint) -> int:
        """How many visible messages a conversation rewind to `point` drops (the point included)."""
        entry = self._store.entries.get(point.message_id)
        if entry is None or self._leaf is None or not self._on_chain(entry):
            raise MessageNotFound(point.message_id)
        return self._leaf.messages - entry.messages + entry.is_message
