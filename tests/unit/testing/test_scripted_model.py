"""The scripted model: how it plans a turn from the prompt, and how it speaks HTTP."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from agent_rewind.testing import RECALL_PREFIX, ScriptedModel, answer, visible_prompts
from agent_rewind.testing.scripted_model import Reply

CLI_TOOLS = ["Agent", "Bash", "Edit", "Read", "Write"]
REMINDER = "<system-reminder>\nAs you answer, keep in mind the context below.\n</system-reminder>"
ENVIRONMENT = " - Primary working directory: /work/space\n - Platform: linux\n"


# --- Requests shaped like the ones the Claude Code CLI sends -------------------------------------


def user_prompt(text: str) -> dict[str, Any]:
    """A prompt as the CLI sends it: reminder text blocks first, then the user's own text."""
    return {"role": "user", "content": [{"type": "text", "text": REMINDER}, {"type": "text", "text": text}]}


def tool_step(n: int) -> list[dict[str, Any]]:
    """One completed tool call: the assistant's tool_use and the user message with its result."""
    tool_id = f"toolu_{n}"
    return [
        {"role": "assistant", "content": [{"type": "tool_use", "id": tool_id, "name": "Read", "input": {}}]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": tool_id, "content": "ok"},
                {"type": "text", "text": REMINDER},
            ],
        },
    ]


def request(
    *messages: dict[str, Any], tools: list[str] = CLI_TOOLS, cwd: bool = True, **extra: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "claude-test",
        "max_tokens": 1024,
        "system": [{"type": "text", "text": "You are Claude Code."}],
        "tools": [{"name": t, "input_schema": {"type": "object"}} for t in tools],
        "messages": list(messages),
        **extra,
    }
    if cwd:
        # The CLI names the workspace in an environment section, here in a system-role message.
        body["messages"].insert(1, {"role": "system", "content": [{"type": "text", "text": ENVIRONMENT}]})
    return body


def turn(prompt: str, done: int = 0, **kwargs: Any) -> dict[str, Any]:
    """The request for step `done` of a turn opened by `prompt` (after `done` tool calls)."""
    history = [m for n in range(done) for m in tool_step(n)]
    return request(user_prompt(prompt), *history, **kwargs)


def text_of(reply: Reply) -> str:
    return "\n".join(b["text"] for b in reply.blocks if b["type"] == "text")


def tool_of(reply: Reply) -> tuple[str, dict[str, Any]] | None:
    uses = [b for b in reply.blocks if b["type"] == "tool_use"]
    assert len(uses) <= 1, "one tool_use per response"
    return (uses[0]["name"], uses[0]["input"]) if uses else None


def run_turn(prompt: str, **kwargs: Any) -> list[Reply]:
    """Every reply of a turn, as the CLI would collect them, until the final answer."""
    replies = []
    for done in range(20):
        reply = answer(turn(prompt, done, **kwargs))
        replies.append(reply)
        if reply.stop_reason == "end_turn":
            return replies
    raise AssertionError(f"turn did not end: {[tool_of(r) for r in replies]}")


# --- Planning ----------------------------------------------------------------------------------


def test_each_instruction_line_is_one_tool_call_in_its_own_response() -> None:
    replies = run_turn("write a.txt one\nbash ls -l\nread b.txt")

    assert [tool_of(r) for r in replies] == [
        ("Write", {"file_path": "/work/space/a.txt", "content": "one\n"}),
        ("Bash", {"command": "ls -l", "description": "Run a scripted command"}),
        ("Read", {"file_path": "/work/space/b.txt"}),
        None,
    ]
    assert [r.stop_reason for r in replies] == ["tool_use", "tool_use", "tool_use", "end_turn"]


