"""Plain-text views of the API's messages, pinned character for character."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from google.protobuf import struct_pb2, timestamp_pb2

from agent_rewind.api.v1 import rewind_pb2, session_pb2
from agent_rewind.client import (
    TOOL_OUTPUT_BYTES,
    TOOL_OUTPUT_LINES,
    follow_turn,
    format_capabilities,
    format_duration,
    format_points,
    format_rewind_result,
    format_session,
    format_sessions,
    format_size,
    format_table,
    format_time,
    format_turn_event,
    one_line,
    summarize_input,
    to_json,
)

TS = timestamp_pb2.Timestamp(seconds=1764457865)  # 2025-11-29T23:11:05Z
SID = "11111111-2222-3333-4444-555555555555"


def struct(value: dict[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(value)
    return s


def test_table_pads_columns_and_right_aligns_the_asked_ones() -> None:
    table = format_table(["A", "NUM", "LAST"], [["xyz", "7", "end"], ["q", "123", ""]], right=[1])
    assert table.splitlines() == [
        "A    NUM  LAST",
        "xyz    7  end",
        "q    123",
    ]


def test_one_line_marks_newlines_and_cuts_with_an_ellipsis() -> None:
    assert one_line("a\nb\n") == "a ⏎ b"
    assert one_line("abcdefgh", 5) == "abcd…"
    assert one_line("abcde", 5) == "abcde"


def test_time_is_utc_iso_and_unset_is_a_dash() -> None:
    assert format_time(TS) == "2025-11-29T23:11:05Z"
    assert format_time(timestamp_pb2.Timestamp()) == "-"


def test_sizes_are_binary_units_to_one_decimal() -> None:
    assert [format_size(n) for n in (0, 1023, 1024, 1536, 10 * 1024**2, 1024**2 - 1, 3 * 1024**6)] == [
        "0 B",
        "1023 B",
        "1.0 KiB",
        "1.5 KiB",
        "10.0 MiB",
        "1.0 MiB",
        "3072.0 PiB",
    ]


def test_durations() -> None:
    assert [format_duration(ms) for ms in (0, 999, 1234, 59_949, 95_000)] == [
        "0ms",
        "999ms",
        "1.2s",
        "59.9s",
        "1m35s",
    ]


# --- turn events --------------------------------------------------------------------------------


def test_user_prompt_line_carries_the_message_id_and_the_text_on_one_line() -> None:
    event = session_pb2.TurnEvent(
        session_id=SID, message_id="u-1", user_prompt=session_pb2.UserPrompt(text="write a.txt x\nsay hi")
    )
    assert format_turn_event(event) == ["› prompt u-1  write a.txt x ⏎ say hi"]  # noqa: RUF001


def test_assistant_text_then_one_line_per_tool_call() -> None:
    event = session_pb2.TurnEvent(
        session_id=SID,
        message_id="a-1",
        assistant_message=session_pb2.AssistantMessage(
            api_message_id="msg_1",
            text="I'll write.\nThen stop.",
            tool_uses=[
                session_pb2.ToolUse(
                    id="toolu_1", name="Write", input=struct({"file_path": "/w/a.txt", "content": "x\n"})
                ),
                session_pb2.ToolUse(id="toolu_2", name="Bash", input=struct({"command": "ls", "timeout": 5})),
            ],
        ),
    )
    assert format_turn_event(event) == [
        "● I'll write.",
        "  Then stop.",
        '⚙ Write {file_path: "/w/a.txt", content: "x\\n"}',
        '⚙ Bash {command: "ls", timeout: 5}',
    ]


def test_tool_input_values_and_the_whole_summary_are_cut() -> None:
    assert summarize_input(struct({"command": "x" * 100}), value_limit=10) == '{command: "xxxxxxxx…}'
    long = summarize_input(struct({f"k{i}": i for i in range(40)}), limit=30)
    assert len(long) == 30
    assert long.endswith("…}")


def test_tool_result_shows_its_first_line_and_marks_errors() -> None:
    ok = session_pb2.TurnEvent(
        message_id="t-1", tool_result=session_pb2.ToolResult(tool_use_id="toolu_1", content="done\nmore")
    )
    failed = session_pb2.TurnEvent(
        message_id="t-2", tool_result=session_pb2.ToolResult(tool_use_id="toolu_2", content="", is_error=True)
    )
    assert format_turn_event(ok) == ["↳ tool result done …"]
    assert format_turn_event(failed) == ["↳ tool result (error) (empty)"]


LS_OUTPUT = (
    "total 8\ndrwxr-xr-x 2 agent agent 4096 .\n-rw-r--r-- 1 agent agent   12 notes.txt\ngit version 2.39.5\n"
)


def bash_turn(content: str, *, name: str = "Bash") -> list[session_pb2.TurnEvent]:
    """An assistant message calling `name`, then the call's result."""
    use = session_pb2.ToolUse(id="toolu_1", name=name, input=struct({"command": "ls -la && git --version"}))
    return [
        session_pb2.TurnEvent(
            message_id="a-1", assistant_message=session_pb2.AssistantMessage(tool_uses=[use])
        ),
        session_pb2.TurnEvent(
            message_id="t-1", tool_result=session_pb2.ToolResult(tool_use_id="toolu_1", content=content)
        ),
    ]


