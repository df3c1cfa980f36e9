"""The SDK adapter without a CLI: ClaudeAgentOptions building, the mapping of SDK messages to turn
events, and how a turn's stream is cut out of the CLI's messages.

Option validation is tested in test_options.py and the tool policy in test_policy.py; here only
how the adapter hands the policy to the CLI.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from claude_agent_sdk import (
    AgentDefinition,
    AssistantMessage,
    ClaudeSDKError,
    HookMatcher,
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

from agent_rewind.sessions.adapter import (
    AgentError,
    ClientSpec,
    SdkAgentClient,
    build_options,
    cli_binary,
    to_events,
)
from agent_rewind.sessions.policy import FILE_TOOLS, ToolPolicy
from agent_rewind.sessions.turn_events import (
    AssistantEvent,
    ConversationAnswer,
    FilesAnswer,
    PromptEvent,
    ResultEvent,
    ToolCall,
    ToolResultEvent,
    TurnEvent,
)

SID = "0b7f3c1e-5a8d-4d6e-9f10-2a3b4c5d6e7f"
PROMPT = "5d0c7a52-3f41-4c2e-9b9e-7c1f0e4d2a11"
OTHER = "9a4e1b77-2c3d-4e5f-8a9b-0c1d2e3f4a5b"


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


def built(cwd: Path, allowed_tools: tuple[str, ...] = (), **changes: Any) -> Any:
    return build_options(spec(cwd, **changes), ToolPolicy(cwd, allowed_tools))


# build_options


def test_build_options_passes_the_checked_options_through(workspace: Path) -> None:
    options = {
        "model": "claude-test",
        "system_prompt": {"type": "preset", "preset": "claude_code", "append": "be brief"},
        "allowed_tools": ["Read", "Bash"],
        "max_turns": 5,
        "permission_mode": "acceptEdits",
    }
    out = built(workspace, options=options)
    assert out.model == "claude-test"
    assert out.system_prompt == {"type": "preset", "preset": "claude_code", "append": "be brief"}
    assert out.allowed_tools == ["Read", "Bash"]
    assert out.max_turns == 5
    assert out.permission_mode == "acceptEdits"
    assert out.cwd == str(workspace)
    assert out.env == {"CLAUDE_CONFIG_DIR": "/state/claude"}


def test_build_options_runs_the_bundled_cli(workspace: Path) -> None:
    out = built(workspace)
    assert out.cli_path == str(cli_binary())
    assert cli_binary().parts[-2:] == ("_bundled", "claude")


def test_build_options_defaults_permission_mode_to_default(workspace: Path) -> None:
    assert built(workspace).permission_mode == "default"


def test_nothing_on_disk_configures_the_cli(workspace: Path) -> None:
    out = built(workspace)
    assert out.setting_sources == []
    assert out.strict_mcp_config is True
    assert out.plugins == []


def test_project_settings_only_with_the_operator_opt_in(workspace: Path) -> None:
    assert built(workspace, project_settings=True).setting_sources == ["project", "local"]
    assert built(workspace, project_settings=False).setting_sources == []


def test_build_options_does_not_change_the_stored_options(workspace: Path) -> None:
    options = {"agents": {"r": {"description": "d", "prompt": "p"}}, "model": "m"}
    built(workspace, options=options)
    assert options == {"agents": {"r": {"description": "d", "prompt": "p"}}, "model": "m"}


def test_agents_become_agent_definitions(workspace: Path) -> None:
    options = {
        "agents": {
            "reviewer": {"description": "reviews", "prompt": "review it", "tools": ["Read"], "maxTurns": 3},
            "writer": {"description": "writes", "prompt": "write it"},
        }
    }
    out = built(workspace, options=options)
    assert out.agents == {
        "reviewer": AgentDefinition(description="reviews", prompt="review it", tools=["Read"], maxTurns=3),
        "writer": AgentDefinition(description="writes", prompt="write it"),
    }


def test_a_fresh_start_sets_the_session_id_not_resume(workspace: Path) -> None:
    out = built(workspace, resume=False, resume_session_at="a-1")
    assert out.session_id == SID
    assert out.resume is None
    # A cut only makes sense when resuming a transcript.
    assert out.resume_session_at is None


def test_a_resume_sets_resume_and_the_entry_it_ends_at(workspace: Path) -> None:
    out = built(workspace, resume=True, resume_session_at="a-1")
    assert out.resume == SID
    assert out.resume_session_at == "a-1"
    assert out.session_id is None


def test_a_resume_without_an_entry(workspace: Path) -> None:
    out = built(workspace, resume=True)
    assert out.resume == SID
    assert out.resume_session_at is None


def test_build_options_asks_the_cli_to_replay_user_messages(workspace: Path) -> None:
    assert built(workspace).extra_args == {"replay-user-messages": None}


@pytest.mark.parametrize("checkpointing", [True, False])
def test_file_checkpointing_follows_the_spec(workspace: Path, checkpointing: bool) -> None:
    assert built(workspace, checkpointing=checkpointing).enable_file_checkpointing is checkpointing


def test_the_stderr_callback_is_passed(workspace: Path) -> None:
    def on_stderr(line: str) -> None:
        pass

    assert built(workspace, stderr=on_stderr).stderr is on_stderr
    assert built(workspace).stderr is None


# The policy, as the CLI is given it


async def ask(out: Any, tool: str, tool_input: dict[str, Any]) -> Any:
    assert out.can_use_tool is not None
    return await out.can_use_tool(tool, tool_input, ToolPermissionContext(tool_use_id="toolu_1"))


async def test_can_use_tool_maps_the_policy(workspace: Path) -> None:
    out = built(workspace)
    assert isinstance(await ask(out, "Write", {"file_path": "notes.txt"}), PermissionResultAllow)
    outside = await ask(out, "Write", {"file_path": "/etc/passwd"})
    assert isinstance(outside, PermissionResultDeny)
    assert "outside" in outside.message
    bash = await ask(out, "Bash", {"command": "ls"})
    assert isinstance(bash, PermissionResultDeny)
    assert "allowed_tools" in bash.message
    assert isinstance(
        await ask(built(workspace, ("Bash",)), "Bash", {"command": "ls"}), PermissionResultAllow
    )


def _hook(out: Any) -> Any:
    [matcher] = out.hooks["PreToolUse"]
    assert isinstance(matcher, HookMatcher)
    [callback] = matcher.hooks
    return matcher, callback


def test_a_pre_tool_use_hook_guards_the_file_tools_and_blocks_on_failure(workspace: Path) -> None:
    out = built(workspace)
    assert set(out.hooks) == {"PreToolUse"}
    matcher, _ = _hook(out)
    assert set(matcher.matcher.split("|")) == FILE_TOOLS
    assert matcher.on_failure == "block"


async def test_the_hook_denies_an_outside_path_and_allows_an_inside_one(workspace: Path) -> None:
    # Read is in allowed_tools, so the CLI never asks can_use_tool: the hook is the guard.
    _, confine = _hook(built(workspace, ("Read",)))
    context = {"signal": None}
    denied = await confine(
        {"hook_event_name": "PreToolUse", "tool_name": "Read", "tool_input": {"file_path": "/etc/passwd"}},
        "toolu_1",
        context,
    )
    output = denied["hookSpecificOutput"]
    assert output["hookEventName"] == "PreToolUse"
    assert output["permissionDecision"] == "deny"
    assert "outside" in output["permissionDecisionReason"]
    allowed = await confine(
        {"hook_event_name": "PreToolUse", "tool_name": "Read", "tool_input": {"file_path": "notes.txt"}},
        "toolu_2",
        context,
    )
    assert allowed == {}
    # A malformed input is judged as no path: the workspace itself.
    assert await confine({"tool_name": "LS", "tool_input": None}, None, context) == {}


# to_events


def test_the_prompt_with_the_turns_id_is_the_prompt_event() -> None:
    message = UserMessage(content="fix the bug", uuid=PROMPT)
    assert to_events(message, PROMPT) == [PromptEvent(PROMPT, "fix the bug")]


def test_prompt_text_blocks_are_joined() -> None:
    message = UserMessage(content=[TextBlock("one"), TextBlock("two")], uuid=PROMPT)
    assert to_events(message, PROMPT) == [PromptEvent(PROMPT, "one\ntwo")]
    dicts = UserMessage(content=[{"type": "text", "text": "a"}, {"type": "image"}], uuid=PROMPT)
    assert to_events(dicts, PROMPT) == [PromptEvent(PROMPT, "a")]


def test_a_user_message_with_another_id_is_not_the_prompt() -> None:
    """Synthetic or injected user messages ("[Request interrupted by user]", a task
    notification) are not the turn's prompt."""
    assert to_events(UserMessage(content="<task-notification>", uuid=OTHER), PROMPT) == []
    assert to_events(UserMessage(content="no uuid"), PROMPT) == []


