"""Reverting one turn (REWIND_SCOPE_TURN) and narrowing a files rewind to some paths (`paths`), end
to end: a real server, real Claude Code processes, the scripted model.

A revert takes back what one turn changed in files and keeps what later turns and people changed
since, by a three-way merge per file; conflicts follow `conflict_policy`; the conversation and its
points stay as they were; it is undoable, idempotent by request id and evented with its scope.
`paths` narrows a rewind, a revert and what their undo puts back, from snapshots and from the
CLI's checkpoints alike.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2

from agent_rewind.api.v1 import rewind_pb2, rewind_service_pb2
from tests.integration.harness import (
    BOTH,
    FILES,
    RUNNING,
    Client,
    bad_request,
    error_info,
    prompt_id,
    read,
    serve,
)

TURN = rewind_pb2.REWIND_SCOPE_TURN
SKIP = rewind_pb2.CONFLICT_POLICY_SKIP
OVERWRITE = rewind_pb2.CONFLICT_POLICY_OVERWRITE
SNAPSHOT = rewind_pb2.FILES_SOURCE_SNAPSHOT
CHECKPOINT = rewind_pb2.FILES_SOURCE_CHECKPOINT

WORDS = [
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
    "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango",
]  # fmt: skip


def text(**changed: str) -> str:
    """The twenty words, one a line, with some replaced (`charlie="CHARLIE"`)."""
    return "".join(changed.get(word, word) + "\n" for word in WORDS)


WRITE_A = "write a.txt " + "\\n".join(WORDS)


def _bash_allowed() -> struct_pb2.Struct:
    options = struct_pb2.Struct()
    options.update({"allowed_tools": ["Bash"]})
    return options


async def _session(c: Client, **kw: Any) -> tuple[str, Path]:
    session = await c.create(options=_bash_allowed(), **kw)
    return session.session_id, Path(session.cwd)


def _names(cwd: Path, files: Any) -> list[str]:
    return sorted(Path(f).relative_to(cwd).as_posix() for f in files)


async def _undo(c: Client, sid: str, rewind_id: str, **kw: Any) -> rewind_pb2.RewindResult:
    return await c.rewinds.UndoRewind(
        rewind_service_pb2.UndoRewindRequest(session_id=sid, rewind_id=rewind_id, **kw)
    )


async def _four_turns(c: Client, cwd: Path, sid: str) -> list[str]:
    """Turn 2 changes a.txt's third line, creates made.txt and deletes gone.txt; turns 3 and 4
    change a.txt's fifteenth line and other files."""
    prompts = [
        f"{WRITE_A}\nwrite gone.txt bye",
        "edit a.txt charlie => CHARLIE\nwrite made.txt made by turn two\nbash rm gone.txt",
        "edit a.txt oscar => OSCAR\nwrite later.txt from turn three",
        "write later.txt from turn four\nwrite four.txt four",
    ]
    return [prompt_id(await c.prompt(sid, p)) for p in prompts]


