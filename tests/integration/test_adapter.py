"""The SDK adapter against the real CLI: what the service relies on from this SDK version.

These pin the uses of SDK internals (the rewind_files control request and its answer, the
process handle) so an SDK upgrade that changes them fails here, loudly.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import baggage, propagate
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import TracerProvider

from agent_rewind.sessions import adapter
from agent_rewind.sessions.adapter import ClientSpec, SdkAgentClient
from agent_rewind.sessions.policy import ToolPolicy
from agent_rewind.sessions.turn_events import PromptEvent, ResultEvent, TurnEvent
from agent_rewind.testing import ScriptedModel

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model() -> AsyncIterator[ScriptedModel]:
    with ScriptedModel() as m:
        yield m  # type: ignore[misc]


def _spec(tmp_path: Path, model: ScriptedModel, **kw: object) -> ClientSpec:
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    values: dict[str, object] = {
        "session_id": str(uuid.uuid4()),
        "cwd": workspace,
        "options": {},
        "checkpointing": True,
        "env": {
            "ANTHROPIC_BASE_URL": model.base_url,
            "ANTHROPIC_API_KEY": "test",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "CLAUDE_CONFIG_DIR": str(tmp_path / "claude"),
            "HOME": str(tmp_path),
        },
        "resume": False,
    }
    values.update(kw)
    return ClientSpec(**values)  # type: ignore[arg-type]


def _client(spec: ClientSpec, **kw: Any) -> SdkAgentClient:
    return SdkAgentClient(spec, ToolPolicy(spec.cwd, spec.options.get("allowed_tools") or ()), **kw)


async def _turn(client: SdkAgentClient, text: str) -> list[TurnEvent]:
    prompt_id = str(uuid.uuid4())
    await client.send_prompt(text, prompt_id)
    events = [event async for event in client.receive_turn(prompt_id)]
    prompts = [e for e in events if isinstance(e, PromptEvent) and not e.parent_tool_use_id]
    assert [e.message_id for e in prompts] == [prompt_id], "the prompt carries the id it was sent with"
    return events


async def test_files_rewind_answers_with_the_clis_full_result(tmp_path: Path, model: ScriptedModel) -> None:
    client = _client(_spec(tmp_path, model))
    await client.start()
    try:
        assert client.alive and client.pid
        first = await _turn(client, "write a.txt one")
        second = await _turn(client, "edit a.txt one => two\nwrite b.txt bee")
        assert isinstance(second[-1], ResultEvent)
        target = next(e.message_id for e in second if isinstance(e, PromptEvent))
        assert (tmp_path / "ws" / "a.txt").read_text() == "two\n"

        preview = await client.rewind_files(target, dry_run=True)
        assert preview.can_rewind
        assert sorted(Path(f).name for f in preview.files_changed) == ["a.txt", "b.txt"]
        assert preview.insertions >= 1 and preview.deletions >= 1
        assert (tmp_path / "ws" / "a.txt").read_text() == "two\n", "a dry run changes nothing"

        applied = await client.rewind_files(target, dry_run=False)
        assert applied.can_rewind and applied.skipped_links == 0
        assert (tmp_path / "ws" / "a.txt").read_text() == "one\n"
        assert not (tmp_path / "ws" / "b.txt").exists()

        unknown = await client.rewind_files(str(uuid.uuid4()), dry_run=True)
        assert not unknown.can_rewind and "checkpoint" in unknown.error.lower()
        assert isinstance(first[0], PromptEvent)
    finally:
        await client.close()
    assert not client.alive


async def test_checkpoints_survive_the_process_and_resume_at_cuts_the_conversation(
    tmp_path: Path, model: ScriptedModel
) -> None:
    spec = _spec(tmp_path, model)
    client = _client(spec)
    await client.start()
    ids = []
    for text in ("write a.txt one", "say two", "say three"):
        events = await _turn(client, text)
        ids.append(next(e.message_id for e in events if isinstance(e, PromptEvent)))
    await client.close()

    import json

    transcript = next((tmp_path / "claude" / "projects").glob(f"*/{spec.session_id}.jsonl"))
    parents = {
        e["uuid"]: e.get("parentUuid")
        for e in map(json.loads, transcript.read_text().splitlines())
        if e.get("uuid")
    }
    resumed = _client(
        _spec(tmp_path, model, session_id=spec.session_id, resume=True, resume_session_at=parents[ids[1]])
    )
    await resumed.start()
    try:
        assert (await resumed.rewind_files(ids[0], dry_run=True)).can_rewind
        events = await _turn(resumed, "recall")
        recall = next(e.text for e in events if getattr(e, "text", "").startswith("RECALL"))
        assert json.loads(recall.removeprefix("RECALL: ")) == ["write a.txt one", "recall"]
    finally:
        await resumed.close()


def test_the_bundled_cli_is_the_version_the_adapter_reports() -> None:
    import claude_agent_sdk

    binary = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60, check=True)
    assert adapter.cli_version() in out.stdout
    assert adapter.sdk_version() == importlib.metadata.version("claude-agent-sdk")


@pytest.mark.version_bound("the claude-agent-sdk version pyproject.toml pins")
def test_the_installed_sdk_is_the_pinned_one() -> None:
    """The service is tested against one SDK (and the CLI inside it): the pin. A venv holding
    another (make compat's) is not what ships."""
    pin = re.search(r'"claude-agent-sdk==([^"]+)"', (ROOT / "pyproject.toml").read_text())
    assert pin is not None
    assert adapter.sdk_version() == pin.group(1)


async def test_a_cli_that_cannot_start_raises_agent_error(tmp_path: Path, model: ScriptedModel) -> None:
    client = _client(_spec(tmp_path, model, resume=True), connect_timeout=30)
    with pytest.raises(adapter.AgentError):
        await client.start()  # resuming a session that has no transcript
    assert not client.alive


async def test_a_live_process_cuts_its_conversation_in_place(tmp_path: Path, model: ScriptedModel) -> None:
    """The CLI's rewind_conversation control request: the service keeps the process after a cut."""
    import json

    client = _client(_spec(tmp_path, model))
    await client.start()
    try:
        pid = client.pid
        ids = []
        for text in ("say one", "write a.txt two", "say three", "say four"):
            events = await _turn(client, text)
            ids.append(next(e.message_id for e in events if isinstance(e, PromptEvent)))
        # Without naming the newest prompt it has seen, the CLI refuses all but the last one.
        assert await client.rewind_conversation(ids[2], newest_prompt=ids[3]) == (
            adapter.ConversationAnswer(True)
        )
        # A second cut before the next turn, further back, in the same process.
        assert (await client.rewind_conversation(ids[1], newest_prompt=ids[1])).rewound
        # A target it does not hold (a prompt already dropped) is refused with a reason.
        refused = await client.rewind_conversation(ids[3], newest_prompt=ids[1])
        assert not refused.rewound and refused.reason
        events = await _turn(client, "recall")
        recall = next(e.text for e in events if getattr(e, "text", "").startswith("RECALL"))
        assert json.loads(recall.removeprefix("RECALL: ")) == ["say one", "recall"]
        assert client.pid == pid, "the same process"
    finally:
        await client.close()


async def test_close_returns_only_once_the_process_has_exited_even_if_the_sdk_fails_to_end_it(
    tmp_path: Path, model: ScriptedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live slot is freed when `close` returns: the process must be gone by then, whatever the
    SDK's disconnect manages."""
    client = _client(_spec(tmp_path, model))
    await client.start()
    pid = client.pid
    assert pid is not None

    async def broken_disconnect() -> None:
        raise RuntimeError("the SDK failed midway")

    monkeypatch.setattr(client._client, "disconnect", broken_disconnect)
    await client.close()
    assert not _running(pid), "the process outlived close()"


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


async def test_a_caller_s_trace_context_never_reaches_the_cli_s_environment(
    tmp_path: Path, model: ScriptedModel
) -> None:
    """The issue: with tracing on, the SDK wrote the caller's traceparent, tracestate and baggage
    into the CLI's environment, past the allowlist, and later turns (another caller's) carried it."""
    provider = TracerProvider()
    client = _client(_spec(tmp_path, model))
    with provider.get_tracer("test").start_as_current_span("a caller's call"):
        ctx = baggage.set_baggage("tenant", "caller-secret")
        token = otel_context.attach(ctx)
        try:
            assert "traceparent" in _injected() and "baggage" in _injected(), "the caller has a context"
            await client.start()
        finally:
            otel_context.detach(token)
    try:
        environ = (Path("/proc") / str(client.pid) / "environ").read_bytes().decode(errors="replace")
        names = {item.split("=", 1)[0].upper() for item in environ.split("\0") if "=" in item}
        assert not names & {"TRACEPARENT", "TRACESTATE", "BAGGAGE"}, names
        assert "caller-secret" not in environ
    finally:
        await client.close()


def _injected() -> dict[str, str]:
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


async def test_a_cli_program_busy_at_exec_is_started_once_it_is_free(
    tmp_path: Path, model: ScriptedModel
) -> None:
    """ETXTBSY: a process forked while the service wrote the session's program holds it open for
    writing until it execs, and the kernel refuses to run the program meanwhile. Here a process of
    our own holds it open for 0.3 s; the start is tried again and succeeds."""
    program = tmp_path / "cli"
    program.write_text(f'#!/bin/sh\nexec {adapter.cli_binary()} "$@"\n')
    program.chmod(0o700)
    holder = subprocess.Popen(  # noqa: ASYNC220 - in place before anything is awaited
        [
            "python3",
            "-c",
            f"import time; f = open({str(program)!r}, 'a'); print(flush=True); time.sleep(0.3)",
        ],
        stdout=subprocess.PIPE,
    )
    assert holder.stdout is not None and holder.stdout.readline()  # it holds the file open now
    with pytest.raises(OSError) as busy:
        subprocess.run([str(program), "--version"], check=False)  # noqa: ASYNC221 - refused at once
    assert "Text file busy" in str(busy.value), "the kernel refuses a program open for writing"
    client = _client(_spec(tmp_path, model, cli_path=program))
    try:
        await client.start()
        assert client.alive
        assert isinstance((await _turn(client, "say ready"))[-1], ResultEvent)
    finally:
        await client.close()
        holder.wait()


def test_only_a_text_file_busy_error_is_tried_again() -> None:
    import errno as errno_codes

    wrapped = RuntimeError("Failed to start Claude Code")
    wrapped.__cause__ = OSError(errno_codes.ETXTBSY, "Text file busy")
    assert adapter._text_file_busy(wrapped)
    assert adapter._text_file_busy(
        RuntimeError("Failed to start Claude Code: [Errno 26] Text file busy: '/x/cli'")
    )
    assert not adapter._text_file_busy(RuntimeError("Failed to start Claude Code: [Errno 2] No such file"))
    assert not adapter._text_file_busy(OSError(errno_codes.EACCES, "Permission denied"))
