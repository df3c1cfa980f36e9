"""The one module that talks to claude_agent_sdk: the SDK boundary, kept thin.

Everything the service needs from the SDK goes through `AgentClient`: start a CLI process for a
session (fresh, or resumed at a given entry), send a prompt under an id of the service's choosing,
stream that turn, interrupt, kill, rewind files (with the CLI's full answer, which the public SDK
method drops), cut the conversation in place, close. What the CLI may load and run is decided
here too, from the session's checked options (`sessions/options.py`) and its tool policy
(`sessions/policy.py`): nothing is read from the workspace or the user's home.

Uses of SDK internals are marked INTERNAL and covered by integration tests against the real CLI
(tests/integration/test_adapter.py), so an SDK upgrade that breaks them fails loudly. The SDK
version is pinned in pyproject.toml.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import warnings
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import claude_agent_sdk
import structlog
from claude_agent_sdk import (
    AgentDefinition,
    AssistantMessage,
    CanUseToolShadowedWarning,
    ClaudeAgentOptions,
    ClaudeSDKClient,
    ClaudeSDKError,
    HookMatcher,
    PermissionResultAllow,
    PermissionResultDeny,
    ResultMessage,
    SystemMessage,
    TextBlock,
    ToolPermissionContext,
    ToolResultBlock,
    ToolUseBlock,
    UserMessage,
)
from opentelemetry import context as otel_context

from agent_rewind.sessions import tools
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

log = structlog.get_logger(__name__)

# Tools named in allowed_tools bypassing can_use_tool is intended: the PreToolUse hook still
# confines the file tools among them to the workspace.
warnings.filterwarnings("ignore", category=CanUseToolShadowedWarning)

# "default" makes the CLI ask `can_use_tool` about every tool that is not allowed outright.
_DEFAULT_PERMISSION_MODE = "default"
_CONTROL_TIMEOUT = 30.0


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


@dataclass(frozen=True)
class ClientSpec:
    """Everything needed to start the CLI for one session. Rebuilt verbatim each time."""

    session_id: str
    cwd: Path
    # Checked by sessions/options.py.
    options: Mapping[str, Any]
    checkpointing: bool
    env: Mapping[str, str]
    # Resume the session's transcript (False while it holds no conversation yet).
    resume: bool
    # The entry the resumed conversation ends at: the leaf the service shows, always pinned, so a
    # crash that kept the CLI from marking its newest leaf never brings dropped turns back.
    resume_session_at: str | None = None
    stderr: Callable[[str], None] | None = None
    # Operator opt-in for trusted deployments: let the CLI read the workspace's .claude/ settings.
    project_settings: bool = False
    # The program run as the CLI: the bundled binary, or the launcher that confines it
    # (sandbox/cli.py).
    cli_path: Path | None = None


def offered_tools(spec: ClientSpec) -> list[str]:
    """The CLI's base tool set for the session (`--tools`): nothing the policy does not know."""
    return tools.base_tools(spec.options.get("allowed_tools") or ())


def build_options(spec: ClientSpec, policy: ToolPolicy) -> ClaudeAgentOptions:
    kwargs: dict[str, Any] = dict(spec.options)
    if "agents" in kwargs:
        kwargs["agents"] = {name: AgentDefinition(**d) for name, d in kwargs["agents"].items()}
    kwargs.setdefault("permission_mode", _DEFAULT_PERMISSION_MODE)

    async def can_use_tool(
        tool_name: str, tool_input: dict[str, Any], context: ToolPermissionContext
    ) -> PermissionResultAllow | PermissionResultDeny:
        decision = policy.permission(tool_name, tool_input)
        return PermissionResultAllow() if decision.allow else PermissionResultDeny(message=decision.message)

    async def confine(hook_input: Any, tool_use_id: str | None, context: Any) -> Any:
        decision = policy.confinement(
            str(hook_input.get("tool_name", "")), hook_input.get("tool_input") or {}
        )
        if decision.allow:
            return {}
        return {
            "hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": "deny",
                "permissionDecisionReason": decision.message,
            }
        }

    kwargs.update(
        # The only tools that exist for the agent, in subagents too (sessions/tools.py).
        tools=offered_tools(spec),
        cli_path=str(spec.cli_path or cli_binary()),
        cwd=str(spec.cwd),
        enable_file_checkpointing=spec.checkpointing,
        # Replayed user messages carry the prompt's transcript uuid: the rewind point id.
        extra_args={"replay-user-messages": None},
        env=dict(spec.env),
        can_use_tool=can_use_tool,
        # A hook runs for every tool call, allowed tools included; a failing hook blocks the call.
        hooks={
            "PreToolUse": [
                HookMatcher(matcher="|".join(sorted(FILE_TOOLS)), hooks=[confine], on_failure="block")
            ]
        },
        # Nothing on disk configures the CLI: no settings, hooks, commands or skills from the
        # workspace or the home directory, and no MCP servers but the session's own.
        setting_sources=["project", "local"] if spec.project_settings else [],
        strict_mcp_config=True,
        plugins=[],
    )
    if spec.resume:
        kwargs["resume"] = spec.session_id
        if spec.resume_session_at:
            kwargs["resume_session_at"] = spec.resume_session_at
    else:
        kwargs["session_id"] = spec.session_id
    if spec.stderr is not None:
        kwargs["stderr"] = spec.stderr
    return ClaudeAgentOptions(**kwargs)


