"""The one module that talks to claude_agent_sdk.

Everything the service needs from the SDK goes through `AgentClient`: start a CLI
process for a session, send a prompt, stream the turn, interrupt, rewind files (with
the CLI's full answer, which the public SDK method drops), close. Uses of SDK
internals are marked INTERNAL and covered by integration tests against the real CLI,
so an SDK upgrade that breaks them fails loudly. The SDK version is pinned in
pyproject.toml.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import warnings
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, get_args

import claude_agent_sdk
from claude_agent_sdk import (
    AssistantMessage,
    CanUseToolShadowedWarning,
    ClaudeAgentOptions,
    ClaudeSDKClient,
    ClaudeSDKError,
    PermissionMode,
    PermissionResultAllow,
    PermissionResultDeny,
    ResultMessage,
    TextBlock,
    ToolPermissionContext,
    ToolResultBlock,
    ToolUseBlock,
    UserMessage,
)

from agent_rewind.errors import InvalidArgument
from agent_rewind.sessions.events import (
    AssistantEvent,
    ConversationAnswer,
    FilesAnswer,
    PromptEvent,
    ResultEvent,
    ToolCall,
    ToolResultEvent,
    TurnEvent,
)

# Options the service sets itself; a caller cannot override them through `options`.
SERVICE_CONTROLLED = frozenset(
    {
        "cwd",
        "resume",
        "session_id",
        "continue_conversation",
        "fork_session",
        "resume_session_at",
        "resume_drops_turn",
        "enable_file_checkpointing",
        "extra_args",
        "env",
        "can_use_tool",
        "hooks",
        "stderr",
        "debug_stderr",
        "cli_path",
        "session_store",
        "session_store_flush",
        "transport",
        # Exclusive with the can_use_tool policy the service installs.
        "permission_prompt_tool_name",
    }
)
# Tools named in allowed_tools bypassing can_use_tool is exactly the policy we want.
warnings.filterwarnings("ignore", category=CanUseToolShadowedWarning)

_OPTION_FIELDS = {f.name: f for f in dataclasses.fields(ClaudeAgentOptions)}
_INT_OPTIONS = frozenset({"max_turns", "max_thinking_tokens", "max_buffer_size"})
# "default" makes the CLI ask `can_use_tool` about every tool that is not allowed outright.
_DEFAULT_PERMISSION_MODE = "default"


class AgentError(Exception):
    """The CLI process could not be started, or failed while in use."""


def sdk_version() -> str:
    return str(claude_agent_sdk.__version__)


def cli_binary() -> Path:
    """The Claude Code CLI the pinned SDK bundles: the only one the service runs."""
    return Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"


def cli_version() -> str:
    from claude_agent_sdk._cli_version import __cli_version__  # INTERNAL: the bundled CLI's version

    return str(__cli_version__)


# The shapes a JSON value must have for the options most used; the SDK's dataclass checks none.
_STRING_LIST_OPTIONS = frozenset(
    {"allowed_tools", "disallowed_tools", "add_dirs", "betas", "setting_sources"}
)
_STRING_OPTIONS = frozenset({"model", "fallback_model", "user", "settings"})
_NUMBER_OPTIONS = frozenset({"max_budget_usd"})
_PERMISSION_MODES = frozenset(get_args(PermissionMode))


def validate_options(options: Mapping[str, Any]) -> None:
    """Refuses option names the SDK does not know or the service controls, and ill-shaped values."""
    for key, value in options.items():
        field = f"options.{key}"
        if key in SERVICE_CONTROLLED:
            raise InvalidArgument(field, "is set by the service and cannot be given")
        if key not in _OPTION_FIELDS:
            raise InvalidArgument(field, "is not a ClaudeAgentOptions field of this SDK")
        if value is None:
            continue
        if key in _INT_OPTIONS and (not isinstance(value, int | float) or int(value) != value):
            raise InvalidArgument(field, "must be an integer")
        if key in _STRING_LIST_OPTIONS and (
            not isinstance(value, list) or not all(isinstance(v, str) for v in value)
        ):
            raise InvalidArgument(field, "must be a list of strings")
        if key in _STRING_OPTIONS and not isinstance(value, str):
            raise InvalidArgument(field, "must be a string")
        if key in _NUMBER_OPTIONS and not isinstance(value, int | float):
            raise InvalidArgument(field, "must be a number")
        if key == "permission_mode" and value not in _PERMISSION_MODES:
            raise InvalidArgument(field, f"must be one of {sorted(_PERMISSION_MODES)}")
        if key == "system_prompt" and not isinstance(value, str | dict):
            raise InvalidArgument(field, "must be a string or a preset object")
        if key in ("mcp_servers", "agents", "sandbox", "thinking") and not isinstance(value, dict):
            raise InvalidArgument(field, "must be an object")


@dataclass(frozen=True)
class ClientSpec:
    """Everything needed to start the CLI for one session. Rebuilt verbatim each time."""

    session_id: str
    cwd: Path
    options: Mapping[str, Any]
    checkpointing: bool
    env: Mapping[str, str]
    # Resume the session's transcript (False only for a session's very first start).
    resume: bool
    resume_session_at: str | None = None
    resume_drops_turn: str | None = None
    stderr: Callable[[str], None] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


# File tools a session may use inside its workspace without naming them in allowed_tools.
_WORKSPACE_FILE_TOOLS = frozenset(
    {"Read", "Write", "Edit", "MultiEdit", "NotebookEdit", "Glob", "Grep", "LS"}
)
_PATH_KEYS = ("file_path", "notebook_path", "path")


def _resolve_in(workspace: Path, path: str) -> Path:
    """Where a tool's path argument points, following `..`, `~` and symlinks."""
    return (workspace / Path(path).expanduser()).resolve()


