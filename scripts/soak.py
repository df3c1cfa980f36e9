"""`make soak`: random prompts, rewinds, interrupts and server SIGKILLs, checked against a model.

Several sessions on one real server process (the real CLI, the scripted model). Each operation is
picked at random; some are run on a server armed to SIGKILL itself and its CLI processes at a named
step (agent_rewind.faults), and some SIGKILLs land between operations. After every restart, and
every few operations, the service is checked against a model of what must be there:

- the rewind points are the model's visible prompts, in order (no turn lost, none resurrected);
- the agent sees exactly those prompts (the scripted model's `recall`);
- every file holds what the model says (a files rewind is all or nothing);
- the ledger holds no half-finished rewind, an event for every applied one, and gap-free cursors;
- after every restart, the points the ledger's index serves (the first read, before anything
  else reads the transcript) are those a whole read of the transcript makes (with the pending
  cut the ledger holds), field by field.

Usage: python scripts/soak.py [--ops 300] [--sessions 3] [--seed N] [--kill-rate 0.06]
Exits 1 on the first invariant violation, printing the seed and the operations that led there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sqlite3
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent_rewind.api.v1 import rewind_pb2, session_service_pb2  # noqa: E402
from agent_rewind.rpc import convert  # noqa: E402
from agent_rewind.sessions.conversation import cut_is_in_transcript  # noqa: E402
from agent_rewind.store.ledger import Anchor  # noqa: E402
from agent_rewind.testing import RECALL_PREFIX  # noqa: E402
from agent_rewind.testing.server_process import ServerProcess  # noqa: E402
from agent_rewind.transcript import TranscriptIndex  # noqa: E402
from tests.integration.harness import Client, client_of  # noqa: E402

FILES, CONVERSATION, BOTH = (
    rewind_pb2.REWIND_MODE_FILES,
    rewind_pb2.REWIND_MODE_CONVERSATION,
    rewind_pb2.REWIND_MODE_BOTH,
)
# Steps whose outcome is known: a rewind is applied from its recorded intent on; a turn killed once
# its prompt is recorded keeps the prompt (no tool ran: the CLI died before the model's answer was
# read); a turn killed at its result or after it is complete.
REWIND_STEPS = {
    "rewind.planned": False,
    "rewind.intent_recorded": True,
    "rewind.files_restored": True,
    "rewind.files_recorded": True,
    "rewind.completed": True,
}
TURN_STEPS = ("turn.accepted", "turn.prompt_recorded", "turn.result", "turn.recorded")


class Violation(AssertionError):
    pass


@dataclass
class Point:
    prompt_id: str
    text: str
    files_before: dict[str, str | None]  # every file, as it was just before this prompt
    writes: tuple[str, ...]  # files this turn wrote
    sent: int  # the turn's place in the session's history, dropped turns included


# A file whose content the CLI's checkpoints do not determine (see Model.rewind); checked again once
# a turn writes it.
UNKNOWN = "\x00unknown"


@dataclass
class Model:
    """What one session must show."""

    session_id: str
    cwd: Path
    points: list[Point] = field(default_factory=list)  # the visible conversation
    # Every change to the files, in order: the turn that wrote them (None for a files rewind's
    # restore), and the paths.
    changes: list[tuple[Point | None, set[str]]] = field(default_factory=list)
    files: dict[str, str | None] = field(default_factory=dict)
    turns: int = 0

    def prompt(self, prompt_id: str, text: str, writes: dict[str, str]) -> None:
        point = Point(prompt_id, text, dict(self.files), tuple(writes), len(self.changes))
        self.points.append(point)
        self.changes.append((point, set(writes)))
        self.files.update(writes)

    def rewind(self, index: int, mode: int) -> None:
        """What API.md promises of a files rewind from the CLI's checkpoints: the files the
        visible turns from the point on changed go back to what they held when it was sent. A
        file something else changed since (a dropped turn, an earlier files rewind) the CLI's
        history may or may not cover: the model stops asserting its content until it is written."""
        point = self.points[index]
        if mode in (FILES, BOTH):
            visible = {id(p) for p in self.points[index:]}
            by_visible: set[str] = set()
            by_others: set[str] = set()
            for turn, paths in self.changes[point.sent :]:
                (by_visible if turn is not None and id(turn) in visible else by_others).update(paths)
            for path in by_visible | by_others:
                before = point.files_before.get(path)
                self.files[path] = before if path not in by_others and before != UNKNOWN else UNKNOWN
            self.changes.append((None, by_visible | by_others))
        if mode in (CONVERSATION, BOTH):
            del self.points[index:]


class Soak:
    def __init__(self, work: Path, sessions: int, seed: int, kill_rate: float) -> None:
        self.server = ServerProcess(work / "state", args=["--interrupt-timeout", "5"])
        self.rng = random.Random(seed)
        self.seed = seed
        self.kill_rate = kill_rate
        self.sessions = sessions
        self.models: list[Model] = []
        self.log: list[str] = []
        self.kills = 0
        self.ops = 0
        self.checks = 0
        self.index_checks = 0

    @property
    def c(self) -> Client:
        return client_of(self.server)

    def name(self, model: Model) -> str:
        return f"s{self.models.index(model)}"

    def note(self, text: str) -> None:
        self.log.append(f"{self.ops:4d} {text}")

    async def start(self, fault: str = "") -> None:
        await self.server.start(fault=fault, fault_scope="group" if fault else "")
        for model in self.models:  # a restart: the index first, before any read of the transcript
            await self.check_index(model)

    async def crash(self, why: str) -> None:
        self.server.kill(with_cli=True)
        await self.server.wait()
        self.kills += 1
        self.note(f"SIGKILL ({why})")
        await self.start()
        await self.check_all()

    async def run(self, ops: int) -> None:
        await self.start()
        for _ in range(self.sessions):
            session = await self.c.create()
            self.models.append(Model(session.session_id, Path(session.cwd)))
        while self.ops < ops:
            self.ops += 1
            model = self.rng.choice(self.models)
            roll = self.rng.random()
            if roll < self.kill_rate:
                await self.crash("between operations")
            elif roll < self.kill_rate * 2.5:
                await self.armed(model)
            elif roll < 0.55:
                await self.turn(model)
            elif roll < 0.85 and len(model.points) > 1:
                await self.rewind(model)
            elif roll < 0.92:
                await self.interrupted(model)
            else:
                await self.close(model)
            if self.ops % 20 == 0:
                await self.check_all()
        await self.check_all()

    # Operations

    def _writes(self, model: Model) -> dict[str, str]:
        model.turns += 1
        shared = self.rng.choice(["a.txt", "b.txt"])
        return {shared: f"t{model.turns}", f"t{model.turns}.txt": "new"}

    @staticmethod
    def _script(writes: dict[str, str]) -> str:
        # Claude Code writes over an existing file only once the conversation has read it (a
        # conversation rewind forgets what the dropped turns read), so each write reads first;
        # reading a file that does not exist yet is an error the agent shrugs off.
        return "\n".join(f"read {path}\nwrite {path} {value}" for path, value in writes.items())

    async def turn(self, model: Model) -> None:
        writes = self._writes(model)
        text = self._script(writes)
        events = await self.c.prompt(model.session_id, text)
        failed = _failed_writes(events)
        if failed:
            raise Violation(f"{self.name(model)}: writes the agent made failed: {failed}")
        model.prompt(_prompt_id(events), text, writes)
        self.note(f"turn {self.name(model)} {writes}")

    async def _target(self, model: Model) -> tuple[int, int]:
        mode = self.rng.choice([FILES, CONVERSATION, BOTH])
        low = 0 if mode == FILES else 1  # the first prompt has no conversation to resume at
        candidates = list(range(low, len(model.points)))
        if mode != CONVERSATION:
            # Points the service says files can be rewound to (the CLI's checkpoint window, and a
            # newest prompt whose checkpoint a crash lost): a rewind to any of them must work.
            points = await _all_points(self.c, model.session_id)
            candidates = [i for i in candidates if points[i].files_rewindable]
            if not candidates:
                mode, candidates = CONVERSATION, list(range(1, len(model.points)))
        return self.rng.choice(candidates), mode

    async def rewind(self, model: Model) -> None:
        index, mode = await self._target(model)
        result = await self.c.rewind(model.session_id, model.points[index].prompt_id, mode)
        if not result.rewind_id:
            raise Violation(f"no rewind id: {result}")
        model.rewind(index, mode)
        self.note(f"rewind {self.name(model)} to #{index} mode {mode}")
        await self.check(model, recall=False)

    async def interrupted(self, model: Model) -> None:
        text = f"sleep 20\nsay interrupted {uuid.uuid4().hex[:6]}"
        call = self.c.sessions.Prompt(
            session_service_pb2.PromptRequest(session_id=model.session_id, text=text)
        )
        stream = call.__aiter__()
        first = await asyncio.wait_for(stream.__anext__(), 30)
        await self.c.sessions.Interrupt(session_service_pb2.InterruptRequest(session_id=model.session_id))
        rest = [e async for e in stream]
        if not rest or not rest[-1].result.interrupted:
            raise Violation(f"an interrupted turn did not end as interrupted: {rest[-1:]}")
        model.prompt(first.message_id, text, {})
        self.note(f"interrupted {self.name(model)}")

    async def close(self, model: Model) -> None:
        await self.c.sessions.CloseSession(
            session_service_pb2.CloseSessionRequest(session_id=model.session_id)
        )
        self.note(f"close {self.name(model)}")

    async def armed(self, model: Model) -> None:
        """The next operation on a server armed to die at one of its steps."""
        if len(model.points) > 1 and self.rng.random() < 0.5:
            step = self.rng.choice(sorted(REWIND_STEPS))
            index, mode = await self._target(model)
            if step.startswith("rewind.files") and mode == CONVERSATION:
                step = "rewind.completed"  # a conversation rewind has no files steps
            if step == "rewind.files_recorded" and mode == FILES:
                step = "rewind.files_restored"  # a files-only rewind records no "files applied" mark
            self.server.kill(with_cli=True)
            await self.server.wait()
            await self.start(fault=step)
            try:
                await self.c.rewind(model.session_id, model.points[index].prompt_id, mode)
                raise Violation(f"the server survived its fault at {step}")
            except grpc.aio.AioRpcError:
                pass
            if REWIND_STEPS[step]:
                model.rewind(index, mode)
            await self.died(f"{step}, {self.name(model)} rewind #{index} mode {mode}")
            await self.check_all()
            return
        step = self.rng.choice(TURN_STEPS)
        writes = self._writes(model)
        # The model answers after a pause, so a kill once the prompt is recorded lands before any
        # tool runs.
        text = "sleep 1\n" + self._script(writes)
        self.server.kill(with_cli=True)
        await self.server.wait()
        await self.start(fault=step)
        try:
            await self.c.prompt(model.session_id, text)
            raise Violation(f"the server survived its fault at {step}")
        except grpc.aio.AioRpcError:
            pass
        await self.died(f"{step}, {self.name(model)} turn {writes}")
        if step != "turn.accepted":
            # The prompt was recorded; its tools ran only if the turn got to its result.
            points = await _all_points(self.c, model.session_id)
            prompt_id = points[-1].message_id if points and points[-1].text == text else ""
            if not prompt_id:
                raise Violation(f"{step}: the recorded prompt is not a point")
            model.prompt(prompt_id, text, writes if step in ("turn.result", "turn.recorded") else {})
        await self.check_all()

    async def died(self, why: str) -> None:
        if await self.server.wait() != -9:
            raise Violation(f"the server did not die at {why}")
        self.kills += 1
        self.note(f"SIGKILL at {why}")
        await self.start()

    # Invariants

    async def check_all(self) -> None:
        for model in self.models:
            await self.check(model)
        self.check_ledger()

    async def check(self, model: Model, recall: bool = True) -> None:
        self.checks += 1
        points = await _all_points(self.c, model.session_id)
        got = [(p.message_id, p.text) for p in points]
        want = [(p.prompt_id, p.text) for p in model.points]
        if got != want:
            raise Violation(f"{self.name(model)}: points {got} != model {want}")
        for path, content in model.files.items():
            if content == UNKNOWN:
                continue
            on_disk = _read(model.cwd / path)
            expected = None if content is None else content + "\n"
            if on_disk != expected:
                raise Violation(f"{self.name(model)}: {path} holds {on_disk!r}, the model says {expected!r}")
        if recall and self.rng.random() < 0.3:  # the agent's own view (a turn of its own, part of the model)
            events = await self.c.prompt(model.session_id, "recall")
            seen = _recall(events)
            if seen != [p.text for p in model.points] + ["recall"]:
                raise Violation(f"{self.name(model)}: the agent sees {seen}, the model {model.points}")
            model.prompt(_prompt_id(events), "recall", {})

    async def check_index(self, model: Model) -> None:
        """The points the ledger's index serves are those a whole read of the transcript makes."""
        self.index_checks += 1
        served = await _all_points(self.c, model.session_id)
        files = list((self.server.state_dir / "claude" / "projects").glob(f"*/{model.session_id}.jsonl"))
        index = TranscriptIndex(files[0]) if files else None
        rebuilt: list[rewind_pb2.RewindPoint] = []
        if index is not None:
            index.refresh()
            anchor = self._anchor(model.session_id)
            cut = anchor is not None and not cut_is_in_transcript(index, anchor)
            view = index.view(anchor.anchor_uuid if cut and anchor is not None else None)
            rebuilt = [convert.rewind_point(p, True) for p in view.points]
        for point, other in zip(served, rebuilt, strict=False):
            if point.snapshot_available:  # then the snapshots decide, not the transcript
                for each in (point, other):
                    each.ClearField("files_rewindable")
                    each.ClearField("snapshot_available")
        if [p.SerializeToString() for p in served] != [p.SerializeToString() for p in rebuilt]:
            raise Violation(
                f"{self.name(model)}: the index serves {[(p.message_id, p.text) for p in served]}, "
                f"the transcript has {[(p.message_id, p.text) for p in rebuilt]}"
            )

    def _anchor(self, session_id: str) -> Anchor | None:
        db = sqlite3.connect(self.server.state_dir / "ledger.sqlite3")
        try:
            row = db.execute(
                "SELECT anchor_uuid, target_message_id, transcript_size, drops_turn, rewind_id FROM anchors"
                " WHERE session_id = ?",
                (session_id,),
            ).fetchone()
        finally:
            db.close()
        return Anchor(session_id, row[0], row[1], row[2], row[3], row[4]) if row else None

    def check_ledger(self) -> None:
        db = sqlite3.connect(self.server.state_dir / "ledger.sqlite3")
        try:
            pending = db.execute("SELECT COUNT(*) FROM rewinds WHERE state = 'pending'").fetchone()[0]
            applied = [
                c for (c,) in db.execute("SELECT cursor FROM rewinds WHERE state = 'applied' ORDER BY cursor")
            ]
            events = [c for (c,) in db.execute("SELECT cursor FROM events ORDER BY cursor")]
        finally:
            db.close()
        if pending:
            raise Violation(f"{pending} rewind intent(s) left pending while the server serves")
        if applied != events or events != list(range(1, len(events) + 1)):
            raise Violation(f"events {events} do not match applied rewinds {applied} gap-free")


