"""A scripted stand-in for the Anthropic Messages API, for tests and offline runs.

The real Claude Code CLI runs against it on loopback (SDK-FACTS.md). Answers are
deterministic and driven by the text of the turn's prompt, one instruction per line;
the language is documented in docs/scripted-model.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import select
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

RECALL_PREFIX = "RECALL: "
_NOTHING_TO_DO = (
    "Scripted model: no instruction found. One per line: write PATH TEXT, "
    "edit PATH OLD => NEW, bash COMMAND, read PATH, agent PROMPT, say TEXT, recall, sleep SECONDS."
)
_CWD_RE = re.compile(r"Primary working directory: ([^\n]+)")
# How the CLI marks, in the next request, a turn the user interrupted.
_INTERRUPTED = "[Request interrupted by user"


@dataclass
class _Step:
    """One model response: optional text, then at most one tool call."""

    text: list[str] = field(default_factory=list)
    tool: tuple[str, dict[str, Any]] | None = None
    sleep: float = 0.0
    input_tokens: int = 10


def _unescape(text: str) -> str:
    return text.replace("\\n", "\n").replace("\\t", "\t")


def _is_reminder(block: Any) -> bool:
    return (
        isinstance(block, dict)
        and block.get("type") == "text"
        and str(block.get("text", "")).lstrip().startswith("<system-reminder>")
    )


def _is_interruption(text: str) -> bool:
    return text.lstrip().startswith(_INTERRUPTED)


def prompts_in(message: dict[str, Any]) -> list[str]:
    """The user's own prompts in one request message, oldest first; [] when it holds none.

    Skips the CLI's `<system-reminder>` blocks and tool results. After an interrupted turn the
    CLI sends the interrupted prompt, its "[Request interrupted by user]" marker and the next
    prompt as text blocks of one message: each prompt is its own block, so each is its own
    prompt here (the CLI ends a merged block with a newline of its own, which is dropped).
    """
    if message.get("role") != "user":
        return []
    content = message.get("content")
    if isinstance(content, str):
        skip = content.lstrip().startswith("<system-reminder>") or _is_interruption(content)
        return [] if skip else [content]
    if not isinstance(content, list):
        return []
    blocks = [
        str(b.get("text", ""))
        for b in content
        if isinstance(b, dict) and b.get("type") == "text" and not _is_reminder(b)
    ]
    merged = len(blocks) > 1
    return [b.removesuffix("\n") if merged else b for b in blocks if not _is_interruption(b)]


def prompt_text(message: dict[str, Any]) -> str | None:
    """The newest prompt in a request message, or None when it holds none."""
    prompts = prompts_in(message)
    return prompts[-1] if prompts else None


def visible_prompts(messages: list[dict[str, Any]]) -> list[str]:
    """Every user prompt the conversation in one request holds, oldest first."""
    return [p for m in messages for p in prompts_in(m)]


def _resolve(path: str, cwd: str | None) -> str:
    if path.startswith("/") or cwd is None:
        return path
    return f"{cwd.rstrip('/')}/{path}"


def _plan(prompt: str, cwd: str | None, tools: set[str]) -> list[_Step]:
    """Turn a prompt into the sequence of responses the model gives, one per request."""
    steps: list[_Step] = []
    current = _Step()

    def call(name: str, args: dict[str, Any], *, offered_or_not: bool = False) -> None:
        nonlocal current
        if name not in tools and not offered_or_not:
            current.text.append(f"(tool {name} is not available)")
            return
        current.tool = (name, args)
        steps.append(current)
        current = _Step()

    for raw in prompt.splitlines():
        line = raw.strip()
        verb, _, rest = line.partition(" ")
        verb = verb.lower()
        if verb == "write":
            path, _, text = rest.partition(" ")
            call("Write", {"file_path": _resolve(path, cwd), "content": _unescape(text) + "\n"})
        elif verb == "edit" and " => " in rest:
            path, _, change = rest.partition(" ")
            old, _, new = change.partition(" => ")
            file_path = _resolve(path, cwd)
            # The CLI refuses an Edit of a file the conversation has not read, which is the
            # case after a conversation rewind dropped the turn that wrote it.
            call("Read", {"file_path": file_path})
            call("Edit", {"file_path": file_path, "old_string": _unescape(old), "new_string": _unescape(new)})
        elif verb == "read":
            call("Read", {"file_path": _resolve(rest.strip(), cwd)})
        elif verb == "bash":
            call("Bash", {"command": rest, "description": "Run a scripted command"})
        elif verb == "agent":
            call(
                "Agent",
                {
                    "description": "Scripted subagent",
                    "prompt": _unescape(rest),
                    "subagent_type": "general-purpose",
                    "run_in_background": False,
                },
            )
        elif verb == "tool":
            # Any tool with any input, as a hostile prompt could make the model ask for.
            name, _, raw = rest.strip().partition(" ")
            try:
                args = json.loads(raw) if raw.strip() else {}
            except json.JSONDecodeError:
                args = None
            if not isinstance(args, dict):
                current.text.append(f"(bad tool input: {raw!r})")
            else:
                # Whether or not the CLI offered it: a model can name any tool.
                call(name, args, offered_or_not=True)
        elif verb == "say":
            current.text.append(_unescape(rest))
        elif verb == "recall":
            current.text.append("\x00recall")
        elif verb == "sleep":
            try:
                current.sleep += float(rest)
            except ValueError:
                current.text.append(f"(bad sleep: {rest!r})")
        elif verb == "context":
            # The context this response reports having read: near the CLI's window, the CLI
            # compacts the conversation by itself before its next request.
            try:
                current.input_tokens = max(1, int(rest))
            except ValueError:
                current.text.append(f"(bad context: {rest!r})")
    if not current.text:
        # A final answer without text makes the CLI inject a synthetic "no visible output" prompt.
        current.text.append("Done." if steps else _NOTHING_TO_DO)
    steps.append(current)
    return steps


@dataclass
class Reply:
    """What the model answers to one request."""

    blocks: list[dict[str, Any]]
    stop_reason: str
    sleep: float = 0.0
    input_tokens: int = 10
    message_id: str = field(default_factory=lambda: f"msg_scripted_{uuid.uuid4().hex}")


def _find_cwd(node: Any) -> str | None:
    """The workspace the CLI names in its environment section, wherever it sits."""
    if isinstance(node, str):
        match = _CWD_RE.search(node)
        return match.group(1).strip() if match else None
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    for child in children:
        found = _find_cwd(child)
        if found:
            return found
    return None


def answer(request: dict[str, Any]) -> Reply:
    """The deterministic answer to one Messages API request."""
    messages: list[dict[str, Any]] = list(request.get("messages") or [])
    tools = {str(t.get("name")) for t in request.get("tools") or [] if isinstance(t, dict)}
    cwd = _find_cwd(request)

    last_prompt_at = -1
    for i, m in enumerate(messages):
        if prompt_text(m) is not None:
            last_prompt_at = i
    if last_prompt_at < 0:
        return Reply([{"type": "text", "text": "OK"}], "end_turn")
    prompt = prompt_text(messages[last_prompt_at]) or ""
    step_index = sum(1 for m in messages[last_prompt_at + 1 :] if m.get("role") == "assistant")
    steps = _plan(prompt, cwd, tools)
    step = steps[min(step_index, len(steps) - 1)] if step_index < len(steps) else _Step(["Done."])

    blocks: list[dict[str, Any]] = []
    texts = [
        RECALL_PREFIX + json.dumps(visible_prompts(messages)) if t == "\x00recall" else t for t in step.text
    ]
    if texts:
        blocks.append({"type": "text", "text": "\n".join(texts)})
    if step.tool is not None:
        name, args = step.tool
        blocks.append(
            {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:24]}", "name": name, "input": args}
        )
        return Reply(blocks, "tool_use", step.sleep, step.input_tokens)
    return Reply(blocks, "end_turn", step.sleep, step.input_tokens)


def _sse_events(reply: Reply, model: str) -> Iterator[tuple[str, dict[str, Any]]]:
    usage = {"input_tokens": reply.input_tokens, "output_tokens": 1}
    yield (
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": reply.message_id,
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": usage,
            },
        },
    )
    for index, block in enumerate(reply.blocks):
        start: dict[str, Any]
        if block["type"] == "text":
            start = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        yield "content_block_start", {"type": "content_block_start", "index": index, "content_block": start}
        yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": reply.stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": 10},
        },
    )
    yield "message_stop", {"type": "message_stop"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib name
        return

    def _send_json(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _wait(self, seconds: float) -> bool:
        """Sleeps `seconds` unless the client closes the connection first; False if it did."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select([self.connection], [], [], min(left, 0.05))
            if readable:
                try:
                    if not self.connection.recv(1, socket.MSG_PEEK):
                        return False
                except OSError:
                    return False
        return True

    def handle(self) -> None:
        # The CLI gives up on a request when a turn is interrupted or its process closes.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            super().handle()

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        try:
            request = json.loads(self.rfile.read(length) or b"{}")
        except json.JSONDecodeError:
            self._send_json(
                400, {"type": "error", "error": {"type": "invalid_request_error", "message": "bad json"}}
            )
            return
        path = self.path.split("?", 1)[0]
        if path.endswith("/count_tokens"):
            self._send_json(200, {"input_tokens": max(1, len(json.dumps(request)) // 4)})
            return
        if not path.endswith("/v1/messages"):
            self._send_json(404, {"type": "error", "error": {"type": "not_found_error", "message": path}})
            return
        self.server.record(request)
        reply = answer(request)
        if reply.sleep > 0 and not self._wait(reply.sleep):
            self.close_connection = True
            return  # the CLI hung up (an interrupt): nobody reads the answer
        model = str(request.get("model") or "scripted")
        if not request.get("stream"):
            self._send_json(
                200,
                {
                    "id": reply.message_id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": reply.blocks,
                    "stop_reason": reply.stop_reason,
                    "stop_sequence": None,
                    "usage": {"input_tokens": reply.input_tokens, "output_tokens": 10},
                },
            )
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.end_headers()
        for event, data in _sse_events(reply, model):
            self.wfile.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()
        self.close_connection = True


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(address, _Handler)
        # Requests are kept only when a test asks (`ScriptedModel.record`), and only the newest:
        # a server's offline model answers for as long as it runs, and what sessions sent it
        # (a deleted one's prompts included) must not pile up in its memory.
        self.requests: deque[dict[str, Any]] = deque(maxlen=0)
        self._lock = threading.Lock()

    def record(self, request: dict[str, Any]) -> None:
        if self.requests.maxlen:
            with self._lock:
                self.requests.append(request)


class ScriptedModel:
    """The scripted model server, on a loopback port of its own, in a background thread."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._server = _Server((host, port))
        self._thread = threading.Thread(target=self._server.serve_forever, name="scripted-model", daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def requests(self) -> list[dict[str, Any]]:
        """The newest Messages API requests received since `record` was called (for tests)."""
        return list(self._server.requests)

    def record(self, keep: int = 256) -> ScriptedModel:
        """From now on, keep the newest `keep` requests (0: none, the default) for `requests`."""
        with self._server._lock:
            self._server.requests = deque(self._server.requests, maxlen=keep)
        return self

    def start(self) -> ScriptedModel:
        self._thread.start()
        return self

    def stop(self) -> None:
        # shutdown() waits for serve_forever() to return, so it would block forever on a
        # server that was never started.
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()

    def __enter__(self) -> ScriptedModel:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    """Serves the scripted model in the foreground until interrupted."""
    parser = argparse.ArgumentParser(
        prog="python -m agent_rewind.testing.scripted_model",
        description="A scripted stand-in for the Anthropic Messages API (docs/scripted-model.md).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (default 0: a free one)")
    args = parser.parse_args(argv)
    model = ScriptedModel(args.host, args.port)
    print(f"ANTHROPIC_BASE_URL={model.base_url}", flush=True)
    try:
        model._server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        model._server.server_close()


if __name__ == "__main__":
    main()
