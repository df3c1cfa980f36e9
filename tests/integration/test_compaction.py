"""Rewinding past a compaction, against the real CLI: a /compact, then one the CLI starts by itself.

Every prompt before a compaction stays a rewind point (`compacted`); a conversation rewind to one
brings back the conversation as it was then (the model recalls those prompts, not the summary),
its files come back from workspace snapshots, and the rewind is as durable, undoable and
forkable as any (docs/rewind.md, "Rewinding past a compaction").
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent_rewind.api.v1 import rewind_pb2, rewind_service_pb2, session_service_pb2
from agent_rewind.testing.server_process import ServerProcess
from tests.integration.harness import (
    BOTH,
    Client,
    client_of,
    prompt_id,
    read,
    serve,
    transcript_entries,
)

P0 = "write a.txt v0\nsay made a"
P1 = "edit a.txt v0 => v1\nwrite b.txt bee"
P2 = "edit a.txt v1 => v2\nsay b"
# A long context reported: the CLI compacts by itself before the next prompt.
P3 = "context 1000000\nwrite c.txt sea"
P4 = "edit a.txt v2 => v3\nsay c"
SUMMARY = "This session is being continued from a previous conversation"


async def _two_compactions(c: Client) -> tuple[str, Path, list[str]]:
    """P0, P1, /compact, P2, P3, (the CLI's own compaction), P4."""
    session = await c.create()
    sid = session.session_id
    ids = [prompt_id(await c.prompt(sid, p)) for p in (P0, P1)]
    await asyncio.wait_for(c.prompt(sid, "/compact"), 60)
    ids += [prompt_id(await c.prompt(sid, p)) for p in (P2, P3, P4)]
    return sid, Path(session.cwd), ids


def _boundaries(state_dir: Path, session_id: str) -> list[str]:
    return [
        e["compactMetadata"]["trigger"]
        for e in transcript_entries(state_dir, session_id)
        if e.get("subtype") == "compact_boundary" and "agentRewindCopyOf" not in e
    ]


async def _undo(c: Client, sid: str, rewind_id: str) -> None:
    await c.rewinds.UndoRewind(rewind_service_pb2.UndoRewindRequest(session_id=sid, rewind_id=rewind_id))


async def test_a_rewind_two_compactions_back_restores_that_conversation_and_its_files(tmp_path: Path) -> None:
    async with serve(tmp_path, workspace_snapshots=True) as c:
        sid, cwd, ids = await _two_compactions(c)
        assert _boundaries(tmp_path, sid) == ["manual", "auto"]
        points = (await c.points(sid)).points
        assert [p.message_id for p in points] == ids
        assert [p.compacted for p in points] == [True, True, True, True, False]
        assert [(p.files_rewindable, p.snapshot_available) for p in points] == [(True, True)] * 5

        preview = await c.dry_run(sid, ids[1], BOTH)
        assert preview.conversation.can_rewind and preview.files.can_rewind
        assert sorted(Path(f).name for f in preview.files.files_changed) == ["a.txt", "b.txt", "c.txt"]

        rewound = await c.rewind(sid, ids[1], BOTH)
        assert rewound.conversation.rewound
        assert (read(cwd / "a.txt"), read(cwd / "b.txt"), read(cwd / "c.txt")) == ("v0\n", None, None)
        after = (await c.points(sid)).points
        assert [(p.message_id, p.compacted) for p in after] == [(ids[0], False)]
        assert rewound.last_message_id == (await c.points(sid)).last_message_id

        # The model sees the conversation as it was before both compactions, not a summary.
        assert await c.recall(sid) == [P0, "recall"]
        went_on = prompt_id(await c.prompt(sid, "say again"))
        # The conversation goes on from there, the first prompt still under its own id.
        assert [p.message_id for p in (await c.points(sid)).points][0::2] == [ids[0], went_on]


async def test_a_rewind_between_two_compactions_resumes_after_the_first_summary(tmp_path: Path) -> None:
    async with serve(tmp_path, workspace_snapshots=True) as c:
        sid, cwd, ids = await _two_compactions(c)
        rewound = await c.rewind(sid, ids[3], BOTH)  # P3: after the /compact, before the CLI's own
        assert rewound.conversation.rewound
        assert (read(cwd / "a.txt"), read(cwd / "c.txt")) == ("v2\n", None)
        after = (await c.points(sid)).points
        assert [(p.message_id, p.compacted) for p in after] == [
            (ids[0], True),
            (ids[1], True),
            (ids[2], False),
        ]
        seen = await c.recall(sid)
        assert seen[0].startswith(SUMMARY) and seen[-2:] == [P2, "recall"]
        assert P0 not in seen and P3 not in seen


async def test_an_undo_of_a_rewind_past_a_compaction_brings_the_newest_conversation_back(
    tmp_path: Path,
) -> None:
    async with serve(tmp_path, workspace_snapshots=True) as c:
        sid, cwd, ids = await _two_compactions(c)
        before = [(p.message_id, p.compacted) for p in (await c.points(sid)).points]
        rewound = await c.rewind(sid, ids[1], BOTH)
        await _undo(c, sid, rewound.rewind_id)
        assert [(p.message_id, p.compacted) for p in (await c.points(sid)).points] == before
        assert read(cwd / "a.txt") == "v3\n" and read(cwd / "c.txt") == "sea\n"
        seen = await c.recall(sid)
        assert seen[0].startswith(SUMMARY) and seen[-2:] == [P4, "recall"]


async def test_a_fork_at_a_compacted_point_starts_from_the_conversation_before_it(tmp_path: Path) -> None:
    async with serve(tmp_path, workspace_snapshots=True) as c:
        sid, _, ids = await _two_compactions(c)
        fork = await c.sessions.ForkSession(
            session_service_pb2.ForkSessionRequest(session_id=sid, message_id=ids[1])
        )
        assert [p.message_id for p in (await c.points(fork.session_id)).points] == [ids[0]]
        assert read(Path(fork.cwd) / "a.txt") == "v0\n"
        assert await c.recall(fork.session_id) == [P0, "recall"]
        # The source is untouched.
        assert [p.message_id for p in (await c.points(sid)).points] == ids


async def test_a_rewind_past_compactions_survives_a_sigkill_of_the_server_and_its_clis(
    server: ServerProcess,
) -> None:
    await server.start()
    c = client_of(server)
    sid, cwd, ids = await _two_compactions(c)
    rewound = await c.rewind(sid, ids[1], BOTH)
    assert rewound.conversation.rewound and rewound.files.can_rewind
    server.kill()  # the server and every CLI, before any process resumed the copy
    assert await server.wait() == -9
    await server.start()
    c = client_of(server)
    assert [(p.message_id, p.compacted) for p in (await c.points(sid)).points] == [(ids[0], False)]
    assert (read(cwd / "a.txt"), read(cwd / "b.txt"), read(cwd / "c.txt")) == ("v0\n", None, None)
    assert await c.recall(sid) == [P0, "recall"]
    # Killed again once a process has resumed it: the same conversation.
    server.kill()
    assert await server.wait() == -9
    await server.start()
    c = client_of(server)
    assert await c.recall(sid) == [P0, "recall", "recall"]
    # The rewind's event, as for any rewind.
    events = [e for e in await c.events(sid) if e.kind == rewind_pb2.REWIND_EVENT_KIND_REWOUND]
    assert [(e.rewind_id, e.message_id, e.conversation_changed) for e in events] == [
        (rewound.rewind_id, ids[1], True)
    ]