def _permission_policy(allowed: frozenset[str], workspace: Path) -> Any:
    """Nobody sits at a terminal to approve tools, so the session's options decide.

    File tools are accepted for paths inside the workspace; any other tool runs only when the
    session's allowed_tools names it (the CLI itself lets those through without asking).
    """

    async def can_use_tool(
        tool_name: str, tool_input: dict[str, Any], context: ToolPermissionContext
    ) -> PermissionResultAllow | PermissionResultDeny:
        if tool_name in allowed:
            return PermissionResultAllow()
        if tool_name in _WORKSPACE_FILE_TOOLS:
            paths = [tool_input[k] for k in _PATH_KEYS if isinstance(tool_input.get(k), str)]
            pattern = tool_input.get("pattern")
            if tool_name == "Glob" and isinstance(pattern, str) and pattern.startswith(("/", "~", "..")):
                paths.append(pattern.split("*", 1)[0] or "/")
            targets = [_resolve_in(workspace, p) for p in paths] or [workspace]
            if all(t == workspace or t.is_relative_to(workspace) for t in targets):
                return PermissionResultAllow()
            return PermissionResultDeny(message=f"{tool_name} outside the session's workspace is not allowed")
        return PermissionResultDeny(
            message=f"{tool_name} is not in this session's allowed_tools; create the session with it to use it"
        )

    return can_use_tool


def build_options(spec: ClientSpec) -> ClaudeAgentOptions:
    kwargs: dict[str, Any] = {}
    for key, value in spec.options.items():
        kwargs[key] = int(value) if key in _INT_OPTIONS and value is not None else value
    kwargs.setdefault("permission_mode", _DEFAULT_PERMISSION_MODE)
    allowed = frozenset(str(t) for t in kwargs.get("allowed_tools") or ())
    kwargs.update(
        cli_path=str(cli_binary()),
        cwd=str(spec.cwd),
        enable_file_checkpointing=spec.checkpointing,
        # Replayed user messages carry the prompt's transcript uuid: the rewind point id.
        extra_args={"replay-user-messages": None},
        env=dict(spec.env),
        can_use_tool=_permission_policy(allowed, spec.cwd.resolve()),
    )
    if spec.resume:
        kwargs["resume"] = spec.session_id
        if spec.resume_session_at:
            kwargs["resume_session_at"] = spec.resume_session_at
        if spec.resume_drops_turn:
            kwargs["resume_drops_turn"] = spec.resume_drops_turn
    else:
        kwargs["session_id"] = spec.session_id
    if spec.stderr is not None:
        kwargs["stderr"] = spec.stderr
    return ClaudeAgentOptions(**kwargs)


