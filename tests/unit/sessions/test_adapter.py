"""The SDK adapter without a CLI: option validation, ClaudeAgentOptions building, the tool
permission policy, and the mapping of SDK messages to turn events."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from claude_agent_sdk import (
    AssistantMessage,
    PermissionResultAllow,
    PermissionResultDeny,
    ResultMessage,
    SystemMessage,
    TextBlock,
    ThinkingBlock,
    ToolPermissionContext,
    ToolResultBlock,
    ToolUseBlock,
    UserMessage,
)

from agent_rewind.errors import InvalidArgument
from agent_rewind.sessions.adapter import ClientSpec, build_options, to_events, validate_options
from agent_rewind.sessions.events import (
    AssistantEvent,
    PromptEvent,
    ResultEvent,
    ToolCall,
    ToolResultEvent,
)

SID = "0b7f3c1e-5a8d-4d6e-9f10-2a3b4c5d6e7f"


def spec(cwd: Path, **changes: Any) -> ClientSpec:
    values: dict[str, Any] = {
        "session_id": SID,
        "cwd": cwd,
        "options": {},
        "checkpointing": True,
        "env": {"CLAUDE_CONFIG_DIR": "/state/claude"},
        "resume": False,
    }
    values.update(changes)
    return ClientSpec(**values)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "workspaces" / "ws"
    ws.mkdir(parents=True)
    return ws


# validate_options


def test_validate_options_accepts_sdk_option_names() -> None:
    validate_options(
        {
            "model": "claude-test",
            "system_prompt": "be brief",
            "allowed_tools": ["Read"],
            "mcp_servers": {},
            "permission_mode": "acceptEdits",
            "max_turns": 3,
        }
    )


def test_validate_options_refuses_an_unknown_name_naming_the_field() -> None:
    with pytest.raises(InvalidArgument) as caught:
        validate_options({"model": "m", "temperature": 0.2})
    assert caught.value.field == "options.temperature"
    assert caught.value.metadata == {"field": "options.temperature"}


@pytest.mark.parametrize(
    "name", ["cwd", "resume", "env", "session_id", "enable_file_checkpointing", "can_use_tool", "extra_args"]
)
def test_validate_options_refuses_service_controlled_names(name: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        validate_options({name: "x"})
    assert caught.value.field == f"options.{name}"
    assert "set by the service" in caught.value.description


def test_validate_options_accepts_integral_float_max_turns() -> None:
    # A google.protobuf.Struct has only doubles: 5 arrives as 5.0.
    validate_options({"max_turns": 5.0})
    validate_options({"max_turns": None})


@pytest.mark.parametrize("value", [5.5, "5", [5], {"n": 5}])
def test_validate_options_refuses_non_integral_max_turns(value: Any) -> None:
    with pytest.raises(InvalidArgument) as caught:
        validate_options({"max_turns": value})
    assert caught.value.field == "options.max_turns"


# build_options


def test_build_options_passes_stored_options_through(workspace: Path) -> None:
    options = {
        "model": "claude-test",
        "system_prompt": "be brief",
        "allowed_tools": ["Read", "Bash"],
        "max_turns": 5.0,
        "permission_mode": "acceptEdits",
    }
    built = build_options(spec(workspace, options=options))
    assert built.model == "claude-test"
    assert built.system_prompt == "be brief"
    assert built.allowed_tools == ["Read", "Bash"]
    assert built.permission_mode == "acceptEdits"
    assert built.max_turns == 5
    assert type(built.max_turns) is int
    assert built.cwd == str(workspace)
    assert built.env == {"CLAUDE_CONFIG_DIR": "/state/claude"}


def test_build_options_does_not_change_the_stored_options(workspace: Path) -> None:
    options = {"max_turns": 5.0}
    build_options(spec(workspace, options=options))
    assert options == {"max_turns": 5.0}


def test_build_options_defaults_permission_mode_to_default(workspace: Path) -> None:
    assert build_options(spec(workspace)).permission_mode == "default"


def test_build_options_fresh_start_sets_session_id_not_resume(workspace: Path) -> None:
    built = build_options(spec(workspace, resume=False, resume_session_at="a-1", resume_drops_turn="p-2"))
    assert built.session_id == SID
    assert built.resume is None
    # A cut only makes sense when resuming a transcript.
    assert built.resume_session_at is None
    assert built.resume_drops_turn is None


def test_build_options_resume_sets_resume_not_session_id(workspace: Path) -> None:
    built = build_options(spec(workspace, resume=True))
    assert built.resume == SID
    assert built.session_id is None
    assert built.resume_session_at is None
    assert built.resume_drops_turn is None


def test_build_options_resume_carries_the_cut(workspace: Path) -> None:
    built = build_options(spec(workspace, resume=True, resume_session_at="a-1", resume_drops_turn="p-2"))
    assert built.resume == SID
    assert built.resume_session_at == "a-1"
    assert built.resume_drops_turn == "p-2"


def test_build_options_asks_the_cli_to_replay_user_messages(workspace: Path) -> None:
    built = build_options(spec(workspace))
    assert "replay-user-messages" in built.extra_args
    assert built.extra_args["replay-user-messages"] is None


@pytest.mark.parametrize("checkpointing", [True, False])
def test_build_options_file_checkpointing_follows_the_spec(workspace: Path, checkpointing: bool) -> None:
    assert (
        build_options(spec(workspace, checkpointing=checkpointing)).enable_file_checkpointing is checkpointing
    )


def test_build_options_passes_the_stderr_callback(workspace: Path) -> None:
    def on_stderr(line: str) -> None:
        pass

    assert build_options(spec(workspace, stderr=on_stderr)).stderr is on_stderr


# The permission policy


def _context() -> ToolPermissionContext:
    return ToolPermissionContext(suggestions=[])


async def ask(cwd: Path, tool: str, tool_input: dict[str, Any], **options: Any) -> Any:
    policy = build_options(spec(cwd, options=options)).can_use_tool
    assert policy is not None
    return await policy(tool, tool_input, _context())


async def test_write_inside_the_workspace_is_allowed(workspace: Path) -> None:
    assert isinstance(await ask(workspace, "Write", {"file_path": "notes.txt"}), PermissionResultAllow)
    absolute = str(workspace / "sub" / "x.py")
    assert isinstance(await ask(workspace, "Write", {"file_path": absolute}), PermissionResultAllow)
    assert isinstance(await ask(workspace, "Edit", {"file_path": absolute}), PermissionResultAllow)


async def test_write_to_etc_passwd_is_denied(workspace: Path) -> None:
    result = await ask(workspace, "Write", {"file_path": "/etc/passwd", "content": "x"})
    assert isinstance(result, PermissionResultDeny)
    assert "outside" in result.message


async def test_dot_dot_escape_is_denied(workspace: Path) -> None:
    result = await ask(workspace, "Write", {"file_path": "../elsewhere/x.txt"})
    assert isinstance(result, PermissionResultDeny)
    result = await ask(workspace, "Edit", {"file_path": str(workspace / "a" / ".." / ".." / "x")})
    assert isinstance(result, PermissionResultDeny)


async def test_sibling_directory_with_the_workspace_as_prefix_is_denied(workspace: Path) -> None:
    sibling = workspace.parent / (workspace.name + "-evil")
    result = await ask(workspace, "Write", {"file_path": str(sibling / "x")})
    assert isinstance(result, PermissionResultDeny)


async def test_symlink_out_of_the_workspace_is_denied(workspace: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, workspace / "link")
    result = await ask(workspace, "Write", {"file_path": "link/secret.txt"})
    assert isinstance(result, PermissionResultDeny)


async def test_notebook_and_search_tools_use_their_path_keys(workspace: Path) -> None:
    assert isinstance(
        await ask(workspace, "NotebookEdit", {"notebook_path": "/etc/x.ipynb"}), PermissionResultDeny
    )
    assert isinstance(await ask(workspace, "Grep", {"pattern": "x", "path": "/etc"}), PermissionResultDeny)
    assert isinstance(await ask(workspace, "Grep", {"pattern": "x"}), PermissionResultAllow)


async def test_bash_is_denied_unless_allowed_tools_names_it(workspace: Path) -> None:
    denied = await ask(workspace, "Bash", {"command": "ls"})
    assert isinstance(denied, PermissionResultDeny)
    assert "allowed_tools" in denied.message
    allowed = await ask(workspace, "Bash", {"command": "ls"}, allowed_tools=["Bash"])
    assert isinstance(allowed, PermissionResultAllow)


async def test_allowed_tools_lets_a_file_tool_outside_the_workspace(workspace: Path) -> None:
    result = await ask(workspace, "Read", {"file_path": "/etc/hosts"}, allowed_tools=["Read"])
    assert isinstance(result, PermissionResultAllow)


# to_events


def test_user_message_with_string_content_is_the_prompt() -> None:
    message = UserMessage(content="fix the bug", uuid="u-1")
    assert to_events(message, prompt_seen=False) == [PromptEvent("u-1", "fix the bug")]


def test_user_message_with_text_blocks_is_the_prompt_text_joined() -> None:
    message = UserMessage(content=[TextBlock("one"), TextBlock("two")], uuid="u-1")
    assert to_events(message, prompt_seen=False) == [PromptEvent("u-1", "one\ntwo")]


def test_user_message_with_tool_results_is_one_event_per_block() -> None:
    message = UserMessage(
        content=[
            ToolResultBlock("toolu_1", "file written", None),
            ToolResultBlock("toolu_2", [{"type": "text", "text": "no such file"}], True),
        ],
        uuid="u-2",
        parent_tool_use_id="toolu_agent",
    )
    assert to_events(message, prompt_seen=True) == [
        ToolResultEvent("u-2", "toolu_1", "file written", False, "toolu_agent"),
        ToolResultEvent("u-2", "toolu_2", "no such file", True, "toolu_agent"),
    ]


def test_tool_results_are_never_prompts_even_before_the_prompt() -> None:
    message = UserMessage(content=[ToolResultBlock("toolu_1", "ok", False)], uuid="u-2")
    events = to_events(message, prompt_seen=False)
    assert [type(e) for e in events] == [ToolResultEvent]


def test_injected_user_message_after_the_prompt_is_dropped() -> None:
    message = UserMessage(content="<task-notification>done</task-notification>", uuid="u-3")
    assert to_events(message, prompt_seen=True) == []


def test_user_message_with_an_origin_is_not_the_prompt() -> None:
    message = UserMessage(content="scheduled", uuid="u-4", origin={"kind": "task-notification"})
    assert to_events(message, prompt_seen=False) == []


def test_subagent_prompt_is_a_prompt_event_with_its_parent() -> None:
    message = UserMessage(content="search the repo", uuid="u-5", parent_tool_use_id="toolu_agent")
    assert to_events(message, prompt_seen=True) == [PromptEvent("u-5", "search the repo", "toolu_agent")]


def test_assistant_message_joins_text_and_lists_tool_calls() -> None:
    message = AssistantMessage(
        content=[
            TextBlock("I will write it."),
            ThinkingBlock("hmm", "sig"),
            ToolUseBlock("toolu_1", "Write", {"file_path": "a.txt", "content": "x"}),
            TextBlock("Done."),
        ],
        model="claude-test",
        message_id="msg_01",
        uuid="a-1",
    )
    assert to_events(message, prompt_seen=True) == [
        AssistantEvent(
            message_id="a-1",
            api_message_id="msg_01",
            text="I will write it.\nDone.",
            tool_calls=(ToolCall("toolu_1", "Write", {"file_path": "a.txt", "content": "x"}),),
            model="claude-test",
            parent_tool_use_id="",
        )
    ]


def test_subagent_assistant_message_keeps_its_parent() -> None:
    message = AssistantMessage(content=[TextBlock("found")], model="m", parent_tool_use_id="toolu_agent")
    (event,) = to_events(message, prompt_seen=True)
    assert isinstance(event, AssistantEvent)
    assert event.parent_tool_use_id == "toolu_agent"
    assert event.message_id == "" and event.api_message_id == ""


def test_result_message_is_the_result_event() -> None:
    message = ResultMessage(
        subtype="success",
        duration_ms=1200,
        duration_api_ms=900,
        is_error=False,
        num_turns=2,
        session_id=SID,
        stop_reason="end_turn",
        total_cost_usd=0.25,
        result="all done",
    )
    assert to_events(message, prompt_seen=True) == [
        ResultEvent("success", False, 2, 1200, 0.25, "all done", "end_turn")
    ]


def test_result_message_without_cost_or_text() -> None:
    message = ResultMessage(
        subtype="error_during_execution",
        duration_ms=5,
        duration_api_ms=0,
        is_error=True,
        num_turns=0,
        session_id=SID,
    )
    (event,) = to_events(message, prompt_seen=True)
    assert event == ResultEvent("error_during_execution", True, 0, 5, 0.0, "", "")


def test_system_messages_carry_no_events() -> None:
    assert to_events(SystemMessage(subtype="init", data={}), prompt_seen=False) == []


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"allowed_tools": 5}, "options.allowed_tools"),
        ({"allowed_tools": "Bash"}, "options.allowed_tools"),
        ({"disallowed_tools": ["Bash", 3]}, "options.disallowed_tools"),
        ({"model": 7}, "options.model"),
        ({"permission_mode": "yolo"}, "options.permission_mode"),
        ({"system_prompt": 12}, "options.system_prompt"),
        ({"mcp_servers": ["x"]}, "options.mcp_servers"),
        ({"max_budget_usd": "lots"}, "options.max_budget_usd"),
        ({"permission_prompt_tool_name": "stdio"}, "options.permission_prompt_tool_name"),
    ],
)
def test_ill_shaped_option_values_are_refused_naming_the_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        validate_options(options)
    assert caught.value.field == field


def test_well_shaped_option_values_pass() -> None:
    validate_options(
        {
            "allowed_tools": ["Bash", "WebFetch"],
            "model": "claude-sonnet-4-5",
            "permission_mode": "acceptEdits",
            "system_prompt": {"type": "preset", "preset": "claude_code"},
            "mcp_servers": {},
            "max_budget_usd": 2.5,
            "max_turns": 5.0,
        }
    )