def test_tool_results_are_one_event_per_block() -> None:
    message = UserMessage(
        content=[
            ToolResultBlock("toolu_1", "file written", None),
            ToolResultBlock("toolu_2", [{"type": "text", "text": "no such file"}], True),
        ],
        uuid="u-2",
        parent_tool_use_id="toolu_agent",
    )
    assert to_events(message, PROMPT) == [
        ToolResultEvent("u-2", "toolu_1", "file written", False, "toolu_agent"),
        ToolResultEvent("u-2", "toolu_2", "no such file", True, "toolu_agent"),
    ]


def test_tool_results_are_never_prompts_even_with_the_prompts_id() -> None:
    message = UserMessage(content=[ToolResultBlock("toolu_1", "ok", False)], uuid=PROMPT)
    assert [type(e) for e in to_events(message, PROMPT)] == [ToolResultEvent]


def test_a_subagent_prompt_is_a_prompt_event_with_its_parent() -> None:
    message = UserMessage(content="search the repo", uuid="u-5", parent_tool_use_id="toolu_agent")
    assert to_events(message, PROMPT) == [PromptEvent("u-5", "search the repo", "toolu_agent")]


def test_an_assistant_message_joins_text_and_lists_tool_calls() -> None:
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
    assert to_events(message, PROMPT) == [
        AssistantEvent(
            message_id="a-1",
            api_message_id="msg_01",
            text="I will write it.\nDone.",
            tool_calls=(ToolCall("toolu_1", "Write", {"file_path": "a.txt", "content": "x"}),),
            model="claude-test",
            parent_tool_use_id="",
        )
    ]