async def test_a_revert_of_turn_two_of_four_keeps_what_turns_three_and_four_did(tmp_path: Path) -> None:
    async with serve(tmp_path, workspace_snapshots=True) as c:
        sid, cwd = await _session(c)
        ids = await _four_turns(c, cwd, sid)
        assert (read(cwd / "a.txt"), read(cwd / "gone.txt")) == (text(charlie="CHARLIE", oscar="OSCAR"), None)
        points = [p.message_id for p in (await c.points(sid)).points]

        preview = await c.dry_run(sid, ids[1], FILES, scope=TURN, include_diff=True)
        assert preview.files.can_rewind and preview.files.source == SNAPSHOT
        assert _names(cwd, preview.files.files_changed) == ["a.txt", "gone.txt", "made.txt"]
        diffs = {d.path: d for d in preview.files.diffs}
        assert "-CHARLIE" in diffs["a.txt"].unified_diff and "+charlie" in diffs["a.txt"].unified_diff
        assert "OSCAR" not in diffs["a.txt"].unified_diff.replace(" OSCAR", ""), (
            "only the turn's lines change"
        )
        assert diffs["made.txt"].change == rewind_pb2.FILE_CHANGE_DELETED
        assert diffs["gone.txt"].change == rewind_pb2.FILE_CHANGE_ADDED
        assert (read(cwd / "a.txt"), read(cwd / "gone.txt")) == (text(charlie="CHARLIE", oscar="OSCAR"), None)

        rid = str(uuid.uuid4())
        result = await c.rewind(sid, ids[1], FILES, scope=TURN, request_id=rid)
        assert result.files.can_rewind and list(result.files.files_changed) == list(
            preview.files.files_changed
        )
        assert (result.files.insertions, result.files.deletions) == (
            preview.files.insertions,
            preview.files.deletions,
        )
        # Turn 2's change is taken back; turn 3's change of the same file stays, and its and turn
        # 4's other files are as they were.
        assert read(cwd / "a.txt") == text(oscar="OSCAR")
        assert read(cwd / "made.txt") is None and read(cwd / "gone.txt") == "bye\n"
        assert (read(cwd / "later.txt"), read(cwd / "four.txt")) == ("from turn four\n", "four\n")
        # The conversation and its points are unchanged: the point stays a point.
        assert not result.conversation.requested
        assert [p.message_id for p in (await c.points(sid)).points] == points
        # Idempotent by request id: the retry gets the first result and applies nothing again.
        (cwd / "later.txt").write_text("a person's\n")
        assert await c.rewind(sid, ids[1], FILES, scope=TURN, request_id=rid) == result
        assert read(cwd / "a.txt") == text(oscar="OSCAR")

        events = await c.events(sid)
        assert [(e.kind, e.scope, list(e.paths)) for e in events] == [
            (rewind_pb2.REWIND_EVENT_KIND_REWOUND, TURN, [])
        ]
        # Undone: the files as the revert found them (the person's later.txt is none of its own).
        await _undo(c, sid, result.rewind_id)
        assert read(cwd / "a.txt") == text(charlie="CHARLIE", oscar="OSCAR")
        assert (read(cwd / "made.txt"), read(cwd / "gone.txt")) == ("made by turn two\n", None)
        assert read(cwd / "later.txt") == "a person's\n"
        undone = (await c.events(sid))[-1]
        assert (undone.kind, undone.scope) == (rewind_pb2.REWIND_EVENT_KIND_UNDONE, TURN)
        # The agent goes on with the conversation it had, all four prompts in it.
        recalled = await c.recall(sid)
        assert len(recalled) == 5 and recalled[-1] == "recall"


async def test_conflicts_are_refused_by_default_skipped_or_overwritten_and_the_dry_run_lists_them(
    tmp_path: Path,
) -> None:
    async with serve(tmp_path, workspace_snapshots=True) as c:
        sid, cwd = await _session(c)
        await c.prompt(sid, f"{WRITE_A}\nwrite b.txt one\nwrite c.txt see")
        turn = prompt_id(
            await c.prompt(sid, "edit a.txt charlie => CHARLIE\nwrite b.txt two\nwrite c.txt sea")
        )
        # A later turn changes the same line of a.txt; a person changes b.txt; c.txt stays.
        await c.prompt(sid, "edit a.txt CHARLIE => Charlie")
        (cwd / "b.txt").write_text("a person's two\n")

        preview = await c.dry_run(sid, turn, FILES, scope=TURN)
        assert not preview.files.can_rewind
        assert preview.files.refusal.reason == "REVERT_CONFLICT"
        assert [(c.path, c.resolution) for c in preview.files.conflicts] == [
            ("a.txt", rewind_pb2.CONFLICT_RESOLUTION_REFUSED),
            ("b.txt", rewind_pb2.CONFLICT_RESOLUTION_REFUSED),
        ]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await c.rewind(sid, turn, FILES, scope=TURN)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        info = error_info(refused.value)
        assert (info.reason, info.metadata["paths"]) == ("REVERT_CONFLICT", "2")
        assert (read(cwd / "b.txt"), read(cwd / "c.txt")) == ("a person's two\n", "sea\n"), "nothing applied"

        skipped = await c.rewind(sid, turn, FILES, scope=TURN, conflict_policy=SKIP)
        assert _names(cwd, skipped.files.files_changed) == ["c.txt"]
        assert [(c.path, c.resolution) for c in skipped.files.conflicts] == [
            ("a.txt", rewind_pb2.CONFLICT_RESOLUTION_SKIPPED),
            ("b.txt", rewind_pb2.CONFLICT_RESOLUTION_SKIPPED),
        ]
        assert read(cwd / "a.txt") == text(charlie="Charlie") and read(cwd / "b.txt") == "a person's two\n"
        assert read(cwd / "c.txt") == "see\n"

        await _undo(c, sid, skipped.rewind_id)
        overwritten = await c.rewind(sid, turn, FILES, scope=TURN, conflict_policy=OVERWRITE)
        assert _names(cwd, overwritten.files.files_changed) == ["a.txt", "b.txt", "c.txt"]
        assert {c.resolution for c in overwritten.files.conflicts} == {
            rewind_pb2.CONFLICT_RESOLUTION_OVERWRITTEN
        }
        assert (read(cwd / "a.txt"), read(cwd / "b.txt"), read(cwd / "c.txt")) == (text(), "one\n", "see\n")