def pin_leaf(transcript: Path, session_id: str, leaf: str) -> None:
    """Makes the CLI resume the conversation that ends at `leaf`. Call while no CLI process of
    the session runs.

    INTERNAL (the CLI's transcript format): the CLI resumes from the leaf its newest `last-prompt`
    record names, and `resume_session_at` must lie on that conversation. It writes such a record
    at the end of a turn and when it cuts a conversation in place, sometimes lazily, so a process
    killed in between leaves it naming another branch's leaf: the resume would bring dropped turns
    back, or fail ("No message found with message.uuid"). Appending a record of the same shape,
    naming the leaf the service shows, makes the CLI load that conversation.
    """
    try:
        with transcript.open("rb") as f:
            f.seek(0, os.SEEK_END)
            partial = f.tell() > 0 and (f.seek(-1, os.SEEK_END), f.read(1))[1] != b"\n"
    except FileNotFoundError:
        return  # nothing to resume
    record = json.dumps(
        {"type": "last-prompt", "leafUuid": leaf, "sessionId": session_id}, separators=(",", ":")
    )
    # A line a killed CLI left half written is ended first, so the record is a line of its own.
    with transcript.open("ab") as f:
        f.write((b"\n" if partial else b"") + record.encode() + b"\n")
        f.flush()
        os.fsync(f.fileno())


class AgentClient(Protocol):
    """One live CLI process for one session."""

    @property
    def alive(self) -> bool: ...

    @property
    def pid(self) -> int | None: ...

    async def start(self) -> None: ...

    async def send_prompt(self, text: str, prompt_id: str) -> None:
        """Sends a prompt; `prompt_id` becomes its transcript uuid (its rewind point id)."""
        ...

    def receive_turn(self, prompt_id: str) -> AsyncIterator[TurnEvent]:
        """The turn of `prompt_id`, up to and including its result."""
        ...

    async def interrupt(self) -> None: ...

    async def rewind_files(self, message_id: str, *, dry_run: bool) -> FilesAnswer: ...

    async def rewind_conversation(self, target: str, newest_prompt: str) -> ConversationAnswer: ...

    async def kill(self) -> None:
        """Ends the process at once (SIGKILL), for a turn that does not stop when asked."""
        ...

    async def close(self) -> None: ...


# Starts of the CLI tried when its program is "busy" (ETXTBSY) at exec.
_EXEC_ATTEMPTS = 5