def test_a_bash_result_is_the_commands_whole_output_under_its_line() -> None:
    out = io.StringIO()
    follow_turn(bash_turn(LS_OUTPUT), out)
    assert out.getvalue().splitlines() == [
        '⚙ Bash {command: "ls -la && git --version"}',
        "↳ tool result",
        "  total 8",
        "  drwxr-xr-x 2 agent agent 4096 .",
        "  -rw-r--r-- 1 agent agent   12 notes.txt",
        "  git version 2.39.5",
    ]


def test_another_tools_result_stays_one_line_unless_full() -> None:
    out = io.StringIO()
    follow_turn(bash_turn(LS_OUTPUT, name="Read"), out)
    assert out.getvalue().splitlines()[-1] == "↳ tool result total 8 …"
    whole = io.StringIO()
    follow_turn(bash_turn(LS_OUTPUT, name="Read"), whole, full=True)
    assert whole.getvalue().splitlines()[-5:] == [
        "↳ tool result",
        *(f"  {line}" for line in LS_OUTPUT.splitlines()),
    ]


def test_a_long_bash_output_is_cut_at_the_line_cap_saying_what_was_left_out() -> None:
    output = "\n".join(f"line {i}" for i in range(100))
    lines = format_turn_event(bash_turn(output)[1], tool_name="Bash")
    assert lines[0] == "↳ tool result"
    assert lines[1:-1] == [f"  line {i}" for i in range(TOOL_OUTPUT_LINES)]
    left = sum(len(f"line {i}") + 1 for i in range(TOOL_OUTPUT_LINES, 100)) - 1
    assert lines[-1] == f"  … 60 more lines ({left} B) not shown: --full shows every tool result whole"
    assert format_turn_event(bash_turn(output)[1], tool_name="Bash", full=True)[1:] == [
        f"  line {i}" for i in range(100)
    ]


def test_a_bash_output_is_cut_at_the_byte_cap_even_within_one_line() -> None:
    lines = format_turn_event(bash_turn("x" * 5000 + "\nend")[1], tool_name="Bash")
    assert lines[1] == "  " + "x" * TOOL_OUTPUT_BYTES
    assert lines[2] == (
        "  … the rest of the line and 1 more line (908 B) not shown: --full shows every tool result whole"
    )
    wide = format_turn_event(bash_turn("y" * 30 + "\n" + "z" * 5000)[1], tool_name="Bash")
    assert wide[1:] == [
        "  " + "y" * 30,
        "  … 1 more line (4.9 KiB) not shown: --full shows every tool result whole",
    ]


def test_an_empty_or_one_line_bash_result_stays_on_its_line() -> None:
    assert format_turn_event(bash_turn("\n")[1], tool_name="Bash") == ["↳ tool result (empty)"]
    assert format_turn_event(bash_turn("git version 2.39.5\n")[1], tool_name="Bash") == [
        "↳ tool result git version 2.39.5"
    ]


def test_subagent_messages_are_indented() -> None:
    event = session_pb2.TurnEvent(
        message_id="s-1",
        parent_tool_use_id="toolu_9",
        assistant_message=session_pb2.AssistantMessage(
            text="sub", tool_uses=[session_pb2.ToolUse(name="Read", input=struct({"file_path": "/w/a"}))]
        ),
    )
    assert format_turn_event(event) == ["    ● sub", '    ⚙ Read {file_path: "/w/a"}']