def test_the_step_is_the_number_of_assistant_messages_since_the_last_prompt() -> None:
    earlier_turn = [user_prompt("write old.txt x\nwrite old2.txt y"), *tool_step(0), *tool_step(1)]
    earlier_turn.append({"role": "assistant", "content": [{"type": "text", "text": "Done."}]})

    first = answer(request(*earlier_turn, user_prompt("write new.txt a\nwrite new2.txt b")))
    second = answer(request(*earlier_turn, user_prompt("write new.txt a\nwrite new2.txt b"), *tool_step(9)))

    assert tool_of(first) == ("Write", {"file_path": "/work/space/new.txt", "content": "a\n"})
    assert tool_of(second) == ("Write", {"file_path": "/work/space/new2.txt", "content": "b\n"})


def test_a_repeated_request_gets_the_same_step() -> None:
    # The CLI retries failed requests; a retry must not skip a step.
    assert tool_of(answer(turn("write a.txt 1\nwrite b.txt 2", 1))) == tool_of(
        answer(turn("write a.txt 1\nwrite b.txt 2", 1))
    )


def test_steps_past_the_plan_answer_done() -> None:
    reply = answer(turn("write a.txt x", 5))

    assert reply.stop_reason == "end_turn"
    assert text_of(reply) == "Done."


def test_system_reminders_are_not_prompts() -> None:
    # A reminder alone, as a string or in blocks, neither opens a turn nor shows in recall.
    messages = [
        user_prompt("write a.txt x\nwrite b.txt y"),
        *tool_step(0),
        {"role": "user", "content": REMINDER + "\nThe date changed."},
        {"role": "user", "content": [{"type": "text", "text": "  " + REMINDER}]},
    ]
    reply = answer(request(*messages))

    assert tool_of(reply) == ("Write", {"file_path": "/work/space/b.txt", "content": "y\n"})
    assert visible_prompts(messages) == ["write a.txt x\nwrite b.txt y"]


def test_tool_results_are_not_prompts() -> None:
    assert visible_prompts(tool_step(0)) == []


def test_recall_lists_every_visible_prompt_oldest_first() -> None:
    messages = [
        user_prompt("say one"),
        {"role": "assistant", "content": [{"type": "text", "text": "one"}]},
        user_prompt("write a.txt x"),
        *tool_step(0),
        {"role": "assistant", "content": [{"type": "text", "text": "Done."}]},
        user_prompt("say before\nrecall"),
    ]
    reply = answer(request(*messages))

    assert reply.stop_reason == "end_turn"
    before, recalled = text_of(reply).split("\n", 1)
    assert before == "before"
    assert recalled.startswith(RECALL_PREFIX)
    assert json.loads(recalled.removeprefix(RECALL_PREFIX)) == [
        "say one",
        "write a.txt x",
        "say before\nrecall",
    ]


def _after_an_interrupt(interrupted: str, prompt: str) -> dict[str, Any]:
    """How the CLI sends the prompt after an interrupted turn: both prompts and the marker in one
    user message, the interrupted prompt ending in a newline of the CLI's own."""
    return {
        "role": "user",
        "content": [
            {"type": "text", "text": REMINDER},
            {"type": "text", "text": interrupted + "\n"},
            {"type": "text", "text": "[Request interrupted by user]\n"},
            {"type": "text", "text": prompt},
        ],
    }


def test_the_turn_after_an_interrupt_runs_only_its_own_prompt() -> None:
    reply = answer(request(user_prompt("say one"), _after_an_interrupt("sleep 30\nsay never", "say after")))
    assert text_of(reply) == "after" and reply.sleep == 0


def test_recall_after_an_interrupt_lists_each_prompt_once() -> None:
    reply = answer(request(user_prompt("say one"), _after_an_interrupt("sleep 30\nsay never", "recall")))
    assert json.loads(text_of(reply).removeprefix(RECALL_PREFIX)) == [
        "say one",
        "sleep 30\nsay never",
        "recall",
    ]


def test_a_prompt_given_as_a_plain_string_counts() -> None:
    reply = answer(request({"role": "user", "content": "say plain"}))

    assert text_of(reply) == "plain"