def _text_file_busy(err: BaseException) -> bool:
    """The CLI's exec failed with ETXTBSY (the SDK wraps the OSError, or names it)."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno == errno.ETXTBSY:
            return True
        seen = seen.__cause__ or seen.__context__
    return "[Errno 26]" in str(err) or "Text file busy" in str(err)


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


def to_events(message: Any, prompt_id: str) -> list[TurnEvent]:
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
        if parent or uid == prompt_id:
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


def _answers(message: ResultMessage, prompt_id: str) -> bool:
    """Whether this result ends the turn that took in `prompt_id`."""
    return message.user_message_uuid == prompt_id or prompt_id in (message.user_message_uuids or ())


class SdkAgentClient:
    """`AgentClient` over `ClaudeSDKClient`.

    The SDK client enters an anyio task group at connect and must leave it from the same task, so
    a small host task owns connect and disconnect; prompts, reads and control requests may come
    from any task.
    """

    def __init__(
        self,
        spec: ClientSpec,
        policy: ToolPolicy,
        *,
        connect_timeout: float = 60.0,
        close_timeout: float = 10.0,
    ) -> None:
        self._spec = spec
        self._options = build_options(spec, policy)
        self._client = ClaudeSDKClient(self._options)
        self._connect_timeout = connect_timeout
        self._close_timeout = close_timeout
        self._host: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._closed = False
        self._started_process: Any = None

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
            # The SDK writes the current trace context into the CLI's environment (TRACEPARENT,
            # TRACESTATE, BAGGAGE, whatever the propagators carry): the first caller's, which
            # every later turn, another caller's too, would carry. The CLI starts from none (this
            # task's own context); the service's spans carry the caller's.
            otel_context.attach(otel_context.Context())
            for attempt in range(_EXEC_ATTEMPTS):
                try:
                    await self._client.connect()
                    break
                except BaseException as err:
                    if attempt + 1 < _EXEC_ATTEMPTS and _text_file_busy(err):
                        # The session's program was just written, and a process forked meanwhile
                        # (another session's CLI, a git of a snapshot) holds the file open for
                        # writing until it execs: the kernel refuses to run it for that moment.
                        # Go's os/exec retries so too (golang/go#22315).
                        with contextlib.suppress(Exception):
                            await self._client.disconnect()
                        self._client = ClaudeSDKClient(self._options)
                        await asyncio.sleep(0.05 * (attempt + 1))
                        continue
                    if not ready.done():
                        ready.set_exception(AgentError(f"the Claude Code CLI did not start: {err}"))
                    return
            # Kept: a slot is freed only once this process has exited, whatever the SDK's
            # disconnect manages (see `close`).
            self._started_process = self._process()
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

    async def send_prompt(self, text: str, prompt_id: str) -> None:
        if not self.alive:
            raise AgentError("the Claude Code process is not running")

        async def message() -> AsyncIterator[dict[str, Any]]:
            # A top-level uuid becomes the prompt's transcript uuid, and the turn's result names it.
            yield {
                "type": "user",
                "uuid": prompt_id,
                "message": {"role": "user", "content": text},
                "parent_tool_use_id": None,
            }

        try:
            await self._client.query(message())
        except (ClaudeSDKError, OSError) as err:
            raise AgentError(f"could not send the prompt: {err}") from err

    async def receive_turn(self, prompt_id: str) -> AsyncIterator[TurnEvent]:
        """The events of the turn `prompt_id` opened, up to and including its result.

        The turn ends on the result that names the prompt, echoed or not (a slash command's answer
        comes without an echo). A background task's notification turn can still be running, or
        finish, when the prompt is sent; what it streams before the prompt's echo is not this
        turn's, and its result does not name the prompt, so both are skipped.
        """
        echoed = False
        try:
            async for message in self._client.receive_messages():
                if isinstance(message, SystemMessage) and message.subtype == "init":
                    await self._check_tools(message.data.get("tools"))
                    continue
                if isinstance(message, ResultMessage):
                    if _answers(message, prompt_id):
                        yield to_events(message, prompt_id)[0]
                        return
                    continue
                if isinstance(message, UserMessage) and message.uuid == prompt_id:
                    echoed = True
                if not echoed:
                    continue
                for event in to_events(message, prompt_id):
                    yield event
        except (ClaudeSDKError, OSError) as err:
            raise AgentError(f"the Claude Code process failed during the turn: {err}") from err
        raise AgentError("the Claude Code process exited during the turn")

    async def _check_tools(self, offered: Any) -> None:
        """Fails closed when the CLI offers a tool beyond the session's base set: a CLI that no
        longer honours `--tools`, or adds tools it does not govern, is ended before its turn runs."""
        extra = tools.unexpected(
            [str(t) for t in offered or ()],
            offered_tools(self._spec),
            (self._spec.options.get("mcp_servers") or {}).keys(),
        )
        if extra:
            log.error("the cli offers tools the service's policy does not know; ending it", tools=extra)
            await self.kill()
            raise AgentError(
                f"the Claude Code CLI offers tools the service's policy does not know: {', '.join(extra)}"
            )

    async def interrupt(self) -> None:
        try:
            await self._client.interrupt()
        except Exception as err:  # the SDK raises bare Exception on control errors
            raise AgentError(f"interrupt failed: {err}") from err

    async def _control(self, request: dict[str, Any]) -> dict[str, Any]:
        query = getattr(self._client, "_query", None)  # INTERNAL: the control-protocol object
        if query is None or not self.alive:
            raise AgentError("the Claude Code process is not running")
        answer: dict[str, Any] = await query._send_control_request(
            request, timeout=_CONTROL_TIMEOUT
        )  # INTERNAL
        return answer

    async def rewind_files(self, message_id: str, *, dry_run: bool) -> FilesAnswer:
        """Sends the CLI's rewind_files control request and returns its whole answer.

        The public `ClaudeSDKClient.rewind_files` returns nothing and has no dry run.
        """
        request: dict[str, Any] = {"subtype": "rewind_files", "user_message_id": message_id}
        if dry_run:
            request["dry_run"] = True
        try:
            answer = await self._control(request)
        except AgentError:
            raise
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
        request = {
            "subtype": "rewind_conversation",
            "target_message_uuid": target,
            "last_seen_user_message_uuid": newest_prompt,
        }
        try:
            answer = await self._control(request)
        except AgentError:
            raise
        except Exception as err:
            raise AgentError(f"rewind_conversation failed: {err}") from err
        if answer.get("rewound") is True and answer.get("targetMessageUuid") in (None, target):
            return ConversationAnswer(True)
        return ConversationAnswer(False, str(answer.get("reason") or ""), str(answer.get("error") or ""))

    async def kill(self) -> None:
        process = self._process()
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        await self.close()

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
        await self._reap()

    async def _reap(self) -> None:
        """Returns once the process has exited: the SDK's disconnect may have failed midway, or
        the kill above may not have taken effect yet. A process that still runs is killed."""
        process = self._started_process
        if process is None or process.returncode is not None:
            return
        log.warning("the cli outlived its disconnect; killing it", pid=process.pid)
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(process.wait(), 5)