def test_result_line() -> None:
    success = session_pb2.TurnEvent(
        result=session_pb2.TurnResult(
            subtype="success", num_turns=3, duration_ms=1234, total_cost_usd=0.01234
        )
    )
    stopped = session_pb2.TurnEvent(
        result=session_pb2.TurnResult(
            subtype="error_during_execution",
            is_error=True,
            num_turns=1,
            duration_ms=95_000,
            result="boom\ntrace",
            interrupted=True,
        )
    )
    assert format_turn_event(success) == ["✓ result success · 3 model calls · 1.2s · $0.0123"]
    assert format_turn_event(stopped) == [
        "✗ result error_during_execution · 1 model call · 1m35s · interrupted",
        "  boom …",
    ]


def test_an_event_of_an_unknown_kind_prints_nothing() -> None:
    assert format_turn_event(session_pb2.TurnEvent(session_id=SID)) == []


def test_follow_turn_prints_each_event_and_keeps_the_prompt_id_texts_and_result() -> None:
    events = [
        session_pb2.TurnEvent(message_id="u-1", user_prompt=session_pb2.UserPrompt(text="recall")),
        session_pb2.TurnEvent(
            message_id="s-1", parent_tool_use_id="toolu_9", user_prompt=session_pb2.UserPrompt(text="sub")
        ),
        session_pb2.TurnEvent(
            message_id="s-2",
            parent_tool_use_id="toolu_9",
            assistant_message=session_pb2.AssistantMessage(text="subagent text"),
        ),
        session_pb2.TurnEvent(
            message_id="a-1", assistant_message=session_pb2.AssistantMessage(text='RECALL: ["recall"]')
        ),
        session_pb2.TurnEvent(result=session_pb2.TurnResult(subtype="success", num_turns=1)),
    ]
    out = io.StringIO()
    outcome = follow_turn(events, out)
    assert out.getvalue().splitlines() == [
        "› prompt u-1  recall",  # noqa: RUF001
        "    › prompt s-1  sub",  # noqa: RUF001
        "    ● subagent text",
        '● RECALL: ["recall"]',
        "✓ result success · 1 model call · 0ms",
    ]
    assert outcome.prompt_message_id == "u-1"
    assert outcome.assistant_texts == ['RECALL: ["recall"]']
    assert outcome.result is not None and outcome.result.subtype == "success"
    assert outcome.ok


def test_follow_turn_json_lines_prints_one_object_per_event() -> None:
    out = io.StringIO()
    outcome = follow_turn(
        [
            session_pb2.TurnEvent(
                session_id=SID, message_id="u-1", user_prompt=session_pb2.UserPrompt(text="hi")
            )
        ],
        out,
        json_lines=True,
    )
    (line,) = out.getvalue().splitlines()
    assert json.loads(line) == {
        "session_id": SID,
        "message_id": "u-1",
        "parent_tool_use_id": "",
        "user_prompt": {"text": "hi"},
    }
    assert outcome.result is None
    assert not outcome.ok


# --- sessions, points, rewinds, capabilities ----------------------------------------------------


def make_session() -> session_pb2.Session:
    return session_pb2.Session(
        session_id=SID,
        cwd="/w/a",
        state=session_pb2.SESSION_STATE_IDLE,
        last_message_id="m-9",
        turn_count=3,
        file_checkpointing=True,
        create_time=TS,
        update_time=TS,
        options=struct({"model": "x", "max_turns": 5}),
    )


def test_session_block() -> None:
    assert format_session(make_session()).splitlines() == [
        f"session_id          {SID}",
        "state               IDLE",
        "cwd                 /w/a",
        "turns               3",
        "last_message_id     m-9",
        "file_checkpointing  yes",
        "snapshots           no",
        "storage             - (not measured yet)",
        "created             2025-11-29T23:11:05Z",
        "updated             2025-11-29T23:11:05Z",
        'options             {"max_turns": 5, "model": "x"}',
    ]


def test_a_session_shows_what_it_holds() -> None:
    session = make_session()
    session.storage.CopyFrom(session_pb2.StorageUsage(workspace_bytes=3 << 20, history_bytes=512 << 10))
    (line,) = [x for x in format_session(session).splitlines() if x.startswith("storage")]
    assert line == "storage             3.5 MiB: workspace 3.0 MiB, history 512.0 KiB"


def test_a_fork_shows_where_it_came_from() -> None:
    def origin_lines(**origin: str) -> list[str]:
        session = make_session()
        session.forked_from.CopyFrom(session_pb2.ForkOrigin(**origin))
        return [x for x in format_session(session).splitlines() if x.startswith("forked_from")]

    assert origin_lines(session_id="src-1", message_id="m-2") == ["forked_from         src-1 before m-2"]
    assert origin_lines(session_id="src-1") == ["forked_from         src-1 before - (the whole session)"]
    assert not [x for x in format_session(make_session()).splitlines() if x.startswith("forked_from")]


