"""The points index (sessions/points.py) against the transcripts the real CLI wrote
(tests/unit/transcript/data/): made at any moment of a session, then brought up to date by a
server that starts later (reading only the transcript's tail), it shows exactly the points a
whole read of the transcript shows, whatever the tail holds (a turn cut mid-write, a compaction,
a rewound branch, a lazily written checkpoint)."""

from __future__ import annotations

import gzip
import hashlib
import json
import threading
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agent_rewind.sessions import points
from agent_rewind.sessions.conversation import READ_INLINE_BYTES
from agent_rewind.sessions.worker import SessionWorker, WorkerContext
from agent_rewind.store.ledger import NewSession, PointsUpdate, SessionRecord
from agent_rewind.store.sqlite import SqliteLedger
from agent_rewind.testing.fake_agent import FakeFactory, append, prompt_entry, reply_entry
from agent_rewind.transcript import TranscriptIndex
from agent_rewind.transcript.entries import PREVIEW_CHARS, RewindPoint
from agent_rewind.transcript.paths import transcript_path
from agent_rewind.transcript.tail import read_tail

DATA = Path(__file__).parents[1] / "transcript" / "data"
FIXTURES = sorted(p.name for p in DATA.iterdir() if (p / "expected.json").exists())
# Sessions whose every entry goes on from one of the few before it (no resume at an older
# entry, no compaction summarizing up to one).
LINEAR = {"plain", "synthetic", "tools"}
SID = "0b7f3c1e-5a8d-4d6e-9f10-2a3b4c5d6e7f"


async def _execute(ledger: SqliteLedger, statement: str, *args: Any) -> int:
    """A statement run as the ledger runs its writes (these tests set the file up by hand)."""
    return await ledger._db.execute(statement, *args)


def _transcript(name: str) -> bytes:
    expected = json.loads((DATA / name / "expected.json").read_text())
    return gzip.decompress((DATA / name / expected["transcript"]).read_bytes())


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[SqliteLedger]:
    db = await SqliteLedger.open(tmp_path / "ledger.sqlite3")
    await db.add_session(NewSession(SID, str(tmp_path / "ws"), {}, checkpointing=True))
    try:
        yield db
    finally:
        await db.close()


def _worker(tmp_path: Path, ledger: SqliteLedger) -> SessionWorker:
    """A worker as a server start makes one: nothing of the transcript in memory."""
    now = datetime.now(UTC)
    record = SessionRecord(SID, str(tmp_path / "ws"), {}, True, now, now, False, True)
    ctx = WorkerContext(
        ledger=ledger,
        client_factory=FakeFactory(config_dir=tmp_path),
        cli_env={},
        claude_config_dir=tmp_path / "claude",
        idle_timeout=0,
    )
    return SessionWorker(record, ctx)


def _path(tmp_path: Path) -> Path:
    path = transcript_path(tmp_path / "claude", str(tmp_path / "ws"), SID)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _whole(path: Path) -> list[RewindPoint]:
    index = TranscriptIndex(path)
    index.refresh()
    return list(index.view().points)


async def _indexed(ledger: SqliteLedger) -> list[RewindPoint]:
    found = await points.page(ledger, SID, 0, 100_000)
    assert found is not None
    head, page = found
    assert head.count == len(page)
    return page


def _line_ends(data: bytes) -> list[int]:
    return [i + 1 for i, byte in enumerate(data) if byte == ord("\n")]