class AgentClient(Protocol):
    """One live CLI process for one session."""

    @property
    def alive(self) -> bool: ...

    @property
    def pid(self) -> int | None: ...

    async def start(self) -> None: ...

    async def send_prompt(self, text: str) -> None: ...

    def receive_turn(self) -> AsyncIterator[TurnEvent]: ...

    async def interrupt(self) -> None: ...

    async def rewind_files(self, message_id: str, *, dry_run: bool) -> FilesAnswer: ...

    async def rewind_conversation(self, target: str, newest_prompt: str) -> ConversationAnswer: ...

    async def close(self) -> None: ...


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            str(b.get("text", "")) if isinstance(b, dict) else str(getattr(b, "text", ""))
            for b in content
            if (isinstance(b, dict) and b.get("type") == "text") or isinstance(b, TextBlock)
        ]
        return "\n".join(parts)
    return "" if content is None else str(content)


def to_events(message: Any, *, prompt_seen: bool) -> list[TurnEvent]:
    """Maps one SDK message to the turn events it carries (system frames carry none)."""
    if isinstance(message, UserMessage):
        parent = message.parent_tool_use_id or ""
        uid = message.uuid or ""
        if isinstance(message.content, list) and any(isinstance(b, ToolResultBlock) for b in message.content):
            return [
                ToolResultEvent(uid, b.tool_use_id, _text_of(b.content), bool(b.is_error), parent)
                for b in message.content
                if isinstance(b, ToolResultBlock)
            ]
        if parent or (not prompt_seen and message.origin is None):
            return [PromptEvent(uid, _text_of(message.content), parent)]
        return []  # synthetic or injected user messages are not prompts
    if isinstance(message, AssistantMessage):
        return [
            AssistantEvent(
                message_id=message.uuid or "",
                api_message_id=message.message_id or "",
                text="\n".join(b.text for b in message.content if isinstance(b, TextBlock)),
                tool_calls=tuple(
                    ToolCall(b.id, b.name, dict(b.input))
                    for b in message.content
                    if isinstance(b, ToolUseBlock)
                ),
                model=message.model or "",
                parent_tool_use_id=message.parent_tool_use_id or "",
            )
        ]
    if isinstance(message, ResultMessage):
        return [
            ResultEvent(
                subtype=message.subtype,
                is_error=message.is_error,
                num_turns=message.num_turns,
                duration_ms=message.duration_ms,
                total_cost_usd=message.total_cost_usd or 0.0,
                result=message.result or "",
                stop_reason=message.stop_reason or "",
            )
        ]
    return []