async def test_paths_narrow_a_rewind_a_revert_and_their_undo(tmp_path: Path) -> None:
    async with serve(tmp_path, workspace_snapshots=True) as c:
        sid, cwd = await _session(c)
        await c.prompt(sid, "write src/x.py x0\nwrite src/y.py y0\nwrite notes.md n0")
        turn = prompt_id(
            await c.prompt(sid, "write src/x.py x1\nwrite src/y.py y1\nwrite notes.md n1\nwrite src/z.py z")
        )
        await c.prompt(sid, "write notes.md n2")

        preview = await c.dry_run(sid, turn, FILES, paths=["src/x.py", "src/z.py"])
        assert _names(cwd, preview.files.files_changed) == ["src/x.py", "src/z.py"]
        rewound = await c.rewind(sid, turn, FILES, paths=["src/x.py", "./src/z.py"])
        assert _names(cwd, rewound.files.files_changed) == ["src/x.py", "src/z.py"]
        assert (read(cwd / "src/x.py"), read(cwd / "src/z.py")) == ("x0\n", None)
        assert (read(cwd / "src/y.py"), read(cwd / "notes.md")) == ("y1\n", "n2\n"), "the rest kept"
        event = (await c.events(sid))[-1]
        assert (list(event.paths), event.scope) == (["src/x.py", "src/z.py"], rewind_pb2.REWIND_SCOPE_SINCE)
        # Its undo puts back exactly what it changed.
        (cwd / "notes.md").write_text("a person's\n")
        undone = await _undo(c, sid, rewound.rewind_id)
        assert _names(cwd, undone.files.files_changed) == ["src/x.py", "src/z.py"]
        assert (read(cwd / "src/x.py"), read(cwd / "src/z.py"), read(cwd / "notes.md")) == (
            "x1\n",
            "z\n",
            "a person's\n",
        )

        # A revert of the turn narrowed to a directory: notes.md is the turn's too, and is kept.
        reverted = await c.rewind(sid, turn, FILES, scope=TURN, paths=["src"])
        assert _names(cwd, reverted.files.files_changed) == ["src/x.py", "src/y.py", "src/z.py"]
        assert (read(cwd / "src/y.py"), read(cwd / "src/z.py"), read(cwd / "notes.md")) == (
            "y0\n",
            None,
            "a person's\n",
        )
        await _undo(c, sid, reverted.rewind_id)
        assert (read(cwd / "src/y.py"), read(cwd / "src/z.py")) == ("y1\n", "z\n")
        # A path the rewind would not change is no error: it is just not in files_changed.
        nothing = await c.dry_run(sid, turn, FILES, paths=["README.md"])
        assert nothing.files.can_rewind and list(nothing.files.files_changed) == []