@pytest.mark.parametrize("name", FIXTURES)
async def test_an_index_made_at_any_line_and_read_on_from_its_tail_shows_what_the_whole_transcript_does(
    name: str, tmp_path: Path, ledger: SqliteLedger
) -> None:
    data = _transcript(name)
    path = _path(tmp_path)
    ends = _line_ends(data)
    # Every line end of short transcripts; of long ones, every few (and mid-line cuts).
    step = max(1, len(ends) // 30)
    cuts = sorted({*ends[::step], ends[-1], *(e - 7 for e in ends[3 :: step * 3] if e > 7)})
    tails = 0
    for cut in cuts:
        await _clear(ledger)
        path.write_bytes(data[:cut])
        # The index as a server that had read up to `cut` left it (a whole read).
        first = _worker(tmp_path, ledger)
        await first.points.current()
        assert await _indexed(ledger) == _whole(path), f"made at {cut}"
        # The CLI wrote the rest; a new server start reads on from the tail.
        path.write_bytes(data)
        second = _worker(tmp_path, ledger)
        await second.points.current()
        assert await _indexed(ledger) == _whole(path), f"{name}: made at {cut} of {len(data)}"
        tails += second.points.rebuilds == 0
    if name in LINEAR:
        assert tails == len(cuts), f"every tail is read on its own ({tails} of {len(cuts)})"
    else:  # a tail that goes on from an entry long before it (a resume there) is read whole
        assert tails > 0


async def _clear(ledger: SqliteLedger) -> None:
    """No index, as before the session's first read (each cut starts from nothing)."""
    await _execute(ledger, "DELETE FROM points WHERE session_id = ?", SID)
    await _execute(ledger, "DELETE FROM point_heads WHERE session_id = ?", SID)


async def _stored_index(ledger: SqliteLedger) -> tuple[list[Any], list[Any]]:
    heads = ledger.dialect._reader.execute(
        "SELECT * FROM point_heads WHERE session_id = ?", (SID,)
    ).fetchall()
    rows = ledger.dialect._reader.execute("SELECT * FROM points WHERE session_id = ?", (SID,)).fetchall()
    return [tuple(r) for r in heads], [tuple(r) for r in rows]


async def _restore(ledger: SqliteLedger, index: tuple[list[Any], list[Any]]) -> None:
    """The index as it was: what a crash of the machine that lost the newer writes leaves."""
    await _clear(ledger)
    heads, rows = index
    for table, values in (("point_heads", heads), ("points", rows)):
        for row in values:
            marks = ", ".join("?" * len(row))
            await _execute(ledger, f"INSERT INTO {table} VALUES ({marks})", *row)


def _durability(ledger: SqliteLedger) -> list[bool]:
    """Each write of the index from now on: whether it was asked to be durable."""
    seen: list[bool] = []
    record = ledger.record_points

    async def recording(update: Any, *, touch: bool = False, durable: bool = True) -> Any:
        seen.append(durable)
        return await record(update, touch=touch, durable=durable)

    ledger.record_points = recording  # type: ignore[method-assign]
    return seen


async def test_the_catch_up_a_read_writes_unsynced_once_lost_is_read_again_from_the_tail_at_the_next_start(
    tmp_path: Path, ledger: SqliteLedger
) -> None:
    """A read that finds the transcript grown writes the index without an fsync (derived data);
    should the machine lose that write, the index it leaves (as an earlier write made it) is
    brought up to date from the transcript's tail by the next start, as the whole transcript
    shows it."""
    data = _transcript("plain")
    path = _path(tmp_path)
    ends = _line_ends(data)
    path.write_bytes(data[: ends[len(ends) // 3]])
    first = _worker(tmp_path, ledger)
    await first.points.current()
    older = await _stored_index(ledger)
    path.write_bytes(data[: ends[2 * len(ends) // 3]])
    synced = _durability(ledger)
    await first.points.current()  # the owner's read, the transcript in memory: unsynced
    assert synced == [False]
    newer = await _stored_index(ledger)
    assert newer != older and await _indexed(ledger) == _whole(path)

    await _restore(ledger, older)  # the unsynced write lost with the machine
    path.write_bytes(data)
    second = _worker(tmp_path, ledger)
    await second.points.current()  # a start: from the head and the tail, unsynced too
    assert synced == [False, False]
    assert await _indexed(ledger) == _whole(path)
    assert second.points.rebuilds == 0, "read from the tail, not the whole transcript"


async def test_a_turns_record_of_the_index_is_durable(tmp_path: Path, ledger: SqliteLedger) -> None:
    data = _transcript("plain")
    path = _path(tmp_path)
    path.write_bytes(data)
    worker = _worker(tmp_path, ledger)
    durable = _durability(ledger)
    await worker.points.record(touch=True)
    assert durable == [True]
    path.write_bytes(data + b"\n")  # grown: the next read writes the index again
    await worker.points.current()
    assert durable == [True, False]


async def test_a_change_of_who_holds_the_newest_checkpoint_is_recorded_though_the_transcript_did_not_grow(
    tmp_path: Path, ledger: SqliteLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The slip of issue 37: `_refresh`'s early return looked at the transcript's size alone, so a
    live process that came to hold (or let go of) the newest prompt's checkpoint was never told to
    the index: the newest point kept a stale `files_rewindable`."""
    holds = [False]
    monkeypatch.setattr(SessionWorker, "holds_newest_checkpoint", property(lambda self: holds[0]))
    path = _path(tmp_path)
    path.write_bytes(_transcript("plain"))
    await _worker(tmp_path, ledger).points.current()  # the index as an earlier server left it
    worker = _worker(tmp_path, ledger)  # a start: reads on from the head, the transcript unread
    for now in (False, True, False):
        holds[0] = now
        await worker.points.current()
        found = await points.page(ledger, SID, 0, 1)
        assert found is not None and found[0].holds_newest is now, now
    assert worker.points.rebuilds == 0, "all from the head and the tail"


# Transcripts written here line by line, each test asserting the exact index it expects (not only
# that a tail read agrees with a whole read: both can share a slip).


def _uid(n: int) -> str:
    # Distinct first characters: the fake reply's API message id is made of them.
    return f"{n:08d}-0000-4000-8000-000000000000"


class _Chat:
    """A conversation appended to the transcript as the CLI writes it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.leaf: str | None = None
        self._made = 0

    def _next(self) -> str:
        self._made += 1
        return _uid(self._made)

    def prompt(self, text: str, *, after: str | None = None) -> str:
        """A prompt going on from `after` (default: the leaf)."""
        uid = self._next()
        append(self.path, prompt_entry(uid, after or self.leaf, text))
        self.leaf = uid
        return uid

    def reply(self, text: str = "done", *, after: str | None = None) -> str:
        uid = self._next()
        parent = after or self.leaf
        assert parent is not None
        append(self.path, reply_entry(uid, parent, text))
        self.leaf = uid
        return uid

    def snapshot(self, prompt: str) -> None:
        """The prompt's file checkpoint (the CLI writes the newest prompt's lazily)."""
        backup = {"messageId": prompt, "trackedFileBackups": {}, "timestamp": "2026-11-29T23:27:44.628Z"}
        append(self.path, {"type": "file-history-snapshot", "messageId": prompt, "snapshot": backup})

    def turn(self, text: str, *, snapshot: bool = True, after: str | None = None) -> str:
        uid = self.prompt(text, after=after)
        if snapshot:
            self.snapshot(uid)
        self.reply(f"answer to {text}")
        return uid


def _writes(ledger: SqliteLedger) -> list[tuple[PointsUpdate, bool, bool]]:
    """Each write of the index from now on: the update, and whether it touched the session and
    was asked to be durable."""
    seen: list[tuple[PointsUpdate, bool, bool]] = []
    record = ledger.record_points

    async def recording(update: PointsUpdate, *, touch: bool = False, durable: bool = True) -> Any:
        seen.append((update, touch, durable))
        return await record(update, touch=touch, durable=durable)

    ledger.record_points = recording  # type: ignore[method-assign]
    return seen


def _changes(
    writes: list[tuple[PointsUpdate, bool, bool]],
) -> list[tuple[int, list[str], list[tuple[str, int]]]]:
    """What each write changed: the rows kept, the prompts added, the kept rows' new checkpoints."""
    return [(u.keep, [r.uuid for r in u.added], list(u.positions)) for u, _, _ in writes]


async def _texts(ledger: SqliteLedger) -> list[str]:
    return [p.text for p in await _indexed(ledger)]


async def _update_time(ledger: SqliteLedger) -> datetime:
    record = await ledger.session(SID)
    assert record is not None
    return record.update_time


async def test_a_session_the_cli_has_not_written_a_transcript_for_has_an_empty_index(
    tmp_path: Path, ledger: SqliteLedger
) -> None:
    """A session's points read before its first turn (no transcript file yet): an index of no
    points, covering nothing, written without touching the session."""
    before = await _update_time(ledger)
    writes = _writes(ledger)
    worker = _worker(tmp_path, ledger)
    head = await worker.points.current_head()
    assert (head.count, head.covered, head.digest, head.leaf) == (0, 0, "", "")
    assert await _indexed(ledger) == []
    assert [(touch, durable) for _, touch, durable in writes] == [(False, False)]
    assert await _update_time(ledger) == before


def test_the_digest_is_of_the_file_and_the_bytes_just_before_what_the_index_covered(tmp_path: Path) -> None:
    """`digest`: the file's inode and the sha256 of the DIGEST_BYTES before `covered` (all of them
    when fewer); "" for a file shorter than `covered`, or none."""
    path = tmp_path / "transcript.jsonl"
    data = bytes(range(256)) * 40  # 10 KiB
    path.write_bytes(data)
    inode = path.stat().st_ino
    covered = 9000
    far = data[covered - points.DIGEST_BYTES : covered]
    assert points.digest(path, covered) == f"{inode}:{hashlib.sha256(far).hexdigest()}"
    assert points.digest(path, 100) == f"{inode}:{hashlib.sha256(data[:100]).hexdigest()}"
    assert points.digest(path, len(data) + 1) == ""
    assert points.digest(tmp_path / "none.jsonl", 0) == ""


async def test_a_transcript_rewritten_where_the_index_ended_is_read_whole_again(
    tmp_path: Path, ledger: SqliteLedger
) -> None:
    """A transcript whose bytes just before what the index covered changed (rewritten in place,
    then grown) is read whole, not on from the index's tail: the index names the entries the
    file holds now. A read's rebuild neither touches the session nor waits for the disk."""
    chat = _Chat(_path(tmp_path))
    for n in range(12):
        chat.turn(f"turn {n:02d}")
    alpha = chat.turn("alpha")
    data = chat.path.read_bytes()
    assert len(data) > 2 * points.DIGEST_BYTES
    await _worker(tmp_path, ledger).points.current()
    assert (await _indexed(ledger))[-1].message_id == alpha
    moved = _uid(999)
    chat.path.write_bytes(data.replace(alpha.encode(), moved.encode()))  # as long: only the digest tells
    chat.turn("beta")
    before = await _update_time(ledger)
    writes = _writes(ledger)
    start = _worker(tmp_path, ledger)
    await start.points.current()
    assert start.points.rebuilds == 1
    found = await _indexed(ledger)
    assert [p.text for p in found] == [*(f"turn {n:02d}" for n in range(12)), "alpha", "beta"]
    assert found[12].message_id == moved
    assert [(touch, durable) for _, touch, durable in writes] == [(False, False)]
    assert await _update_time(ledger) == before


def _calls(ledger: SqliteLedger, name: str) -> list[Any]:
    """The arguments of each call of the ledger's method `name` from now on."""
    seen: list[Any] = []
    method = getattr(ledger, name)

    async def calling(*args: Any) -> Any:
        seen.append(args)
        return await method(*args)

    setattr(ledger, name, calling)
    return seen


async def test_a_start_reads_on_from_the_index_it_finds_and_writes_only_what_the_tail_added(
    tmp_path: Path, ledger: SqliteLedger
) -> None:
    """A start (nothing of the transcript in memory) that finds an index goes on from its head:
    the write keeps every row the index had and adds the tail's prompt, and the transcript is not
    read whole."""
    chat = _Chat(_path(tmp_path))
    for text in ("one", "two", "three"):
        chat.turn(text)
    await _worker(tmp_path, ledger).points.current()
    four = chat.turn("four")
    writes = _writes(ledger)
    start = _worker(tmp_path, ledger)
    await start.points.current()
    assert _changes(writes) == [(3, [four], [])]
    assert await _texts(ledger) == ["one", "two", "three", "four"]
    assert start.points.rebuilds == 0


async def test_the_owner_reads_the_index_head_from_the_ledger_once_then_goes_on_from_what_it_wrote(
    tmp_path: Path, ledger: SqliteLedger
) -> None:
    """Each read of a session's points brings the index up to date; the owner reads the head
    from the ledger at its first, and later compares with the head it last wrote itself."""
    chat = _Chat(_path(tmp_path))
    chat.turn("one")
    worker = _worker(tmp_path, ledger)
    heads = _calls(ledger, "points_head")
    await worker.points.current()
    chat.turn("two")
    await worker.points.current()
    chat.turn("three")
    await worker.points.record(touch=True)
    await worker.points.current()
    assert len(heads) == 1
    assert await _texts(ledger) == ["one", "two", "three"]


async def test_an_owners_read_writes_only_what_the_transcript_gained(
    tmp_path: Path, ledger: SqliteLedger
) -> None:
    """The owner (its transcript in memory) brings the index up to date keeping every row it had:
    a new turn's prompt is added, and a checkpoint the CLI wrote late for a kept prompt is set on
    its row. It compares with the view it made the index from (no lookup of the ledger's rows);
    an owner that did not make the index looks its rows up; and one that finds the index showing
    its view writes nothing."""
    chat = _Chat(_path(tmp_path))
    for text in ("one", "two", "three"):
        chat.turn(text)
    owner = _worker(tmp_path, ledger)
    await owner.view()
    await owner.points.current()
    writes = _writes(ledger)
    lookups = _calls(ledger, "point_uuid")

    four = chat.turn("four", snapshot=False)  # its checkpoint is written lazily
    await owner.points.current()
    assert _changes(writes) == [(3, [four], [])]
    newest = (await _indexed(ledger))[-1]
    assert (newest.has_checkpoint, newest.checkpoint_pending) == (True, True)

    chat.snapshot(four)
    five = chat.turn("five")
    await owner.points.current()
    assert _changes(writes)[1:] == [(4, [five], [(four, 3)])]
    found = await _indexed(ledger)
    assert [p.text for p in found] == ["one", "two", "three", "four", "five"]
    assert [(p.has_checkpoint, p.checkpoint_pending) for p in found] == [(True, False)] * 5
    assert lookups == []

    other = _worker(tmp_path, ledger)  # a new owner, the index made by the one before
    await other.view()
    await other.points.current()
    assert len(writes) == 2, "the index shows its view already"
    six = chat.turn("six")
    await other.points.current()
    assert _changes(writes)[2:] == [(5, [six], [])]
    assert lookups, "the rows it did not make are looked up"
    assert await _texts(ledger) == ["one", "two", "three", "four", "five", "six"]


async def test_an_owner_whose_conversation_went_on_from_an_earlier_turn_rewrites_the_index_from_there(
    tmp_path: Path, ledger: SqliteLedger
) -> None:
    """The CLI went on from an earlier turn's answer (a resume there): the owner's write keeps
    the rows before the first point that differs, found by bisection, and replaces the rest, be
    it an early turn or the newest."""
    chat = _Chat(_path(tmp_path))
    answers = []
    for text in ("one", "two", "three", "four", "five"):
        chat.turn(text)
        answers.append(chat.leaf)
    owner = _worker(tmp_path, ledger)
    await owner.view()
    await owner.points.current()
    writes = _writes(ledger)

    three = chat.turn("three again", after=answers[1])
    answered = chat.leaf
    await owner.points.current()
    assert _changes(writes) == [(2, [three], [])]
    assert await _texts(ledger) == ["one", "two", "three again"]

    chat.turn("four")
    await owner.points.current()
    four = chat.turn("four again", after=answered)  # the newest turn asked again
    await owner.points.current()
    assert _changes(writes)[2:] == [(3, [four], [])]
    assert await _texts(ledger) == ["one", "two", "three again", "four again"]


async def test_a_turns_record_touches_the_session_even_when_the_index_already_shows_its_view(
    tmp_path: Path, ledger: SqliteLedger
) -> None:
    """`record(touch=True)`, a turn's bookkeeping, sets the session's update_time (returned, and
    kept by the worker) whatever the index needed; a record without `touch` leaves it."""
    _Chat(_path(tmp_path)).turn("one")
    worker = _worker(tmp_path, ledger)
    before, kept = await _update_time(ledger), worker.update_time
    assert await worker.points.record() is None
    assert (await _update_time(ledger), worker.update_time) == (before, kept)
    assert await _texts(ledger) == ["one"]
    for _ in range(2):  # the index shows the view already
        stamp = await worker.points.record(touch=True)
        assert stamp is not None and stamp >= before
        assert await _update_time(ledger) == stamp == worker.update_time
        before = stamp


async def test_a_turn_that_goes_on_from_the_farthest_entry_the_head_keeps_is_read_from_the_tail(
    tmp_path: Path, ledger: SqliteLedger
) -> None:
    """The head keeps the leaf and its SEED_ANCESTORS nearest ancestors, whether a whole read or
    a tail read wrote it: a next turn that goes on from the farthest of them (the CLI's
    bookkeeping came after it) is read from the tail, not the whole transcript."""
    chat = _Chat(_path(tmp_path))
    chat.prompt("one")
    first = [chat.reply(f"step {n}") for n in range(points.SEED_ANCESTORS + 1)]
    await _worker(tmp_path, ledger).points.current()  # a whole read
    chat.prompt("two", after=first[0])
    second = [chat.reply(f"step {n}") for n in range(points.SEED_ANCESTORS + 1)]
    start = _worker(tmp_path, ledger)
    await start.points.current()  # a tail read
    assert (await _texts(ledger), start.points.rebuilds) == (["one", "two"], 0)
    chat.prompt("three", after=second[0])
    again = _worker(tmp_path, ledger)
    await again.points.current()
    assert (await _texts(ledger), again.points.rebuilds) == (["one", "two", "three"], 0)


async def test_a_tail_larger_than_an_inline_read_is_read_in_a_thread(
    tmp_path: Path, ledger: SqliteLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start reads a tail of up to READ_INLINE_BYTES on the event loop, a larger one (here a
    single line past it) in a thread, never holding up the loop's other sessions. Either way the
    index keeps a prompt's first PREVIEW_CHARS + 1 characters (enough to know it was cut)."""
    threads: list[int] = []

    def reading(*args: Any) -> Any:
        threads.append(threading.get_ident())
        return read_tail(*args)

    monkeypatch.setattr(points, "read_tail", reading)
    chat = _Chat(_path(tmp_path))
    chat.turn("one")
    await _worker(tmp_path, ledger).points.current()
    for n, size in enumerate((READ_INLINE_BYTES, READ_INLINE_BYTES + 1)):
        uid = _uid(100 + n)
        bare = len(json.dumps(prompt_entry(uid, chat.leaf, ""))) + 1
        text = chr(ord("a") + n) * (size - bare)
        covered = chat.path.stat().st_size
        append(chat.path, prompt_entry(uid, chat.leaf, text))
        chat.leaf = uid
        assert chat.path.stat().st_size - covered == size
        start = _worker(tmp_path, ledger)
        await start.points.current()
        assert start.points.rebuilds == 0
        assert (await _indexed(ledger))[-1].text == text[: PREVIEW_CHARS + 1]
    loop = threading.get_ident()
    assert [thread == loop for thread in threads] == [True, False]


async def _cut(ledger: SqliteLedger, at: str, target: str, size: int) -> None:
    """A conversation rewind's cut at the entry `at` (to the point `target`), as its transaction
    leaves it in the ledger."""
    await _execute(
        ledger,
        "INSERT INTO anchors (session_id, anchor_uuid, target_message_id, transcript_size, drops_turn,"
        " rewind_id) VALUES (?, ?, ?, ?, NULL, 'rewind-1')",
        *(SID, at, target, size),
    )


async def test_a_pending_cut_is_kept_from_the_tail_until_the_conversation_goes_on_after_it(
    tmp_path: Path, ledger: SqliteLedger
) -> None:
    """An index made under a pending cut (a conversation rewind the transcript does not show yet)
    is read on from the tail while the CLI writes only bookkeeping; once a new turn goes on from
    the cut, the view decides (the whole transcript is read): the cut is in the transcript, the
    ledger lets it go, and the index shows the new turn."""
    chat = _Chat(_path(tmp_path))
    chat.turn("one")
    answer = chat.leaf
    assert answer is not None
    two = chat.turn("two")
    chat.turn("three")
    await _cut(ledger, answer, two, chat.path.stat().st_size)
    await _worker(tmp_path, ledger).points.current()
    found = await points.page(ledger, SID, 0, 10)
    assert found is not None and found[0].cut == answer
    assert [p.text for p in found[1]] == ["one"]

    append(chat.path, {"type": "queue-operation", "operation": "enqueue", "sessionId": SID, "content": "x"})
    start = _worker(tmp_path, ledger)
    await start.points.current()
    assert (await _texts(ledger), start.points.rebuilds) == (["one"], 0)
    assert await ledger.anchor(SID) is not None

    chat.turn("two again", after=answer)
    start = _worker(tmp_path, ledger)
    await start.points.current()
    assert (await _texts(ledger), start.points.rebuilds) == (["one", "two again"], 1)
    assert await ledger.anchor(SID) is None
    found = await points.page(ledger, SID, 0, 10)
    assert found is not None and found[0].cut == ""


async def test_an_index_made_under_a_cut_the_ledger_let_go_is_read_whole_again(
    tmp_path: Path, ledger: SqliteLedger
) -> None:
    """The owner found a new turn had written a pending cut into the transcript and let the cut
    go, but never wrote the index (it stopped first): the next start finds the index made under
    a cut the ledger no longer holds and reads the transcript whole."""
    chat = _Chat(_path(tmp_path))
    chat.turn("one")
    answer = chat.leaf
    assert answer is not None
    two = chat.turn("two")
    await _cut(ledger, answer, two, chat.path.stat().st_size)
    await _worker(tmp_path, ledger).points.current()
    assert await _texts(ledger) == ["one"]
    chat.turn("two again", after=answer)
    await _worker(tmp_path, ledger).view()  # the owner lets the cut go, and stops
    assert await ledger.anchor(SID) is None
    start = _worker(tmp_path, ledger)
    await start.points.current()
    assert (await _texts(ledger), start.points.rebuilds) == (["one", "two again"], 1)


async def test_a_checkpoint_written_late_for_the_newest_point_is_read_from_the_tail_after_tails_without_a_prompt(
    tmp_path: Path, ledger: SqliteLedger
) -> None:
    """The CLI writes the newest prompt's checkpoint lazily: a start that reads a tail with no new
    prompt keeps knowing which prompt is the newest, so the next start reads the late checkpoint
    from the tail too and the point shows it written."""
    chat = _Chat(_path(tmp_path))
    chat.turn("one")
    two = chat.prompt("two")
    await _worker(tmp_path, ledger).points.current()
    chat.reply()
    start = _worker(tmp_path, ledger)
    await start.points.current()
    newest = (await _indexed(ledger))[-1]
    assert (newest.message_id, newest.has_checkpoint, newest.checkpoint_pending) == (two, True, True)
    chat.snapshot(two)
    again = _worker(tmp_path, ledger)
    await again.points.current()
    newest = (await _indexed(ledger))[-1]
    assert (newest.message_id, newest.has_checkpoint, newest.checkpoint_pending) == (two, True, False)
    assert start.points.rebuilds == again.points.rebuilds == 0