class SdkAgentClient:
    """`AgentClient` over `ClaudeSDKClient`.

    The SDK client enters an anyio task group at connect and must leave it from the same
    task, so a small host task owns connect and disconnect; prompts, reads and control
    requests may come from any task.
    """

    def __init__(
        self, spec: ClientSpec, *, connect_timeout: float = 60.0, close_timeout: float = 10.0
    ) -> None:
        self._spec = spec
        self._client = ClaudeSDKClient(build_options(spec))
        self._connect_timeout = connect_timeout
        self._close_timeout = close_timeout
        self._host: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._closed = False

    @property
    def pid(self) -> int | None:
        process = self._process()
        return None if process is None else int(process.pid)

    @property
    def alive(self) -> bool:
        process = self._process()
        return not self._closed and process is not None and process.returncode is None

    def _process(self) -> Any:
        transport = getattr(self._client, "_transport", None)  # INTERNAL: the subprocess transport
        return getattr(transport, "_process", None)

    async def start(self) -> None:
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def host() -> None:
            try:
                await self._client.connect()
            except BaseException as err:
                if not ready.done():
                    ready.set_exception(AgentError(f"the Claude Code CLI did not start: {err}"))
                return
            ready.set_result(None)
            try:
                await self._stop.wait()
            finally:
                with contextlib.suppress(Exception):
                    await self._client.disconnect()

        self._host = asyncio.create_task(host(), name=f"claude-cli-{self._spec.session_id}")
        try:
            await asyncio.wait_for(asyncio.shield(ready), self._connect_timeout)
        except TimeoutError:
            await self.close()
            raise AgentError(f"the Claude Code CLI did not start within {self._connect_timeout}s") from None
        except (AgentError, asyncio.CancelledError):
            # A cancelled start (a shutdown, a caller gone) must not leave its process behind.
            await self.close()
            raise

    async def send_prompt(self, text: str) -> None:
        if not self.alive:
            raise AgentError("the Claude Code process is not running")
        try:
            await self._client.query(text)
        except (ClaudeSDKError, OSError) as err:
            raise AgentError(f"could not send the prompt: {err}") from err

    async def receive_turn(self) -> AsyncIterator[TurnEvent]:
        """The events of the turn just prompted, up to and including its result.

        A background task's notification turn can finish after the previous result; its
        stragglers arrive before this turn's prompt and are not this turn's, so they are skipped.
        """
        prompt_seen = False
        try:
            async for message in self._client.receive_messages():
                for event in to_events(message, prompt_seen=prompt_seen):
                    if isinstance(event, PromptEvent) and not event.parent_tool_use_id:
                        prompt_seen = True
                    if not prompt_seen:
                        continue
                    yield event
                    if isinstance(event, ResultEvent):
                        return
        except (ClaudeSDKError, OSError) as err:
            raise AgentError(f"the Claude Code process failed during the turn: {err}") from err
        raise AgentError("the Claude Code process exited during the turn")

    async def interrupt(self) -> None:
        try:
            await self._client.interrupt()
        except Exception as err:  # the SDK raises bare Exception on control errors
            raise AgentError(f"interrupt failed: {err}") from err

    async def rewind_files(self, message_id: str, *, dry_run: bool) -> FilesAnswer:
        """Sends the CLI's rewind_files control request and returns its whole answer.

        The public `ClaudeSDKClient.rewind_files` returns nothing and has no dry run.
        """
        request: dict[str, Any] = {"subtype": "rewind_files", "user_message_id": message_id}
        if dry_run:
            request["dry_run"] = True
        query = getattr(self._client, "_query", None)  # INTERNAL: the control-protocol object
        if query is None or not self.alive:
            raise AgentError("the Claude Code process is not running")
        try:
            answer = await query._send_control_request(request, timeout=30.0)  # INTERNAL
        except Exception as err:
            text = str(err)
            # Some CLI versions answer a refusal as a control error naming the checkpoint; a
            # timeout or anything else is the process failing, which is retryable.
            if "checkpoint" in text.lower() and "timeout" not in text.lower():
                return FilesAnswer(can_rewind=False, error=text)
            raise AgentError(f"rewind_files failed: {err}") from err
        return FilesAnswer(
            can_rewind=bool(answer.get("canRewind", False)),
            files_changed=tuple(str(f) for f in answer.get("filesChanged") or ()),
            insertions=int(answer.get("insertions") or 0),
            deletions=int(answer.get("deletions") or 0),
            skipped_links=int(answer.get("skippedLinks") or 0),
            error=str(answer.get("error") or ""),
        )

    async def rewind_conversation(self, target: str, newest_prompt: str) -> ConversationAnswer:
        """Cuts the live process's conversation just before the prompt `target`, in place.

        The CLI's `rewind_conversation` control request (INTERNAL: the SDK has no method for it)
        drops `target` and everything after it from the process's memory in a few milliseconds,
        so the session keeps its process instead of resuming in a new one. `newest_prompt` is the
        newest prompt the service has seen; the CLI refuses when it holds a later one, or for any
        other reason it names (then the caller resumes a new process at the cut instead). The CLI
        also appends a marker of the cut to the transcript, which a plain resume after a crash
        does not honour: the service's ledger stays the record of the cut.
        """
        query = getattr(self._client, "_query", None)  # INTERNAL: the control-protocol object
        if query is None or not self.alive:
            raise AgentError("the Claude Code process is not running")
        request = {
            "subtype": "rewind_conversation",
            "target_message_uuid": target,
            "last_seen_user_message_uuid": newest_prompt,
        }
        try:
            answer = await query._send_control_request(request, timeout=30.0)  # INTERNAL
        except Exception as err:
            raise AgentError(f"rewind_conversation failed: {err}") from err
        if answer.get("rewound") is True and answer.get("targetMessageUuid") in (None, target):
            return ConversationAnswer(True)
        return ConversationAnswer(False, str(answer.get("reason") or ""), str(answer.get("error") or ""))

    async def close(self) -> None:
        """Ends the CLI process; bounded in time, safe to call twice."""
        self._closed = True
        self._stop.set()
        host = self._host
        if host is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(host), self._close_timeout)
        except (TimeoutError, asyncio.CancelledError):
            process = self._process()
            if process is not None and process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
            host.cancel()
            with contextlib.suppress(BaseException):
                await host
        except Exception:
            pass