def test_session_block_shows_what_its_workspace_snapshots_hold() -> None:
    def snapshots_line(**fields: Any) -> str:
        (line,) = [x for x in format_session(session_pb2.Session(**fields)).splitlines() if "snapshots" in x]
        return line

    assert snapshots_line(workspace_snapshots=True, snapshot_bytes=3 * 1024**2 // 2) == (
        "snapshots           yes, 1.5 MiB on disk"
    )
    assert snapshots_line(workspace_snapshots=True) == "snapshots           yes, 0 B on disk"
    # Snapshots off, but some still kept: still counted.
    assert snapshots_line(snapshot_bytes=2048) == "snapshots           no, 2.0 KiB on disk"


def test_sessions_table() -> None:
    closed = session_pb2.Session(
        session_id="b", state=session_pb2.SESSION_STATE_CLOSED, turn_count=12, cwd="/w/b"
    )
    snapshotted = session_pb2.Session(
        session_id="c",
        state=session_pb2.SESSION_STATE_HIBERNATED,
        turn_count=2,
        cwd="/w/c",
        workspace_snapshots=True,
        snapshot_bytes=5 * 1024**3 // 4,
    )
    fresh = session_pb2.Session(
        session_id="d", state=session_pb2.SESSION_STATE_IDLE, workspace_snapshots=True
    )
    assert format_sessions([make_session(), closed, snapshotted, fresh]).splitlines() == [
        "SESSION                               STATE       TURNS  SNAPSHOTS  LAST MESSAGE  CWD   UPDATED",
        f"{SID}  IDLE            3          -  m-9           /w/a  2025-11-29T23:11:05Z",
        "b                                     CLOSED         12          -  -             /w/b  -",
        "c                                     HIBERNATED      2    1.2 GiB  -             /w/c  -",
        "d                                     IDLE            0        0 B  -                   -",
    ]
    assert format_sessions([]) == "no sessions"


def test_points_table_with_the_last_message_footer() -> None:
    points = [
        rewind_pb2.RewindPoint(
            message_id="p0",
            text="write notes.txt first draft\nwrite todo.txt buy milk\nsay I wrote two files",
            index=0,
            create_time=TS,
            files_rewindable=True,
            snapshot_available=True,
            compacted=True,
        ),
        rewind_pb2.RewindPoint(
            message_id="p1", resume_at_message_id="a0", text="edit", index=1, create_time=TS
        ),
    ]
    assert format_points(points, "last").splitlines() == [
        "#  MESSAGE_ID  RESUME_AT  FILES  SNAPSHOT  COMPACTED  CREATED               TEXT",
        "0  p0          -          yes    yes       yes        2025-11-29T23:11:05Z  "
        "write notes.txt first draft ⏎ write todo.txt buy milk ⏎ say…",
        "1  p1          a0         no     no        no         2025-11-29T23:11:05Z  edit",
        "last_message_id: last",
    ]
    assert format_points([], "") == "no rewind points\nlast_message_id: -"


def test_dry_run_of_both_halves() -> None:
    result = rewind_pb2.RewindResult(
        files=rewind_pb2.FilesRewindResult(
            can_rewind=True,
            files_changed=["/w/extra.txt", "/w/notes.txt"],
            insertions=1,
            deletions=2,
            requested=True,
        ),
        conversation=rewind_pb2.ConversationRewindResult(can_rewind=True, messages_dropped=8, requested=True),
        last_message_id="a0",
    )
    assert format_rewind_result(result, rewind_pb2.REWIND_MODE_BOTH, dry_run=True).splitlines() == [
        "files            can_rewind: yes · 2 files changed (+1 -2) · skipped links: 0",
        "                   /w/extra.txt",
        "                   /w/notes.txt",
        "conversation     can_rewind: yes · rewound: no · messages dropped: 8",
        "rewind_id        - (dry run: nothing was applied)",
        "last_message_id  a0",
    ]


def test_refused_half_shows_reason_message_and_metadata_and_the_other_half_not_requested() -> None:
    result = rewind_pb2.RewindResult(
        files=rewind_pb2.FilesRewindResult(
            requested=True,
            refusal=rewind_pb2.Refusal(
                reason="FILE_CHECKPOINT_UNAVAILABLE",
                message="no checkpoint",
                metadata={"sdk_error": "gone", "message_id": "p0"},
            ),
        ),
    )
    assert format_rewind_result(result, rewind_pb2.REWIND_MODE_FILES, dry_run=True).splitlines() == [
        "files            can_rewind: no · refused FILE_CHECKPOINT_UNAVAILABLE: no checkpoint",
        "                   message_id: p0",
        "                   sdk_error: gone",
        "                 hint: rewind the conversation only (conversation mode), or the files to a point "
        "with a workspace snapshot",
        "conversation     not requested",
        "rewind_id        - (dry run: nothing was applied)",
        "last_message_id  -",
    ]