def test_a_subagent_assistant_message_keeps_its_parent() -> None:
    message = AssistantMessage(content=[TextBlock("found")], model="m", parent_tool_use_id="toolu_agent")
    (event,) = to_events(message, PROMPT)
    assert isinstance(event, AssistantEvent)
    assert event.parent_tool_use_id == "toolu_agent"
    assert event.message_id == "" and event.api_message_id == ""


def result(prompt: str | None = PROMPT, prompts: list[str] | None = None, **changes: Any) -> ResultMessage:
    values: dict[str, Any] = {
        "subtype": "success",
        "duration_ms": 1200,
        "duration_api_ms": 900,
        "is_error": False,
        "num_turns": 2,
        "session_id": SID,
        "stop_reason": "end_turn",
        "total_cost_usd": 0.25,
        "result": "all done",
        "user_message_uuid": prompt,
        "user_message_uuids": prompts,
    }
    values.update(changes)
    return ResultMessage(**values)


def test_a_result_message_is_the_result_event() -> None:
    assert to_events(result(), PROMPT) == [
        ResultEvent("success", False, 2, 1200, 0.25, "all done", "end_turn")
    ]


def test_a_result_message_without_cost_or_text() -> None:
    message = result(
        subtype="error_during_execution",
        is_error=True,
        num_turns=0,
        duration_ms=5,
        total_cost_usd=None,
        result=None,
    )
    message.stop_reason = None
    assert to_events(message, PROMPT) == [ResultEvent("error_during_execution", True, 0, 5, 0.0, "", "")]


def test_system_messages_carry_no_events() -> None:
    assert to_events(SystemMessage(subtype="init", data={}), PROMPT) == []


# receive_turn: a turn's events out of the CLI's message stream


