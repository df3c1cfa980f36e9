"""Long transcripts made from a real one.

A short session is recorded through the real server (the real Claude Code CLI against the
scripted model), so every line is one the CLI wrote: prompts, tool calls and results,
attachments, file-history snapshots and deltas, API request records, bookkeeping. Its first turn
(with the session's large opening attachments) is kept once; its other turns are the template,
copied as many times as needed. Each copy gets fresh uuids, message ids and tool-use ids, and its
first entry's `parentUuid` points at the previous copy's last entry, so the file holds one
unbroken conversation of N turns, exactly as if the CLI had written N turns.
"""

from __future__ import annotations

import itertools
import json
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_rewind.transcript.entries import EntryKind, classify
from benchmarks.service import serve

# The turns of the recording: the first one opens the session, the others are the template.
# Half chat, half tool calls (Write, Read, Edit), as in an agent's working session.
OPENING = "say hello"
TEMPLATE_PROMPTS = (
    "write notes.txt first line\nsay wrote notes",
    "say noted",
    "read notes.txt\nsay read it",
    "edit notes.txt first => second\nsay edited",
    "say a plain answer",
    "write todo.txt one\\ntwo\\nthree\nsay wrote a list",
)

_ID_RE = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|msg_[A-Za-z0-9_]+|toolu_[A-Za-z0-9_]+"
)


@dataclass(frozen=True)
class Recording:
    session_id: str
    header: list[str]  # the lines of the opening turn (and whatever came before it)
    turns: list[list[str]]  # the lines of each template turn
    exits: list[str]  # uuid of the last main-chain entry of the header and of each turn


async def record(state_dir: Path) -> Recording:
    """Runs the scripted turns through the real server and splits the transcript into turns."""
    async with serve(state_dir) as client:
        session = await client.create()
        for prompt in (OPENING, *TEMPLATE_PROMPTS):
            await client.prompt(session.session_id, prompt)
        path = client.transcript(session.session_id, session.cwd)
    # The server has stopped: the CLI has written everything it will write.
    return split(session.session_id, path.read_text().splitlines())


def split(session_id: str, lines: list[str]) -> Recording:
    raws: list[dict[str, Any]] = [json.loads(line) for line in lines]
    starts = []
    for i, raw in enumerate(raws):
        if classify(raw) is EntryKind.PROMPT:
            # A turn starts with the queue operations the CLI writes before its prompt.
            while i > 0 and raws[i - 1].get("type") == "queue-operation":
                i -= 1
            starts.append(i)
    if len(starts) != 1 + len(TEMPLATE_PROMPTS):
        raise RuntimeError(
            f"expected {1 + len(TEMPLATE_PROMPTS)} prompts in the recording, found {len(starts)}"
        )
    bounds = [*starts[1:], len(lines)]
    segments = [list(range(0, starts[1]))] + [list(range(a, b)) for a, b in itertools.pairwise(bounds)]

    def exit_of(segment: list[int]) -> str:
        main = [
            raws[i]["uuid"] for i in segment if raws[i].get("uuid") and raws[i].get("isSidechain") is not True
        ]
        return str(main[-1])

    exits = [exit_of(s) for s in segments]
    # Each turn must hang off the one before it, and only there: then copies chain correctly.
    for k, segment in enumerate(segments[1:], start=1):
        own = {raws[i]["uuid"] for i in segment if raws[i].get("uuid")}
        for i in segment:
            parent = raws[i].get("parentUuid")
            if raws[i].get("uuid") and parent and parent not in own and parent != exits[k - 1]:
                raise RuntimeError(f"turn {k} refers to an entry outside it: {parent}")
    return Recording(
        session_id=session_id,
        header=[lines[i] for i in segments[0]],
        turns=[[lines[i] for i in s] for s in segments[1:]],
        exits=exits,
    )


class TurnWriter:
    """Writes the header, then copies of the template turns, each chained to the one before."""

    def __init__(self, recording: Recording, session_id: str) -> None:
        self.recording = recording
        self.session_id = session_id
        self.turns = 0
        self._leaf = recording.exits[0]  # the header's entries keep their uuids
        self._next = 0  # which template turn comes next

    def header(self) -> bytes:
        self.turns = 1
        text = "\n".join(self.recording.header) + "\n"
        return text.replace(self.recording.session_id, self.session_id).encode()

    def next_turn(self) -> bytes:
        k = self._next
        self._next = (k + 1) % len(self.recording.turns)
        rec = self.recording
        previous_exit = rec.exits[k]  # exits[0] is the header's: turn k hangs off exits[k]
        mapping = {rec.session_id: self.session_id, previous_exit: self._leaf}

        def fresh(m: re.Match[str]) -> str:
            token = m.group(0)
            new = mapping.get(token)
            if new is None:
                if token.startswith("msg_"):
                    new = f"msg_bench_{uuid.uuid4().hex}"
                elif token.startswith("toolu_"):
                    new = f"toolu_bench{uuid.uuid4().hex[:24]}"
                else:
                    new = str(uuid.uuid4())
                mapping[token] = new
            return new

        text = "\n".join(_ID_RE.sub(fresh, line) for line in rec.turns[k]) + "\n"
        self._leaf = mapping[rec.exits[k + 1]]
        self.turns += 1
        return text.encode()


def write_session(recording: Recording, path: Path, session_id: str, turns: int) -> TurnWriter:
    """Writes a transcript of `turns` turns of session `session_id` at `path`; the writer it
    returns appends more turns of the same conversation."""
    writer = TurnWriter(recording, session_id)
    with path.open("wb") as f:
        f.write(writer.header())
        while writer.turns < turns:
            f.write(writer.next_turn())
    return writer