def test_applied_conversation_rewind() -> None:
    result = rewind_pb2.RewindResult(
        rewind_id="rw-1",
        conversation=rewind_pb2.ConversationRewindResult(can_rewind=True, rewound=True, messages_dropped=4),
        last_message_id="a0",
    )
    assert format_rewind_result(result, rewind_pb2.REWIND_MODE_CONVERSATION, dry_run=False).splitlines() == [
        "files            not requested",
        "conversation     can_rewind: yes · rewound: yes · messages dropped: 4",
        "rewind_id        rw-1",
        "last_message_id  a0",
    ]


def test_side_effects_come_after_the_halves_one_line_each() -> None:
    result = rewind_pb2.RewindResult(
        conversation=rewind_pb2.ConversationRewindResult(can_rewind=True, messages_dropped=4, requested=True),
        side_effects=[
            rewind_pb2.SideEffect(
                message_id="p1", tool="mcp__mail__send", summary="called send on MCP server mail (to)"
            ),
            rewind_pb2.SideEffect(
                message_id="p2", tool="Bash", summary="a command reached pypi.org:443\n(once)"
            ),
        ],
        last_message_id="a0",
    )
    assert format_rewind_result(result, rewind_pb2.REWIND_MODE_CONVERSATION, dry_run=True).splitlines() == [
        "files            not requested",
        "conversation     can_rewind: yes · rewound: no · messages dropped: 4",
        "side effects     2 calls no rewind undoes",
        "                   mcp__mail__send: called send on MCP server mail (to) (turn p1)",
        "                   Bash: a command reached pypi.org:443 ⏎ (once) (turn p2)",
        "rewind_id        - (dry run: nothing was applied)",
        "last_message_id  a0",
    ]


def test_unspecified_mode_shows_the_files_half() -> None:
    text = format_rewind_result(rewind_pb2.RewindResult(), rewind_pb2.REWIND_MODE_UNSPECIFIED, dry_run=False)
    assert text.splitlines()[:2] == [
        "files            can_rewind: no · 0 files changed (+0 -0) · skipped links: 0",
        "conversation     not requested",
    ]


def test_files_served_by_the_workspace_snapshot_with_conflicts_and_diffs() -> None:
    result = rewind_pb2.RewindResult(
        files=rewind_pb2.FilesRewindResult(
            can_rewind=True,
            files_changed=["notes.txt", "logo.png", "extra.txt"],
            insertions=1,
            deletions=2,
            requested=True,
            source=rewind_pb2.FILES_SOURCE_SNAPSHOT,
            conflicts=[
                rewind_pb2.FileConflict(path="todo.txt", resolution=rewind_pb2.CONFLICT_RESOLUTION_SKIPPED),
                rewind_pb2.FileConflict(
                    path="notes.txt", resolution=rewind_pb2.CONFLICT_RESOLUTION_OVERWRITTEN
                ),
            ],
            diffs=[
                rewind_pb2.FileDiff(
                    path="notes.txt",
                    change=rewind_pb2.FILE_CHANGE_MODIFIED,
                    unified_diff="--- a/notes.txt\n+++ b/notes.txt\n@@ -1 +1 @@\n-second draft \n+first draft\n",
                ),
                rewind_pb2.FileDiff(path="logo.png", change=rewind_pb2.FILE_CHANGE_ADDED, binary=True),
                rewind_pb2.FileDiff(
                    path="extra.txt",
                    change=rewind_pb2.FILE_CHANGE_DELETED,
                    unified_diff="--- a/extra.txt\n+++ /dev/null\n@@ -1,900 +0,0 @@\n-line 1",
                    truncated=True,
                ),
            ],
            diffs_truncated=True,
        ),
        last_message_id="a0",
    )
    assert format_rewind_result(result, rewind_pb2.REWIND_MODE_FILES, dry_run=True).splitlines() == [
        "files            can_rewind: yes · 3 files changed (+1 -2) · skipped links: 0"
        " · from the workspace snapshot",
        "                   notes.txt",
        "                   logo.png",
        "                   extra.txt",
        "                 2 conflicts (also changed outside the agent):",
        "                   todo.txt: skipped (left as it is)",
        "                   notes.txt: overwritten (restored; the external change is lost)",
        "conversation     not requested",
        "rewind_id        - (dry run: nothing was applied)",
        "last_message_id  a0",
        "diffs            modified notes.txt",
        "                   --- a/notes.txt",
        "                   +++ b/notes.txt",
        "                   @@ -1 +1 @@",
        "                   -second draft ",  # trailing whitespace kept: it may be the change
        "                   +first draft",
        "                 added logo.png: binary file, no diff",
        "                 deleted extra.txt",
        "                   --- a/extra.txt",
        "                   +++ /dev/null",
        "                   @@ -1,900 +0,0 @@",
        "                   -line 1",
        "                   … (this diff is cut at the service's size bound)",
        "                 … (diffs of further paths left out: the service's size bound was reached)",
    ]