async def _all_points(c: Client, session_id: str) -> list[rewind_pb2.RewindPoint]:
    return await c.all_points(session_id)


def _prompt_id(events: list[object]) -> str:
    ids = [e.message_id for e in events if e.HasField("user_prompt") and not e.parent_tool_use_id]  # type: ignore[attr-defined]
    if len(ids) != 1:
        raise Violation(f"a turn streamed {len(ids)} prompt events: {events}")
    return str(ids[0])


def _failed_writes(events: list[object]) -> list[str]:
    calls = {
        use.id: use.input["file_path"]
        for e in events
        for use in e.assistant_message.tool_uses  # type: ignore[attr-defined]
        if use.name == "Write"
    }
    return [
        f"{calls[e.tool_result.tool_use_id]}: {e.tool_result.content[:100]}"  # type: ignore[attr-defined]
        for e in events
        if e.HasField("tool_result") and e.tool_result.tool_use_id in calls and e.tool_result.is_error  # type: ignore[attr-defined]
    ]


def _recall(events: list[object]) -> list[str]:
    for event in events:
        text = event.assistant_message.text  # type: ignore[attr-defined]
        if text.startswith(RECALL_PREFIX):
            prompts: list[str] = json.loads(text[len(RECALL_PREFIX) :])
            return prompts
    raise Violation(f"no recall answer in {events}")


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=300)
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--kill-rate", type=float, default=0.03, help="chance per operation of each kind of kill"
    )
    parser.add_argument("--keep", action="store_true", help="keep the state dir")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    work = Path(tempfile.mkdtemp(prefix="agent-rewind-soak-"))
    soak = Soak(work, args.sessions, seed, args.kill_rate)
    started = time.monotonic()
    print(
        f"soak: seed {seed}, {args.ops} operations on {args.sessions} sessions, state in {work}", flush=True
    )
    code = 0
    try:
        await soak.run(args.ops)
    except (Violation, grpc.aio.AioRpcError) as err:
        code = 1
        print("\n".join(soak.log), file=sys.stderr)
        print(f"soak: INVARIANT VIOLATED after {soak.ops} operations (seed {seed}): {err}", file=sys.stderr)
    finally:
        await soak.server.close()
    print(
        f"soak: {soak.ops} operations, {soak.kills} server SIGKILLs, {soak.checks} session checks, "
        f"{soak.index_checks} index-versus-transcript checks after restarts, "
        f"{0 if code == 0 else 1} invariant violations, seed {seed}, {time.monotonic() - started:.0f} s"
    )
    if not args.keep and code == 0:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