async def test_paths_narrow_a_rewind_served_by_the_cli_s_checkpoints(tmp_path: Path) -> None:
    async with serve(tmp_path, workspace_snapshots=False) as c:
        sid, cwd = await _session(c, workspace_snapshots=False)
        await c.prompt(sid, "write a.txt a0\nwrite b.txt b0")
        point = prompt_id(await c.prompt(sid, "write a.txt a1\nwrite b.txt b1\nwrite new.txt n"))
        await c.prompt(sid, "write a.txt a2")

        preview = await c.dry_run(sid, point, FILES, paths=["a.txt", "new.txt"])
        assert preview.files.source == CHECKPOINT
        assert _names(cwd, preview.files.files_changed) == ["a.txt", "new.txt"]
        assert (preview.files.insertions, preview.files.deletions) == (1, 2)
        result = await c.rewind(sid, point, FILES, paths=["a.txt", "new.txt"])
        assert _names(cwd, result.files.files_changed) == ["a.txt", "new.txt"]
        assert (read(cwd / "a.txt"), read(cwd / "new.txt"), read(cwd / "b.txt")) == ("a0\n", None, "b1\n")
        undone = await _undo(c, sid, result.rewind_id)
        assert _names(cwd, undone.files.files_changed) == ["a.txt", "new.txt"]
        assert (read(cwd / "a.txt"), read(cwd / "new.txt"), read(cwd / "b.txt")) == ("a2\n", "n\n", "b1\n")
        # Without paths the CLI restores every file, as before.
        await c.rewind(sid, point, FILES)
        assert (read(cwd / "a.txt"), read(cwd / "new.txt"), read(cwd / "b.txt")) == ("a0\n", None, "b0\n")


async def test_paths_outside_the_workspace_and_a_revert_of_another_mode_are_refused(tmp_path: Path) -> None:
    async with serve(tmp_path, workspace_snapshots=True) as c:
        sid, cwd = await _session(c)
        point = prompt_id(await c.prompt(sid, "write a.txt a0"))
        await c.prompt(sid, "write a.txt a1")
        os.symlink("/etc", cwd / "out")  # planted by the agent, or a person
        for paths in (["/etc/passwd"], ["../other/a.txt"], ["a.txt", "src/../../x"], ["out/passwd"]):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.rewind(sid, point, FILES, paths=paths)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, paths
            assert error_info(err.value).reason == "PATH_OUTSIDE_WORKSPACE", paths
            assert [v.field for v in bad_request(err.value).field_violations] == ["paths"]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.dry_run(sid, point, FILES, paths=["out/shadow"])
        assert error_info(err.value).reason == "PATH_OUTSIDE_WORKSPACE"
        for mode in (BOTH, rewind_pb2.REWIND_MODE_CONVERSATION):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.rewind(sid, point, mode, scope=TURN)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert [v.field for v in bad_request(err.value).field_violations] == ["scope"]
        assert read(cwd / "a.txt") == "a1\n", "nothing applied"


async def test_a_revert_needs_the_turn_s_snapshots(tmp_path: Path) -> None:
    async with serve(tmp_path, workspace_snapshots=True) as c:
        sid, cwd = await _session(c, workspace_snapshots=False)
        point = prompt_id(await c.prompt(sid, "write a.txt a0"))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.rewind(sid, point, FILES, scope=TURN)
        info = error_info(err.value)
        assert (err.value.code(), info.reason, info.metadata["snapshot_state"]) == (
            grpc.StatusCode.FAILED_PRECONDITION,
            "SNAPSHOT_UNAVAILABLE",
            "off",
        )
        assert read(cwd / "a.txt") == "a0\n"


async def test_a_revert_while_a_turn_runs_is_refused_and_applies_nothing(tmp_path: Path) -> None:
    async with serve(tmp_path, workspace_snapshots=True) as c:
        sid, cwd = await _session(c)
        point = prompt_id(await c.prompt(sid, "write a.txt a0"))
        await c.prompt(sid, "write b.txt b0")
        turn = asyncio.ensure_future(c.prompt(sid, "sleep 2\nwrite c.txt c0"))
        await c.wait_for_state(sid, RUNNING)
        for call in (c.rewind, c.dry_run):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call(sid, point, FILES, scope=TURN)
            assert (err.value.code(), error_info(err.value).reason) == (
                grpc.StatusCode.FAILED_PRECONDITION,
                "TURN_IN_FLIGHT",
            )
        await turn
        assert (read(cwd / "a.txt"), read(cwd / "c.txt")) == ("a0\n", "c0\n")
        reverted = await c.rewind(sid, point, FILES, scope=TURN)
        assert _names(cwd, reverted.files.files_changed) == ["a.txt"]
        assert (read(cwd / "a.txt"), read(cwd / "b.txt"), read(cwd / "c.txt")) == (None, "b0\n", "c0\n")