def test_files_from_the_cli_checkpoints_without_diffs_add_nothing_but_the_source() -> None:
    result = rewind_pb2.RewindResult(
        rewind_id="rw-2",
        files=rewind_pb2.FilesRewindResult(
            can_rewind=True,
            files_changed=["/w/a.txt"],
            insertions=3,
            requested=True,
            source=rewind_pb2.FILES_SOURCE_CHECKPOINT,
        ),
    )
    assert format_rewind_result(result, rewind_pb2.REWIND_MODE_FILES, dry_run=False).splitlines() == [
        "files            can_rewind: yes · 1 file changed (+3 -0) · skipped links: 0"
        " · from the CLI's checkpoints",
        "                   /w/a.txt",
        "conversation     not requested",
        "rewind_id        rw-2",
        "last_message_id  -",
    ]


def test_a_refused_conversation_half_says_what_to_do_next() -> None:
    result = rewind_pb2.RewindResult(
        conversation=rewind_pb2.ConversationRewindResult(
            requested=True,
            refusal=rewind_pb2.Refusal(reason="NO_CONVERSATION_ANCHOR", message="the first prompt"),
        ),
    )
    lines = format_rewind_result(result, rewind_pb2.REWIND_MODE_CONVERSATION, dry_run=True).splitlines()
    assert lines[1:3] == [
        "conversation     can_rewind: no · refused NO_CONVERSATION_ANCHOR: the first prompt",
        "                 hint: rewind its files only (files mode), or start a new session",
    ]


def test_files_refused_for_external_changes_lists_the_conflicts_and_the_source() -> None:
    result = rewind_pb2.RewindResult(
        files=rewind_pb2.FilesRewindResult(
            requested=True,
            source=rewind_pb2.FILES_SOURCE_SNAPSHOT,
            refusal=rewind_pb2.Refusal(reason="EXTERNAL_CHANGES", message="1 path changed outside"),
            conflicts=[
                rewind_pb2.FileConflict(path="notes.txt", resolution=rewind_pb2.CONFLICT_RESOLUTION_REFUSED)
            ],
        ),
        conversation=rewind_pb2.ConversationRewindResult(can_rewind=True, messages_dropped=2, requested=True),
    )
    assert format_rewind_result(result, rewind_pb2.REWIND_MODE_BOTH, dry_run=True).splitlines() == [
        "files            can_rewind: no · refused EXTERNAL_CHANGES: 1 path changed outside",
        "                 from the workspace snapshot",
        "                 1 conflict (also changed outside the agent):",
        "                   notes.txt: refused (the files half is refused: nothing is applied)",
        "                 hint: see them with --dry-run (--diff for the changes), then rewind with "
        "--conflicts skip (leave those paths as they are) or --conflicts overwrite",
        "conversation     can_rewind: yes · rewound: no · messages dropped: 2",
        "rewind_id        - (dry run: nothing was applied)",
        "last_message_id  -",
    ]