def test_edit_reads_the_file_then_edits_it() -> None:
    replies = run_turn("edit src/app.py old() => new(1,\\n2)")

    assert [tool_of(r) for r in replies] == [
        ("Read", {"file_path": "/work/space/src/app.py"}),
        (
            "Edit",
            {"file_path": "/work/space/src/app.py", "old_string": "old()", "new_string": "new(1,\n2)"},
        ),
        None,
    ]


def test_escapes_in_written_text_become_newlines_and_tabs() -> None:
    reply = answer(turn("write /abs/notes.md # Title\\n\\tindented"))

    assert tool_of(reply) == ("Write", {"file_path": "/abs/notes.md", "content": "# Title\n\tindented\n"})


def test_without_a_working_directory_paths_stay_as_written() -> None:
    reply = answer(turn("read notes.md", cwd=False))

    assert tool_of(reply) == ("Read", {"file_path": "notes.md"})


def test_agent_starts_a_subagent_with_the_rest_of_the_line_as_its_prompt() -> None:
    name, args = tool_of(answer(turn("agent write sub.txt hi\\nsay sub done"))) or ("", {})

    assert name == "Agent"
    assert args["prompt"] == "write sub.txt hi\nsay sub done"
    assert args["subagent_type"] == "general-purpose"


def test_tools_the_request_does_not_offer_are_not_called() -> None:
    replies = run_turn("write a.txt x\nbash rm -rf /\nread a.txt", tools=["Read"])

    assert [tool_of(r) for r in replies] == [("Read", {"file_path": "/work/space/a.txt"}), None]
    assert "(tool Write is not available)" in text_of(replies[0])
    assert "(tool Bash is not available)" in text_of(replies[0])


def test_a_request_without_tools_gets_text_only() -> None:
    # The CLI's side requests (titles, summaries) offer no tools.
    reply = answer(turn("write a.txt x\nsay hello", tools=[]))

    assert reply.stop_reason == "end_turn"
    assert tool_of(reply) is None
    assert "hello" in text_of(reply)


def test_say_before_a_tool_goes_in_the_same_response() -> None:
    reply = answer(turn("say Looking first.\nread a.txt"))

    assert [b["type"] for b in reply.blocks] == ["text", "tool_use"]
    assert text_of(reply) == "Looking first."


def test_verbs_are_case_insensitive_and_other_lines_are_ignored() -> None:
    replies = run_turn("Please do this:\n\n  WRITE a.txt x  \nthanks")

    assert [tool_of(r) for r in replies] == [
        ("Write", {"file_path": "/work/space/a.txt", "content": "x\n"}),
        None,
    ]


@pytest.mark.parametrize(
    ("prompt", "final"),
    [
        ("write a.txt x", "Done."),
        ("say All good.", "All good."),
        ("sleep 0", "Scripted model: no instruction found."),
        ("hello there", "Scripted model: no instruction found."),
        ("edit a.txt no arrow here", "Scripted model: no instruction found."),
    ],
)
def test_the_final_answer_always_has_text(prompt: str, final: str) -> None:
    # A final answer without text makes the CLI inject a synthetic "no visible output" prompt.
    last = run_turn(prompt)[-1]

    assert last.stop_reason == "end_turn"
    assert text_of(last).startswith(final)


def test_a_conversation_without_a_prompt_gets_ok() -> None:
    assert text_of(answer(request(*tool_step(0)))) == "OK"
    assert text_of(answer({"messages": []})) == "OK"


def test_sleep_delays_the_response_that_follows_it() -> None:
    replies = run_turn("sleep 0.25\nwrite a.txt x\nsleep 1\nsleep 0.5")

    assert [(r.sleep, tool_of(r) is not None) for r in replies] == [(0.25, True), (1.5, False)]


def test_a_bad_sleep_is_reported_not_slept() -> None:
    reply = answer(turn("sleep soon"))

    assert reply.sleep == 0
    assert "(bad sleep: 'soon')" in text_of(reply)


