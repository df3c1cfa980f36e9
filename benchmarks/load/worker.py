"""One client process of the load: `python -m benchmarks.load.worker` (the coordinator starts it).

It reads its plan (one JSON line) from stdin: the servers' addresses, its loops (each a session of
one principal, with that principal's token) and its watchers. It opens the watchers, creates its
sessions and gives each a few warm-up turns (untimed), says `ready`, and on `go` runs every loop
for the plan's seconds: each a closed loop over the mix (mix.py), each call sent to one of the
servers at random, as a load balancer would. A call refused with LIVE_SESSIONS_EXHAUSTED (the
documented back-pressure) is retried with jittered exponential backoff, every attempt counted.
Every answer is checked against the session's model as it comes (a page of points, the session's
last message, the files after a rewind); once the loops end, every session the loop made is
checked whole (all its points, its last message, its files; a deleted one is gone), and a few are
asked what the agent itself sees (`recall`). It prints `progress` lines while it runs and one
`result` line (JSON) at the end: every call (when it began, how long it took, its status and
reason), what the watchers received, and what the checks found.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import resource
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
from google.protobuf import struct_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from agent_rewind.api.v1 import (
    rewind_pb2,
    rewind_service_pb2,
    rewind_service_pb2_grpc,
    session_pb2,
    session_service_pb2,
    session_service_pb2_grpc,
)
from agent_rewind.testing import RECALL_PREFIX
from benchmarks.load import mix
from benchmarks.load.model import FILES, UNKNOWN, SessionModel

T = TypeVar("T")

BACKPRESSURE = "LIVE_SESSIONS_EXHAUSTED"
# Refusals after which nothing was applied: the model stays as it was.
DEFINITE = {
    BACKPRESSURE,
    "TURN_IN_FLIGHT",
    "QUOTA_EXCEEDED",
    "INVALID_ARGUMENT",
    "PERMISSION_DENIED",
    "REWIND_CONFLICT",
    "EXTERNAL_CHANGES",
    "UNDO_UNAVAILABLE",
    "MESSAGE_NOT_FOUND",
    "NOT_A_REWIND_POINT",
    "NO_CONVERSATION_ANCHOR",
    "FILE_CHECKPOINT_UNAVAILABLE",
    "SNAPSHOT_UNAVAILABLE",
    "FILES_PRUNED",
    "CHECKPOINTING_DISABLED",
    "SESSION_NOT_FOUND",
    "PATH_OUTSIDE_WORKSPACE",
}
BACKOFF_S = (0.05, 2.0)  # first and largest wait before retrying back-pressure (full jitter)
CHANNEL_LOOPS = 64  # loops per gRPC connection
FILE_TOOLS = {"Write": "file_path", "Edit": "file_path"}
SNAPSHOT = rewind_pb2.FILES_SOURCE_SNAPSHOT
REWIND_RPCS = {"ListRewindPoints", "DryRun", "Rewind", "UndoRewind"}


@dataclass
class Plan:
    addresses: list[str]
    loops: list[tuple[int, str, str]]  # (index, principal, token)
    watchers: list[tuple[int, str, str]]  # (index, principal, token)
    seconds: float
    seed: int
    think: float  # mean seconds between a loop's calls (0: none, a closed loop)
    warmup_turns: int
    setup_concurrency: int
    recall: int  # sessions asked `recall` at the end
    timeout: float  # seconds any one call may take


class Refused(Exception):
    def __init__(self, code: str, reason: str, details: str, started: bool = False) -> None:
        super().__init__(f"{code} {reason}: {details}")
        self.code = code
        self.reason = reason
        self.details = details
        self.started = started  # a stream that had sent events before it failed

    @property
    def definite(self) -> bool:
        return self.reason in DEFINITE and not self.started


def _reason(err: grpc.aio.AioRpcError) -> str:
    try:
        status = rpc_status.from_call(err)
    except ValueError:
        return "-"
    for detail in status.details if status is not None else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return str(info.reason)
    return "-"


class Stubs:
    """The worker's connections: a few per server, each loop always on the same one."""

    def __init__(self, addresses: list[str], loops: int) -> None:
        per = max(1, -(-loops // CHANNEL_LOOPS))
        # A subchannel pool of each channel's own: separate connections, not one shared.
        options = [("grpc.use_local_subchannel_pool", 1)]
        self.channels = [
            [grpc.aio.insecure_channel(a, options=options) for _ in range(per)] for a in addresses
        ]
        self.sessions = [[session_service_pb2_grpc.SessionServiceStub(c) for c in cs] for cs in self.channels]
        self.rewinds = [[rewind_service_pb2_grpc.RewindServiceStub(c) for c in cs] for cs in self.channels]

    async def close(self) -> None:
        for channels in self.channels:
            for channel in channels:
                await channel.close()


@dataclass
class Worker:
    plan: Plan
    stubs: Stubs
    recording: bool = False
    deadline: float = float("inf")  # monotonic: loops start no new step after it
    calls: list[list[Any]] = field(default_factory=list)
    # Events the loops' calls made: (principal, kind, rewind_id or session_id, returned at (monotonic)).
    made: list[list[Any]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    waits: list[float] = field(
        default_factory=list
    )  # Prompt: first attempt to success, back-pressure included
    checked: dict[str, int] = field(default_factory=dict)
    errors = 0

    def note(self, text: str) -> None:
        self.violations.append(text)

    def count(self, what: str, n: int = 1) -> None:
        self.checked[what] = self.checked.get(what, 0) + n


class Loop:
    """One session's closed loop (and the sessions that replace it: a fork, a new one after a
    DeleteSession)."""

    def __init__(self, worker: Worker, index: int, principal: str, token: str) -> None:
        self.w = worker
        self.index = index
        self.principal = principal
        self.metadata = (("authorization", f"Bearer {token}"),)
        self.rng = random.Random(f"{worker.plan.seed}-{index}")
        self.channel = index // CHANNEL_LOOPS % len(worker.stubs.channels[0])
        self.models: list[SessionModel] = []
        self.model: SessionModel | None = None
        self.want_undo = False  # an UndoRewind was drawn with nothing to undo: after the next Rewind

    @property
    def m(self) -> SessionModel:
        assert self.model is not None
        return self.model

    def name(self) -> str:
        return f"loop {self.index} session {self.m.session_id}"

    # Calls

    async def call(
        self,
        rpc: str,
        invoke: Callable[[int], Awaitable[T]],
        *,
        detail: str = "",
        record: bool = True,
        retry: bool = True,
    ) -> T:
        """One call to a server picked at random, retried while the service answers
        LIVE_SESSIONS_EXHAUSTED (until the loops' deadline); each attempt recorded."""
        first = time.perf_counter()
        backoff = BACKOFF_S[0]
        session = self.model.session_id if self.model is not None else ""
        while True:
            replica = self.rng.randrange(len(self.w.plan.addresses))
            recorded = record and self.w.recording
            began, start = time.time(), time.perf_counter()
            try:
                result = await invoke(replica)
            except grpc.aio.AioRpcError as err:
                seconds = time.perf_counter() - start
                code, reason = err.code().name, _reason(err)
                if recorded:
                    self.w.calls.append([rpc, detail, began, seconds, code, reason, session, replica])
                    self.w.errors += 1
                # A measured call gives up at the deadline; set-up and checks wait their turn.
                if retry and reason == BACKPRESSURE and (not recorded or time.monotonic() < self.w.deadline):
                    await asyncio.sleep(self.rng.uniform(0, backoff))
                    backoff = min(backoff * 2, BACKOFF_S[1])
                    continue
                raise Refused(code, reason, err.details() or "") from err
            except _StreamFailed as failed:
                seconds = time.perf_counter() - start
                code, reason = failed.err.code().name, _reason(failed.err)
                if recorded:
                    self.w.calls.append([rpc, detail, began, seconds, code, reason, session, replica])
                    self.w.errors += 1
                raise Refused(code, reason, failed.err.details() or "", started=True) from failed.err
            seconds = time.perf_counter() - start
            if recorded:
                self.w.calls.append([rpc, detail, began, seconds, "OK", "", session, replica])
                if rpc == "Prompt":
                    self.w.waits.append(time.perf_counter() - first)
            return result

    def _sessions(self, replica: int) -> session_service_pb2_grpc.SessionServiceStub:
        return self.w.stubs.sessions[replica][self.channel]

    def _rewinds(self, replica: int) -> rewind_service_pb2_grpc.RewindServiceStub:
        return self.w.stubs.rewinds[replica][self.channel]

    async def unary(self, rpc: str, request: Any, *, detail: str = "", record: bool = True) -> Any:
        """A unary call of either service, by its name."""

        def invoke(replica: int) -> Awaitable[Any]:
            stub = self._rewinds(replica) if rpc in REWIND_RPCS else self._sessions(replica)
            return getattr(stub, rpc)(request, metadata=self.metadata, timeout=self.w.plan.timeout)  # type: ignore[no-any-return]

        return await self.call(rpc, invoke, detail=detail, record=record)

    # Operations

    async def create(self, *, record: bool = True) -> None:
        options = struct_pb2.Struct()
        options.update({"allowed_tools": ["Bash"]})
        request = session_service_pb2.CreateSessionRequest(options=options, request_id=str(uuid.uuid4()))
        session: session_pb2.Session = await self.unary("CreateSession", request, record=record)
        self.model = SessionModel(session.session_id, Path(session.cwd), principal=self.principal)
        self.models.append(self.model)

    async def prompt(self, *, record: bool = True, text: str | None = None) -> list[session_pb2.TurnEvent]:
        script = mix.script(self.m, self.rng) if text is None else mix.Script(text, {}, frozenset(), 0)
        request = session_service_pb2.PromptRequest(session_id=self.m.session_id, text=script.text)

        async def invoke(replica: int) -> list[session_pb2.TurnEvent]:
            stream = self._sessions(replica).Prompt(
                request, metadata=self.metadata, timeout=self.w.plan.timeout
            )
            events: list[session_pb2.TurnEvent] = []
            try:
                async for event in stream:
                    events.append(event)
            except grpc.aio.AioRpcError as err:
                if events:
                    raise _StreamFailed(err) from err
                raise
            return events

        try:
            events = await self.call("Prompt", invoke, record=record)
        except Refused as refused:
            if not refused.definite:
                await self.resync_prompt(script)
            return []
        prompt_ids = [e.message_id for e in events if e.HasField("user_prompt") and not e.parent_tool_use_id]
        ids = [e.message_id for e in events if e.message_id]
        if len(prompt_ids) != 1 or not events[-1].HasField("result") or events[-1].result.is_error:
            self.w.note(f"{self.name()}: the turn {script.text!r} did not run as scripted: {events[-1:]}")
            await self.resync_prompt(script)
            return events
        self.m.shell_paths |= script.shell
        self.m.turn(prompt_ids[0], script.text, script.writes, ids[-1])
        failed = _failed_tools(events)
        if failed:
            self.w.note(f"{self.name()}: tool calls of the turn {script.text!r} failed: {failed}")
            self.m.uncertain(set(script.writes))
        return events

    async def points(self) -> None:
        request = rewind_service_pb2.ListRewindPointsRequest(session_id=self.m.session_id, page_size=mix.PAGE)
        page: rewind_service_pb2.ListRewindPointsResponse = await self.unary("ListRewindPoints", request)
        got = [(p.message_id, p.text) for p in page.points]
        want = [(p.prompt_id, p.text) for p in self.m.points[: mix.PAGE]]
        if got != want:
            self.w.note(f"{self.name()}: the first page {got} != the model's {want}")
        if page.last_message_id != self.m.last_message_id:
            self.w.note(
                f"{self.name()}: ListRewindPoints says the last message is {page.last_message_id!r}, "
                f"the model {self.m.last_message_id!r}"
            )

    async def get(self) -> None:
        request = session_service_pb2.GetSessionRequest(session_id=self.m.session_id)
        session: session_pb2.Session = await self.unary("GetSession", request)
        self._check_session(session)

    def _check_session(self, session: session_pb2.Session) -> None:
        if session.last_message_id != self.m.last_message_id or session.turn_count != len(self.m.points):
            self.w.note(
                f"{self.name()}: GetSession says {session.turn_count} turns, last {session.last_message_id!r}; "
                f"the model {len(self.m.points)}, {self.m.last_message_id!r}"
            )
        if session.state == session_pb2.SESSION_STATE_RUNNING:
            self.w.note(f"{self.name()}: RUNNING with no turn of its loop in flight")

    async def _target(self, mode: int) -> int | None:
        """A point for `mode`; a session with none yet gets a turn first (a Prompt of the mix's)."""
        index = mix.target(self.m, mode, self.rng)
        if index is None:
            await self.prompt()
            index = mix.target(self.m, mode, self.rng)
        return index

    async def dry_run(self) -> None:
        mode = self.rng.choice(mix.MODES)
        index = await self._target(mode)
        if index is None:
            return
        request = rewind_service_pb2.RewindRequest(
            session_id=self.m.session_id, message_id=self.m.points[index].prompt_id, mode=mode
        )
        result: rewind_pb2.RewindResult = await self.unary("DryRun", request, detail=mix.MODE_NAMES[mode])
        for half in (result.files, result.conversation):
            if half.requested and not half.can_rewind:
                self.w.count(f"dry run refused: {half.refusal.reason}")

    async def rewind(self) -> None:
        mode = self.rng.choice(mix.MODES)
        index = await self._target(mode)
        if index is None:
            return
        point = self.m.points[index]
        request = rewind_service_pb2.RewindRequest(
            session_id=self.m.session_id, message_id=point.prompt_id, mode=mode, request_id=str(uuid.uuid4())
        )
        before = self.m.last_message_id
        try:
            result: rewind_pb2.RewindResult = await self.unary("Rewind", request, detail=mix.MODE_NAMES[mode])
        except Refused as refused:
            if not refused.definite:
                await self.resync_rewind(index)
            return
        self.w.made.append([self.principal, "REWOUND", result.rewind_id, time.monotonic()])
        exact = result.files.source == SNAPSHOT
        self.m.rewound(
            index, mode, exact=exact, rewind_id=result.rewind_id, last_message_id=result.last_message_id
        )
        if mode == FILES and result.last_message_id != before:
            self.w.note(
                f"{self.name()}: a files rewind moved the last message {before!r} -> {result.last_message_id!r}"
            )
        self.check_files("after a rewind")
        if self.want_undo:
            self.want_undo = False
            await self.undo()

    async def undo(self) -> None:
        undo = self.m.undo
        if undo is None:
            self.want_undo = True
            return
        request = rewind_service_pb2.UndoRewindRequest(
            session_id=self.m.session_id, rewind_id=undo.rewind_id, request_id=str(uuid.uuid4())
        )
        try:
            result: rewind_pb2.RewindResult = await self.unary("UndoRewind", request)
        except Refused as refused:
            if not refused.definite:
                await self.resync_undo()
            else:
                self.m.undo = None
            return
        self.w.made.append([self.principal, "UNDONE", undo.rewind_id, time.monotonic()])
        self.m.undone(result.last_message_id)
        if result.last_message_id != undo.last_message_id:
            self.w.note(
                f"{self.name()}: the undo's last message {result.last_message_id!r} is not the one before "
                f"the rewind, {undo.last_message_id!r}"
            )
        self.check_files("after an undo")

    async def fork_or_delete(self) -> None:
        if self.rng.random() < 0.5:
            await self.fork()
        else:
            await self.delete()

    async def fork(self) -> None:
        request = session_service_pb2.ForkSessionRequest(
            session_id=self.m.session_id, new_session_id=str(uuid.uuid4()), request_id=str(uuid.uuid4())
        )
        try:
            fork: session_pb2.Session = await self.unary("ForkSession", request)
        except Refused as refused:
            if refused.definite:
                return
            # Whether it was made: the call is idempotent, ask again (unrecorded).
            fork = await self.unary("ForkSession", request, record=False)
        self.m.undo = None
        self.model = self.m.fork(fork.session_id, fork.cwd, fork.last_message_id)
        self.models.append(self.model)
        if fork.last_message_id != self.models[-2].last_message_id:
            self.w.note(f"{self.name()}: the fork's last message is not its source's")

    async def delete(self) -> None:
        request = session_service_pb2.DeleteSessionRequest(
            session_id=self.m.session_id, request_id=str(uuid.uuid4()), delete_workspace=True
        )
        try:
            await self.unary("DeleteSession", request)
        except Refused as refused:
            if refused.definite:
                return
            await self.unary("DeleteSession", request, record=False)
        self.w.made.append([self.principal, "SESSION_DELETED", self.m.session_id, time.monotonic()])
        self.m.deleted = True
        await self.create()

    # After a call that may or may not have applied

    async def _server_view(self) -> tuple[list[tuple[str, str]], session_pb2.Session]:
        points = await self.all_points()
        session = await self.unary(
            "GetSession", session_service_pb2.GetSessionRequest(session_id=self.m.session_id), record=False
        )
        return [(p.message_id, p.text) for p in points], session

    async def resync_prompt(self, script: mix.Script) -> None:
        """A turn failed: it is a point or not; what its tools wrote is unknown."""
        got, session = await self._server_view()
        want = [(p.prompt_id, p.text) for p in self.m.points]
        if got == want:
            self.m.uncertain(set(script.writes))  # (no tool ran without its prompt recorded; cheap)
        elif got[:-1] == want and got[-1][1] == script.text[:200]:
            self.m.turn(got[-1][0], script.text, {}, session.last_message_id)
            self.m.uncertain(set(script.writes))
        else:
            self.w.note(f"{self.name()}: after a failed turn the points are {got}, the model's {want}")
            return
        self.m.last_message_id = session.last_message_id

    async def resync_rewind(self, index: int) -> None:
        """A rewind failed: its conversation half applied or not; the files it may have changed
        are unknown."""
        got, session = await self._server_view()
        ids = [(p.prompt_id, p.text) for p in self.m.points]
        point = self.m.points[index]
        self.m.uncertain({path for _, paths in self.m.changes[point.sent :] for path in paths})
        if got == ids[:index]:
            del self.m.points[index:]
        elif got != ids:
            self.w.note(f"{self.name()}: after a failed rewind the points are {got}, the model's {ids}")
        self.m.last_message_id = session.last_message_id

    async def resync_undo(self) -> None:
        undo = self.m.undo
        assert undo is not None
        got, session = await self._server_view()
        self.m.uncertain(undo.paths)
        if got == [(p.prompt_id, p.text) for p in undo.points]:
            self.m.points = undo.points
        self.m.last_message_id = session.last_message_id

    # Checks

    async def all_points(self) -> list[rewind_pb2.RewindPoint]:
        out: list[rewind_pb2.RewindPoint] = []
        token = ""
        while True:
            request = rewind_service_pb2.ListRewindPointsRequest(
                session_id=self.m.session_id, page_size=1000, page_token=token
            )
            page: rewind_service_pb2.ListRewindPointsResponse = await self.unary(
                "ListRewindPoints", request, record=False
            )
            out.extend(page.points)
            token = page.next_page_token
            if not token:
                return out

    def check_files(self, when: str) -> None:
        for path, content in self.m.files.items():
            if content == UNKNOWN:
                continue
            on_disk = _read(self.m.cwd / path)
            expected = None if content is None else content + "\n"
            if on_disk != expected:
                self.w.note(f"{self.name()} {when}: {path} holds {on_disk!r}, the model says {expected!r}")
        self.w.count("file checks")

    async def check(self) -> None:
        """Every session the loop made, whole, against its model."""
        for model in self.models:
            self.model = model
            if model.deleted:
                try:
                    await self.unary(
                        "GetSession",
                        session_service_pb2.GetSessionRequest(session_id=model.session_id),
                        record=False,
                    )
                    self.w.note(f"{self.name()}: deleted, yet GetSession answers")
                except Refused as refused:
                    if refused.reason != "SESSION_NOT_FOUND":
                        self.w.note(f"{self.name()}: deleted, GetSession says {refused}")
                if model.cwd.exists():
                    self.w.note(f"{self.name()}: deleted with its workspace, yet {model.cwd} is there")
                self.w.count("deleted sessions checked")
                continue
            got, session = await self._server_view()
            want = [(p.prompt_id, p.text[:200]) for p in model.points]
            if got != want:
                self.w.note(f"{self.name()}: points {got} != the model's {want}")
            self._check_session(session)
            self.check_files("at the end")
            self.w.count("sessions checked")
            if model.forked_from:
                self.w.count("forks checked")

    async def recall(self) -> None:
        """What the agent itself sees: exactly the model's visible prompts."""
        events = await self.prompt(record=False, text="recall")
        for event in events:
            text = event.assistant_message.text
            if text.startswith(RECALL_PREFIX):
                seen = json.loads(text[len(RECALL_PREFIX) :])
                want = [p.text for p in self.m.points]
                if seen != want:
                    self.w.note(f"{self.name()}: the agent sees {seen}, the model {want}")
                self.w.count("recalls")
                return
        self.w.note(f"{self.name()}: no recall answer in {events[-2:]}")

    # The loop

    async def step(self) -> None:
        op = mix.choose(self.rng)
        if op == "Prompt":
            await self.prompt()
        elif op == "ListRewindPoints":
            await self.points()
        elif op == "DryRun":
            await self.dry_run()
        elif op == "Rewind":
            await self.rewind()
        elif op == "UndoRewind":
            await self.undo()
        elif op == "GetSession":
            await self.get()
        else:
            await self.fork_or_delete()

    async def run(self) -> None:
        think = self.w.plan.think
        # With a think time the calls arrive as a Poisson process: the first after a wait of the
        # same law (not every loop at once when the window opens), and no wait past its end.
        if think > 0:
            await self._think(think)
        while time.monotonic() < self.w.deadline:
            with contextlib.suppress(Refused):  # recorded; the model is unchanged (or resynced)
                await self.step()
            if think > 0:
                await self._think(think)

    async def _think(self, mean: float) -> None:
        left = self.w.deadline - time.monotonic()
        if left > 0:
            await asyncio.sleep(min(self.rng.expovariate(1 / mean), left))


class _StreamFailed(Exception):
    """A Prompt stream that failed after some events: the turn may have run."""

    def __init__(self, err: grpc.aio.AioRpcError) -> None:
        super().__init__(str(err))
        self.err = err


def _failed_tools(events: list[session_pb2.TurnEvent]) -> list[str]:
    """Write, Edit and Bash calls whose result was an error (a Read of a new file may fail)."""
    uses = {
        use.id: use.name
        for e in events
        if e.HasField("assistant_message")
        for use in e.assistant_message.tool_uses
        if use.name in ("Write", "Edit", "Bash")
    }
    return [
        f"{uses[e.tool_result.tool_use_id]}: {e.tool_result.content[:200]}"
        for e in events
        if e.HasField("tool_result") and e.tool_result.tool_use_id in uses and e.tool_result.is_error
    ]


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


class Watcher:
    """One WatchRewindEvents stream of every session its principal may see, new events only,
    resumed after its last cursor if the stream breaks."""

    def __init__(self, stubs: Stubs, replica: int, index: int, principal: str, token: str) -> None:
        self.stub = stubs.rewinds[replica][index % len(stubs.rewinds[replica])]
        self.principal = principal
        self.metadata = (("authorization", f"Bearer {token}"),)
        self.received: list[list[Any]] = []  # (kind, rewind_id or session_id, cursor, at (monotonic))
        self.errors: list[str] = []
        self.opened = asyncio.Event()
        self.cursor: int | None = None
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        while True:
            request = rewind_service_pb2.WatchRewindEventsRequest()
            if self.cursor is not None:
                request.after_cursor = self.cursor
            call = self.stub.WatchRewindEvents(request, metadata=self.metadata)
            try:
                async for response in call:
                    if response.HasField("caught_up"):
                        self.cursor = self.cursor if self.cursor is not None else response.caught_up.cursor
                        self.opened.set()
                        continue
                    event = response.event
                    kind = rewind_pb2.RewindEventKind.Name(event.kind).removeprefix("REWIND_EVENT_KIND_")
                    key = event.session_id if kind == "SESSION_DELETED" else event.rewind_id
                    self.received.append([kind, key, event.cursor, time.monotonic()])
                    self.cursor = event.cursor
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.CANCELLED:
                    return
                self.errors.append(f"{err.code().name} {_reason(err)}")
            await asyncio.sleep(0.5)


async def _run(plan: Plan) -> dict[str, Any]:
    stubs = Stubs(plan.addresses, len(plan.loops))
    w = Worker(plan, stubs)
    loop = asyncio.get_running_loop()
    watchers = [
        Watcher(stubs, i % len(plan.addresses), i, principal, token) for i, principal, token in plan.watchers
    ]
    for watcher in watchers:
        watcher.task = asyncio.create_task(watcher.run())
    await asyncio.wait_for(asyncio.gather(*(watcher.opened.wait() for watcher in watchers)), plan.timeout)
    loops = [Loop(w, i, principal, token) for i, principal, token in plan.loops]
    started = time.monotonic()
    gate = asyncio.Semaphore(plan.setup_concurrency)
    done = 0

    async def set_up(each: Loop) -> None:
        nonlocal done
        async with gate:
            await each.create(record=False)
            for _ in range(plan.warmup_turns):
                await each.prompt(record=False)
        done += 1
        _say(f"setup {done}")

    await asyncio.gather(*(set_up(each) for each in loops))
    setup_s = time.monotonic() - started
    _say("ready")
    if (await loop.run_in_executor(None, sys.stdin.readline)).strip() != "go":
        raise SystemExit("the coordinator did not say go")
    usage = resource.getrusage(resource.RUSAGE_SELF)
    w.recording = True
    w.deadline = time.monotonic() + plan.seconds
    tasks = [asyncio.create_task(each.run()) for each in loops]

    async def progress() -> None:
        while True:
            await asyncio.sleep(1.0)
            _say("progress " + json.dumps({"calls": len(w.calls), "errors": w.errors}))

    reporter = asyncio.create_task(progress())
    await asyncio.gather(*tasks)
    w.recording = False
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)
    ended = time.time()
    await asyncio.sleep(1.0)  # the last events reach the watchers
    for watcher in watchers:
        assert watcher.task is not None
        watcher.task.cancel()
    await asyncio.gather(*(wt.task for wt in watchers if wt.task is not None), return_exceptions=True)
    reporter.cancel()
    _say("checking")
    check_gate = asyncio.Semaphore(8)

    async def check(each: Loop) -> None:
        async with check_gate:
            await each.check()

    await asyncio.gather(*(check(each) for each in loops))
    for each in loops[: plan.recall]:
        if each.model is not None and not each.model.deleted:
            await each.recall()
    await stubs.close()
    return {
        "calls": w.calls,
        "made": w.made,
        "watchers": [
            {"principal": wt.principal, "received": wt.received, "errors": wt.errors} for wt in watchers
        ],
        "violations": w.violations,
        "checked": w.checked,
        "waits": w.waits,
        "cpu_s": cpu,
        "setup_s": setup_s,
        "ended": ended,
        "sessions": sum(len(each.models) for each in loops),
    }


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> None:
    plan = Plan(**json.loads(sys.stdin.readline()))
    result = asyncio.run(_run(plan))
    _say("result " + json.dumps(result))


if __name__ == "__main__":
    main()