def test_a_revert_says_its_scope_and_paths_first_and_its_conflicts_as_changed_since() -> None:
    result = rewind_pb2.RewindResult(
        rewind_id="rw-3",
        files=rewind_pb2.FilesRewindResult(
            can_rewind=True,
            requested=True,
            files_changed=["src/a.py", "src/new.py"],
            insertions=2,
            deletions=5,
            source=rewind_pb2.FILES_SOURCE_SNAPSHOT,
            conflicts=[
                rewind_pb2.FileConflict(path="src/b.py", resolution=rewind_pb2.CONFLICT_RESOLUTION_SKIPPED),
                rewind_pb2.FileConflict(
                    path="logo.png", resolution=rewind_pb2.CONFLICT_RESOLUTION_OVERWRITTEN
                ),
            ],
        ),
        last_message_id="a9",
    )
    text = format_rewind_result(
        result,
        rewind_pb2.REWIND_MODE_FILES,
        dry_run=False,
        scope=rewind_pb2.REWIND_SCOPE_TURN,
        paths=["src", "logo.png"],
    )
    assert text.splitlines() == [
        "scope            turn: reverts only what that turn changed; later changes stay",
        "paths            src, logo.png (every other path keeps its content)",
        "files            can_rewind: yes · 2 files changed (+2 -5) · skipped links: 0"
        " · from the workspace snapshot",
        "                   src/a.py",
        "                   src/new.py",
        "                 2 conflicts (changed since in the lines the turn changed, or as a whole):",
        "                   src/b.py: skipped (left as it is)",
        "                   logo.png: overwritten (put back as before the turn; what changed since is lost)",
        "conversation     not requested",
        "rewind_id        rw-3",
        "last_message_id  a9",
    ]


def test_a_refused_revert_lists_its_conflicts_as_refusing_the_revert() -> None:
    result = rewind_pb2.RewindResult(
        files=rewind_pb2.FilesRewindResult(
            requested=True,
            source=rewind_pb2.FILES_SOURCE_SNAPSHOT,
            refusal=rewind_pb2.Refusal(
                reason="REVERT_CONFLICT",
                message="1 file(s) the turn changed were changed since",
                metadata={"paths": "1"},
            ),
            conflicts=[
                rewind_pb2.FileConflict(path="a.txt", resolution=rewind_pb2.CONFLICT_RESOLUTION_REFUSED)
            ],
        ),
        last_message_id="a9",
    )
    text = format_rewind_result(
        result, rewind_pb2.REWIND_MODE_FILES, dry_run=True, scope=rewind_pb2.REWIND_SCOPE_TURN
    )
    assert text.splitlines() == [
        "scope            turn: reverts only what that turn changed; later changes stay",
        "files            can_rewind: no · refused REVERT_CONFLICT: 1 file(s) the turn changed were changed since",
        "                   paths: 1",
        "                 from the workspace snapshot",
        "                 1 conflict (changed since in the lines the turn changed, or as a whole):",
        "                   a.txt: refused (the revert is refused: nothing is applied)",
        "                 hint: see them with --dry-run (--diff for what the revert would apply), then "
        "revert with --conflicts skip (leave those files as they are) or --conflicts overwrite (put them "
        "back as they were before the turn; what changed since is lost)",
        "conversation     not requested",
        "rewind_id        - (dry run: nothing was applied)",
        "last_message_id  a9",
    ]


@pytest.mark.parametrize("scope", [rewind_pb2.REWIND_SCOPE_UNSPECIFIED, rewind_pb2.REWIND_SCOPE_SINCE])
def test_a_rewind_since_the_point_says_only_its_paths(scope: rewind_pb2.RewindScope.ValueType) -> None:
    result = rewind_pb2.RewindResult(
        files=rewind_pb2.FilesRewindResult(
            can_rewind=True,
            requested=True,
            files_changed=["src/a.py"],
            conflicts=[
                rewind_pb2.FileConflict(path="src/b.py", resolution=rewind_pb2.CONFLICT_RESOLUTION_SKIPPED)
            ],
        ),
        conversation=rewind_pb2.ConversationRewindResult(can_rewind=True, messages_dropped=3, requested=True),
    )
    lines = format_rewind_result(
        result,
        rewind_pb2.REWIND_MODE_BOTH,
        dry_run=True,
        scope=scope,
        paths=["src"],
    ).splitlines()
    assert lines[:5] == [
        "paths            src (every other path keeps its content)",
        "files            can_rewind: yes · 1 file changed (+0 -0) · skipped links: 0",
        "                   src/a.py",
        "                 1 conflict (also changed outside the agent):",
        "                   src/b.py: skipped (left as it is)",
    ]


def test_diffs_cut_before_the_first_path_still_say_so() -> None:
    result = rewind_pb2.RewindResult(
        files=rewind_pb2.FilesRewindResult(can_rewind=True, requested=True, diffs_truncated=True)
    )
    lines = format_rewind_result(result, rewind_pb2.REWIND_MODE_FILES, dry_run=True).splitlines()
    assert lines[-1] == (
        "diffs            … (diffs of further paths left out: the service's size bound was reached)"
    )