class FakeSdk:
    """Stands in for ClaudeSDKClient: a live process and a scripted message stream."""

    def __init__(self, messages: list[Any], error: Exception | None = None) -> None:
        self.messages = messages
        self.error = error
        self.read = 0  # how many messages the adapter took
        self.queries: list[list[dict[str, Any]]] = []
        self.controls: list[dict[str, Any]] = []
        self.control_answer: dict[str, Any] | Exception = {}
        self._transport = SimpleNamespace(
            _process=SimpleNamespace(pid=4242, returncode=None, kill=self._kill)
        )
        self._query = SimpleNamespace(_send_control_request=self._control)
        self.killed = False

    def _kill(self) -> None:
        self.killed = True
        self._transport._process.returncode = -9

    async def receive_messages(self) -> AsyncIterator[Any]:
        for message in self.messages:
            self.read += 1
            yield message
        if self.error is not None:
            raise self.error

    async def query(self, stream: AsyncIterator[dict[str, Any]]) -> None:
        self.queries.append([m async for m in stream])

    async def _control(self, request: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        self.controls.append(request)
        if isinstance(self.control_answer, Exception):
            raise self.control_answer
        return self.control_answer


def sdk_client(workspace: Path, fake: FakeSdk) -> SdkAgentClient:
    client = SdkAgentClient(spec(workspace), ToolPolicy(workspace, ()))
    client._client = fake  # type: ignore[assignment]
    return client


async def turn(client: SdkAgentClient, prompt_id: str = PROMPT) -> list[TurnEvent]:
    return [e async for e in client.receive_turn(prompt_id)]


def assistant(uid: str, text: str) -> AssistantMessage:
    return AssistantMessage(content=[TextBlock(text)], model="m", message_id=f"msg_{uid}", uuid=uid)


async def test_a_turn_runs_from_the_prompts_echo_to_the_result_that_names_it(workspace: Path) -> None:
    fake = FakeSdk(
        [
            SystemMessage(subtype="init", data={}),
            UserMessage(content="fix it", uuid=PROMPT),
            assistant("a-1", "on it"),
            UserMessage(content=[ToolResultBlock("toolu_1", "ok", False)], uuid="u-2"),
            UserMessage(content="[Request interrupted by user]", uuid=OTHER),
            result(),
            assistant("a-next", "belongs to the next turn"),
        ]
    )
    events = await turn(sdk_client(workspace, fake))
    assert events == [
        PromptEvent(PROMPT, "fix it"),
        AssistantEvent("a-1", "msg_a-1", "on it", (), "m", ""),
        ToolResultEvent("u-2", "toolu_1", "ok", False, ""),
        ResultEvent("success", False, 2, 1200, 0.25, "all done", "end_turn"),
    ]
    assert fake.read == 6, "nothing after the turn's result is consumed"


async def test_what_streams_before_the_echo_and_another_turns_result_are_skipped(workspace: Path) -> None:
    """A background task's notification turn can still be running when the prompt is sent."""
    fake = FakeSdk(
        [
            UserMessage(content="<task-notification>", uuid=OTHER),
            assistant("a-bg", "the task finished"),
            result(prompt=OTHER, result="background"),
            UserMessage(content="fix it", uuid=PROMPT),
            result(prompt=OTHER, result="late background result"),
            assistant("a-1", "on it"),
            result(result="mine"),
        ]
    )
    events = await turn(sdk_client(workspace, fake))
    assert [type(e) for e in events] == [PromptEvent, AssistantEvent, ResultEvent]
    assert events[1] == AssistantEvent("a-1", "msg_a-1", "on it", (), "m", "")
    final = events[-1]
    assert isinstance(final, ResultEvent) and final.result == "mine"


async def test_a_result_names_the_prompt_among_the_messages_it_took_in(workspace: Path) -> None:
    """A prompt sent while an injected turn runs is answered inside it: the result's own uuid is
    the other message, and the prompt is in user_message_uuids."""
    fake = FakeSdk(
        [
            UserMessage(content="fix it", uuid=PROMPT),
            result(prompt=OTHER, prompts=[OTHER, PROMPT], result="merged"),
            assistant("a-after", "not read"),
        ]
    )
    events = await turn(sdk_client(workspace, fake))
    assert [type(e) for e in events] == [PromptEvent, ResultEvent]
    assert fake.read == 2


async def test_a_result_without_an_echo_ends_the_turn(workspace: Path) -> None:
    """A slash command's answer comes without an echo of the prompt."""
    fake = FakeSdk([assistant("a-x", "compacted"), result(result="Compacted")])
    events = await turn(sdk_client(workspace, fake))
    assert events == [ResultEvent("success", False, 2, 1200, 0.25, "Compacted", "end_turn")]


async def test_a_stream_that_ends_before_the_result_is_an_agent_error(workspace: Path) -> None:
    fake = FakeSdk([UserMessage(content="fix it", uuid=PROMPT), assistant("a-1", "on it")])
    with pytest.raises(AgentError, match="exited during the turn"):
        await turn(sdk_client(workspace, fake))


async def test_an_sdk_error_during_the_turn_is_an_agent_error(workspace: Path) -> None:
    fake = FakeSdk([UserMessage(content="fix it", uuid=PROMPT)], error=ClaudeSDKError("pipe closed"))
    with pytest.raises(AgentError, match="pipe closed"):
        await turn(sdk_client(workspace, fake))


# The rest of the client, over the same fake


async def test_send_prompt_gives_the_prompt_the_services_id(workspace: Path) -> None:
    fake = FakeSdk([])
    client = sdk_client(workspace, fake)
    assert client.alive and client.pid == 4242
    await client.send_prompt("fix it", PROMPT)
    assert fake.queries == [
        [
            {
                "type": "user",
                "uuid": PROMPT,
                "message": {"role": "user", "content": "fix it"},
                "parent_tool_use_id": None,
            }
        ]
    ]


async def test_send_prompt_to_a_process_that_exited_is_an_agent_error(workspace: Path) -> None:
    fake = FakeSdk([])
    fake._transport._process.returncode = 1
    client = sdk_client(workspace, fake)
    assert not client.alive
    with pytest.raises(AgentError):
        await client.send_prompt("fix it", PROMPT)
    assert fake.queries == []


async def test_kill_ends_the_process_and_the_client(workspace: Path) -> None:
    fake = FakeSdk([])
    client = sdk_client(workspace, fake)
    await client.kill()
    assert fake.killed
    assert not client.alive


async def test_rewind_files_returns_the_clis_whole_answer(workspace: Path) -> None:
    fake = FakeSdk([])
    fake.control_answer = {
        "canRewind": True,
        "filesChanged": ["a.txt", "b.txt"],
        "insertions": 3,
        "deletions": 1,
        "skippedLinks": 2,
    }
    client = sdk_client(workspace, fake)
    answer = await client.rewind_files(PROMPT, dry_run=True)
    assert answer == FilesAnswer(True, ("a.txt", "b.txt"), 3, 1, 2, "")
    assert fake.controls == [{"subtype": "rewind_files", "user_message_id": PROMPT, "dry_run": True}]
    await client.rewind_files(PROMPT, dry_run=False)
    assert fake.controls[-1] == {"subtype": "rewind_files", "user_message_id": PROMPT}


async def test_rewind_files_refusals_and_failures(workspace: Path) -> None:
    fake = FakeSdk([])
    client = sdk_client(workspace, fake)
    fake.control_answer = {"canRewind": False, "error": "No file checkpoint found for this message"}
    assert await client.rewind_files(PROMPT, dry_run=True) == FilesAnswer(
        False, error="No file checkpoint found for this message"
    )
    # Some CLI versions answer the refusal as a control error.
    fake.control_answer = Exception("No file checkpoint found for this message")
    refused = await client.rewind_files(PROMPT, dry_run=True)
    assert not refused.can_rewind and "checkpoint" in refused.error
    # A timeout or any other failure is the process failing: retryable, never a refusal.
    for failure in ("Control request timeout: rewind_files", "checkpoint write timeout", "broken pipe"):
        fake.control_answer = Exception(failure)
        with pytest.raises(AgentError):
            await client.rewind_files(PROMPT, dry_run=False)


async def test_rewind_conversation_maps_the_clis_answer(workspace: Path) -> None:
    fake = FakeSdk([])
    client = sdk_client(workspace, fake)
    fake.control_answer = {"rewound": True, "targetMessageUuid": PROMPT}
    assert await client.rewind_conversation(PROMPT, OTHER) == ConversationAnswer(True)
    assert fake.controls == [
        {
            "subtype": "rewind_conversation",
            "target_message_uuid": PROMPT,
            "last_seen_user_message_uuid": OTHER,
        }
    ]
    fake.control_answer = {"rewound": True, "targetMessageUuid": OTHER}
    assert not (await client.rewind_conversation(PROMPT, OTHER)).rewound
    fake.control_answer = {"rewound": False, "reason": "stale_target", "error": "newer prompt"}
    assert await client.rewind_conversation(PROMPT, OTHER) == ConversationAnswer(
        False, "stale_target", "newer prompt"
    )
    fake.control_answer = Exception("unknown subtype")
    with pytest.raises(AgentError):
        await client.rewind_conversation(PROMPT, OTHER)


async def test_control_requests_need_a_live_process(workspace: Path) -> None:
    fake = FakeSdk([])
    fake._transport._process.returncode = 0
    client = sdk_client(workspace, fake)
    with pytest.raises(AgentError):
        await client.rewind_files(PROMPT, dry_run=True)
    with pytest.raises(AgentError):
        await client.rewind_conversation(PROMPT, OTHER)
    assert fake.controls == []