def test_context_sets_the_input_tokens_a_response_reports() -> None:
    replies = run_turn("context 1000000\nwrite a.txt x\nsay done")
    assert [r.input_tokens for r in replies] == [1000000, 10]
    reply = answer(turn("context lots"))
    assert reply.input_tokens == 10
    assert "(bad context: 'lots')" in text_of(reply)


def test_ids_look_like_the_apis() -> None:
    first, second = answer(turn("read a.txt")), answer(turn("read a.txt"))

    assert re.fullmatch(r"msg_\w+", first.message_id)
    assert first.message_id != second.message_id
    (use,) = [b for b in first.blocks if b["type"] == "tool_use"]
    assert re.fullmatch(r"toolu_\w+", use["id"])


# --- HTTP --------------------------------------------------------------------------------------


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel() as running:
        yield running


def post(url: str, body: dict[str, Any] | bytes, timeout: float = 10) -> tuple[int, str, bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.headers.get("content-type", ""), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("content-type", ""), err.read()


def parse_sse(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for chunk in raw.decode().split("\n\n"):
        if not chunk.strip():
            continue
        fields = dict(line.split(": ", 1) for line in chunk.splitlines())
        events.append((fields["event"], json.loads(fields["data"])))
    return events


def test_a_stream_reports_the_context_a_script_asks_for(model: ScriptedModel) -> None:
    for script, tokens in (("say small", 10), ("context 250000\nsay big", 250000)):
        status, _, raw = post(f"{model.base_url}/v1/messages", turn(script, stream=True))
        assert status == 200
        assert parse_sse(raw)[0][1]["message"]["usage"]["input_tokens"] == tokens
        status, _, raw = post(f"{model.base_url}/v1/messages", turn(script))
        assert json.loads(raw)["usage"]["input_tokens"] == tokens


def test_streaming_answers_in_the_messages_api_event_order(model: ScriptedModel) -> None:
    body = turn("say Writing.\nwrite a.txt hello", stream=True)
    status, content_type, raw = post(f"{model.base_url}/v1/messages?beta=true", body)

    assert status == 200
    assert content_type == "text/event-stream"
    events = parse_sse(raw)
    assert [name for name, _ in events] == [
        "message_start",
        *["content_block_start", "content_block_delta", "content_block_stop"] * 2,
        "message_delta",
        "message_stop",
    ]
    assert all(data["type"] == name for name, data in events)
    assert [data["index"] for _, data in events[1:7]] == [0, 0, 0, 1, 1, 1]

    start = events[0][1]["message"]
    assert start["role"] == "assistant"
    assert start["model"] == "claude-test"
    assert start["id"].startswith("msg_")
    assert start["content"] == []

    text_start, text_delta = events[1][1], events[2][1]
    assert (text_start["index"], text_start["content_block"]) == (0, {"type": "text", "text": ""})
    assert text_delta["delta"] == {"type": "text_delta", "text": "Writing."}

    tool_start, tool_delta = events[4][1], events[5][1]
    assert tool_start["index"] == 1
    assert tool_start["content_block"]["type"] == "tool_use"
    assert tool_start["content_block"]["name"] == "Write"
    assert tool_start["content_block"]["input"] == {}
    assert tool_delta["delta"]["type"] == "input_json_delta"
    assert json.loads(tool_delta["delta"]["partial_json"]) == {
        "file_path": "/work/space/a.txt",
        "content": "hello\n",
    }
    assert events[7][1]["delta"]["stop_reason"] == "tool_use"


def test_non_streaming_answers_one_json_message(model: ScriptedModel) -> None:
    status, content_type, raw = post(f"{model.base_url}/v1/messages", turn("say Hi there."))

    assert status == 200
    assert content_type == "application/json"
    message = json.loads(raw)
    assert message["type"] == "message"
    assert message["role"] == "assistant"
    assert message["id"].startswith("msg_")
    assert message["content"] == [{"type": "text", "text": "Hi there."}]
    assert message["stop_reason"] == "end_turn"
    assert message["usage"]["output_tokens"] > 0


def test_count_tokens_answers_a_positive_count_and_is_not_recorded(model: ScriptedModel) -> None:
    model.record()
    status, _, raw = post(f"{model.base_url}/v1/messages/count_tokens?beta=true", turn("say hi"))

    assert status == 200
    assert json.loads(raw)["input_tokens"] > 0
    assert model.requests == []


def test_messages_requests_are_recorded_in_order_once_asked(model: ScriptedModel) -> None:
    first, second = turn("say one"), turn("say two")
    post(f"{model.base_url}/v1/messages", first)
    assert model.requests == [], "nothing kept unless a test asks"
    model.record(keep=2)
    post(f"{model.base_url}/v1/messages", first)
    post(f"{model.base_url}/v1/messages", second)
    assert model.requests == [first, second]


def test_recording_keeps_only_the_newest_requests(model: ScriptedModel) -> None:
    model.record(keep=3)
    sent = [turn(f"say {i}") for i in range(10)]
    for request in sent:
        post(f"{model.base_url}/v1/messages", request)
    assert model.requests == sent[-3:]


def test_unknown_paths_and_bad_json_are_errors(model: ScriptedModel) -> None:
    status, _, raw = post(f"{model.base_url}/v1/complete", {})
    assert status == 404
    assert json.loads(raw)["error"]["type"] == "not_found_error"

    status, _, raw = post(f"{model.base_url}/v1/messages", b"{not json")
    assert status == 400
    assert json.loads(raw)["error"]["type"] == "invalid_request_error"


def test_sleep_holds_the_http_response(model: ScriptedModel) -> None:
    started = time.monotonic()
    status, _, _ = post(f"{model.base_url}/v1/messages", turn("sleep 0.3\nsay awake", stream=True))

    assert status == 200
    assert time.monotonic() - started >= 0.3


def test_a_sleeping_request_does_not_block_others(model: ScriptedModel) -> None:
    slow = threading.Thread(target=post, args=(f"{model.base_url}/v1/messages", turn("sleep 1")))
    slow.start()
    started = time.monotonic()
    post(f"{model.base_url}/v1/messages", turn("say quick"))
    elapsed = time.monotonic() - started
    slow.join()

    assert elapsed < 0.9


def test_a_sleeping_answer_is_dropped_when_the_client_hangs_up(model: ScriptedModel) -> None:
    import socket

    body = json.dumps(turn("sleep 30\nsay late", stream=True)).encode()
    host, port = model.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as conn:
        conn.sendall(
            b"POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        time.sleep(0.2)
    started = time.monotonic()
    # The thread that held the request is free again long before the 30 s sleep ends: the
    # server answers others, and stops promptly.
    post(f"{model.base_url}/v1/messages", turn("say quick"))

    def handlers() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if "process_request_thread" in t.name]

    deadline = time.monotonic() + 5
    while handlers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert handlers() == [], "the sleeping request's thread ended"
    assert time.monotonic() - started < 5


def test_stop_returns_even_if_never_started() -> None:
    stopper = threading.Thread(target=ScriptedModel().stop, daemon=True)
    stopper.start()
    stopper.join(timeout=5)

    assert not stopper.is_alive(), "stop() hung on a server that was never started"


def test_runs_standalone_and_prints_its_base_url() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent_rewind.testing.scripted_model", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        match = re.fullmatch(r"ANTHROPIC_BASE_URL=(http://127\.0\.0\.1:\d+)", line)
        assert match, line
        status, _, raw = post(f"{match.group(1)}/v1/messages", turn("say standalone"))
        assert status == 200
        assert json.loads(raw)["content"] == [{"type": "text", "text": "standalone"}]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
