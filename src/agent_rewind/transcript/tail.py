"""What a transcript gained since the points index covered it: its tail, read on its own.

The points index (sessions/points.py) remembers how far into the transcript it was made
(`covered`) and the leaf entry it ended at. After a crash between the CLI's write and the
ledger's, or a process that wrote its last file checkpoint at exit, only the bytes from `covered`
on are new. Every entry's chain facts are computed from its parent when it is read, so the tail
is read into an index seeded with that leaf alone (`TranscriptIndex.of_tail`): its prompts are the
points that follow the kept ones. Time and memory grow with the tail, not with the session.

Whatever the tail alone cannot settle is refused (None), and the caller rebuilds from the whole
transcript: an entry whose parent is neither in the tail nor the seed (a resume at an older
entry), a snapshot of a prompt the tail does not hold and the seed does not name, a line that is
no complete JSON entry is simply not an entry, as in a full read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from agent_rewind.transcript.entries import EntryKind
from agent_rewind.transcript.index import TranscriptIndex
from agent_rewind.transcript.reading import IndexStats, parse_line
from agent_rewind.transcript.records import Entry


@dataclass(frozen=True)
class Tail:
    covered: int  # bytes of complete lines, from the file's start, now read
    keep: int  # points before the tail's that stay (the seed's, or none for a new root)
    # The tail's new points in order: each prompt entry with its parent (None for a root).
    prompts: list[tuple[Entry, Entry | None]]
    leaf: Entry | None  # the newest non-subagent entry: the seed when the tail added none
    last_message_id: str
    snapshot_count: int
    positions: dict[str, int] = field(default_factory=dict)  # new snapshots: prompt uuid -> order
    stats: IndexStats = field(default_factory=IndexStats)


def read_tail(
    path: Path,
    offset: int,
    seed: Entry | None,
    seed_last_message_id: str,
    snapshot_count: int,
    newest: str,
    newest_position: int | None,
) -> Tail | None:
    """The tail of `path` from `offset` on, over `seed` (the leaf the index ended at).

    `newest`, `newest_position`: the newest kept point and the order of its snapshot (None: not
    written yet, which the CLI does lazily: its snapshot may be in the tail). None when the tail
    cannot be read on its own (see the module's docstring)."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return None
    end = data.rfind(b"\n") + 1
    known = {newest: newest_position} if newest and newest_position is not None else {}
    index = TranscriptIndex.of_tail(path, seed, snapshot_count, known)
    stats = index.stats
    pos = 0
    while pos < end:
        nl = data.index(b"\n", pos)
        if nl > pos:
            raw = parse_line(data[pos:nl], stats)
            if raw is not None:
                index.add(raw, offset + pos)
        pos = nl + 1

    def in_tail(entry: Entry | None) -> bool:
        return entry is not None and entry.offset >= offset

    positions: dict[str, int] = {}
    for message_id, position in index.snapshot_ids.items():
        if message_id in known:
            continue
        if message_id != newest and not in_tail(index.get(message_id)):
            return None  # a snapshot of a prompt neither the tail nor the seed knows
        positions[message_id] = position

    leaf_uuid = index.leaf
    leaf = index.get(leaf_uuid) if leaf_uuid else None
    keep = seed.prompts if seed is not None else 0
    segment: list[Entry] = []
    if in_tail(leaf):
        cur = leaf
        while in_tail(cur):
            assert cur is not None
            segment.append(cur)
            if cur.depth == 0:
                if cur.parent_uuid:
                    return None  # its parent is older than the tail and not the seed
                cur = None
                keep = 0
                break
            cur = index.get(cur.parent_uuid)
        if cur is not None and (seed is None or cur.uuid != seed.uuid):
            return None
    prompts = [
        (e, index.get(e.parent_uuid) if e.depth else None)
        for e in reversed(segment)
        if e.kind is EntryKind.PROMPT
    ]
    if leaf is None:
        last = ""
    elif not in_tail(leaf):
        last = seed_last_message_id
    elif not leaf.last_message:
        last = ""
    elif (
        seed is not None
        and leaf.last_message in (seed.last_message, seed.uuid)
        and not in_tail(index.get(leaf.last_message))
    ):
        last = seed_last_message_id
    else:
        message = index.get(leaf.last_message)
        if message is None:
            return None
        last = message.id
    return Tail(
        covered=offset + end,
        keep=keep,
        prompts=prompts,
        leaf=leaf,
        last_message_id=last,
        snapshot_count=index.snapshot_count(),
        positions=positions,
        stats=stats,
    )
