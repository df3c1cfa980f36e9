"""What a transcript gained since the points index covered it: its tail, read on its own.

The points index (sessions/points.py) remembers how far into the transcript it was made
(`covered`) and the leaf entry it ended at. After a crash between the CLI's write and the
ledger's, or a process that wrote its last file checkpoint at exit, only the bytes from `covered`
on are new. Every entry's chain facts are computed from its parent when it is read, so the tail
is read into an index seeded with that leaf alone (`TranscriptIndex.of_tail`): its prompts are the
points that follow the kept ones. Time and memory grow with the tail, not with the session.

The seed is the leaf and its nearest ancestors: the CLI writes bookkeeping off the chain (the
leaf may be one), and the next turn goes on from an entry just before it. Whatever the tail
alone cannot settle is refused (None), and the caller reads the whole transcript: an entry whose
parent is neither in the tail nor a seed (a resume at an older entry, a compaction summarizing up
to one), or a file-history snapshot of a prompt the tail does not hold and the seed does not
name. A partial last line waits for the next read, as in a whole read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from agent_rewind.transcript.entries import EntryKind
from agent_rewind.transcript.index import TranscriptIndex
from agent_rewind.transcript.reading import IndexStats, parse_line
from agent_rewind.transcript.records import Entry


@dataclass(frozen=True)
class Tail:
    covered: int  # bytes of complete lines, from the file's start, now read
    keep: int  # points before the tail's that stay (up to the seed it goes on from; none for a new root)
    # The tail's new points in order: each prompt entry with its parent (None for a root).
    prompts: list[tuple[Entry, Entry | None]]
    leaf: Entry | None  # the newest non-subagent entry: the seed when the tail added none
    last_message_id: str
    snapshot_count: int
    positions: dict[str, int] = field(default_factory=dict)  # new snapshots: prompt uuid -> order
    # The new leaf and its nearest ancestors, each with its chain's newest message's client id
    # (what the next tail goes on from).
    seeds: list[tuple[Entry, str]] = field(default_factory=list)
    stats: IndexStats = field(default_factory=IndexStats)


def read_tail(
    path: Path,
    offset: int,
    seeds: list[tuple[Entry, str]],
    snapshot_count: int,
    newest: str,
    newest_position: int | None,
    max_seeds: int,
) -> Tail | None:
    """The tail of `path` from `offset` on, over `seeds`: the leaf the index ended at, then its
    nearest ancestors, each with the client id of its chain's newest message.

    `newest`, `newest_position`: the newest kept point and the order of its snapshot (None: not
    written yet, which the CLI does lazily: its snapshot may be in the tail). None when the tail
    cannot be read on its own (see the module's docstring). `max_seeds`: how many entries the
    returned `seeds` hold at most."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return None
    end = data.rfind(b"\n") + 1
    known = {newest: newest_position} if newest and newest_position is not None else {}
    index = TranscriptIndex.of_tail(path, [e for e, _ in seeds], snapshot_count, known)
    seeded = {e.uuid: (e, last) for e, last in seeds}
    leaf_seed = seeds[0][0] if seeds else None
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
    keep = leaf_seed.prompts if leaf_seed is not None else 0
    segment: list[Entry] = []
    if in_tail(leaf):
        cur = leaf
        while in_tail(cur):
            assert cur is not None
            segment.append(cur)
            if cur.depth == 0:
                if cur.parent_uuid:
                    return None  # its parent is older than the tail and not a seed
                cur = None
                break
            cur = index.get(cur.parent_uuid)
        if cur is not None and cur.uuid not in seeded:
            return None
        keep = cur.prompts if cur is not None else 0
    prompts = [
        (e, index.get(e.parent_uuid) if e.depth else None)
        for e in reversed(segment)
        if e.kind is EntryKind.PROMPT
    ]
    last: str | None
    if leaf is None:
        last = ""
    elif not in_tail(leaf):
        last = seeded[leaf.uuid][1]
    else:
        last = _last_message_id(leaf.last_message, index, seeded, in_tail)
        if last is None:
            return None
    new_seeds: list[tuple[Entry, str]] = []
    cur = leaf
    while cur is not None and len(new_seeds) < max_seeds:
        if not in_tail(cur) and cur.uuid in seeded:
            known_last: str | None = seeded[cur.uuid][1]
        else:
            known_last = _last_message_id(cur.last_message, index, seeded, in_tail)
        if known_last is None:
            break
        new_seeds.append((cur, known_last))
        cur = index.get(cur.parent_uuid) if cur.depth else None
    return Tail(
        covered=offset + end,
        keep=keep,
        prompts=prompts,
        leaf=leaf,
        last_message_id=last,
        snapshot_count=index.snapshot_count(),
        positions=positions,
        stats=stats,
        seeds=new_seeds,
    )


def _last_message_id(
    uuid: str,
    index: TranscriptIndex,
    seeded: dict[str, tuple[Entry, str]],
    in_tail: Callable[[Entry | None], bool],
) -> str | None:
    """The client id of the message `uuid` names (a chain's newest), from the tail or a seed."""
    if not uuid:
        return ""
    entry = index.get(uuid)
    if entry is not None and (in_tail(entry) or uuid in seeded):
        return entry.id
    for seed, last in seeded.values():
        if seed.last_message == uuid:
            return last
    return None