def test_capabilities_block() -> None:
    caps = rewind_pb2.Capabilities(
        modes=[
            rewind_pb2.REWIND_MODE_FILES,
            rewind_pb2.REWIND_MODE_CONVERSATION,
            rewind_pb2.REWIND_MODE_BOTH,
        ],
        file_checkpoint_window=100,
        dry_run=True,
        events=False,
        service_version="0.1.0",
        sdk_version="0.2.184",
        cli_version="2.1.327",
        model_backend="offline",
        max_live_sessions=14,
        workspace_snapshots=True,
        authentication=True,
        undo_rewind=True,
        fork_session=True,
        replicas=2,
        sandbox=rewind_pb2.SandboxCapability(
            enabled=True,
            allowed_hosts=["*.pypi.org", "github.com:443"],
            cli_confinement="landlock",
            landlock_abi=4,
        ),
    )
    assert format_capabilities(caps).splitlines() == [
        "service_version         0.1.0",
        "sdk_version             0.2.184",
        "cli_version             2.1.327",
        "modes                   files, conversation, both",
        "file_checkpoint_window  100 most recent prompts",
        "dry_run                 yes",
        "events                  no",
        "replicas                2",
        "model_backend           offline",
        "max_live_sessions       14",
        "workspace_snapshots     yes",
        "authentication          yes",
        "undo_rewind             yes",
        "fork_session            yes",
        "delete_session          no",
        "prompt_rewind           no",
        "sandbox                 enabled: yes · allowed_hosts: *.pypi.org, github.com:443 · "
        "cli_confinement: landlock · landlock_abi: 4",
    ]


def test_capabilities_show_every_field_of_the_message_and_of_its_messages() -> None:
    """Read from the proto's descriptor: a field added to Capabilities cannot be left out."""
    shown = format_capabilities(rewind_pb2.Capabilities()).splitlines()
    keys = [line.split()[0] for line in shown]
    assert sorted(keys) == sorted(f.name for f in rewind_pb2.Capabilities.DESCRIPTOR.fields)
    for field in rewind_pb2.Capabilities.DESCRIPTOR.fields:
        if field.message_type is not None:
            line = next(line for line in shown if line.split()[0] == field.name)
            for sub in field.message_type.fields:
                assert f"{sub.name}: " in line, f"{field.name}.{sub.name} is not shown"


def test_json_uses_proto_field_names_and_shows_defaults() -> None:
    assert json.loads(to_json(rewind_pb2.Capabilities(modes=[rewind_pb2.REWIND_MODE_BOTH]))) == {
        "modes": ["REWIND_MODE_BOTH"],
        "file_checkpoint_window": 0,
        "dry_run": False,
        "events": False,
        "service_version": "",
        "sdk_version": "",
        "cli_version": "",
        "replicas": 0,
        "model_backend": "",
        "max_live_sessions": 0,
        "workspace_snapshots": False,
        "authentication": False,
        "undo_rewind": False,
        "fork_session": False,
        "delete_session": False,
        "prompt_rewind": False,
    }
    assert "\n" not in to_json(make_session(), compact=True)


def test_json_carries_the_snapshot_fields() -> None:
    result = json.loads(
        to_json(
            rewind_pb2.RewindResult(
                files=rewind_pb2.FilesRewindResult(
                    source=rewind_pb2.FILES_SOURCE_SNAPSHOT,
                    conflicts=[
                        rewind_pb2.FileConflict(
                            path="a.txt", resolution=rewind_pb2.CONFLICT_RESOLUTION_SKIPPED
                        )
                    ],
                    diffs=[
                        rewind_pb2.FileDiff(
                            path="b.txt", change=rewind_pb2.FILE_CHANGE_ADDED, unified_diff="+x\n"
                        )
                    ],
                    diffs_truncated=True,
                )
            )
        )
    )["files"]
    assert result["source"] == "FILES_SOURCE_SNAPSHOT"
    assert result["conflicts"] == [{"path": "a.txt", "resolution": "CONFLICT_RESOLUTION_SKIPPED"}]
    assert result["diffs"] == [
        {
            "path": "b.txt",
            "change": "FILE_CHANGE_ADDED",
            "unified_diff": "+x\n",
            "binary": False,
            "truncated": False,
        }
    ]
    assert result["diffs_truncated"] is True
    point = json.loads(to_json(rewind_pb2.RewindPoint(snapshot_available=True)))
    assert point["snapshot_available"] is True
    session = json.loads(to_json(session_pb2.Session(workspace_snapshots=True, snapshot_bytes=2048)))
    assert (session["workspace_snapshots"], session["snapshot_bytes"]) == (True, "2048")
