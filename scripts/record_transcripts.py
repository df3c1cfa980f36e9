"""Record real Claude Code transcripts for the rewind unit tests (tests/unit/transcript/data/).

Runs the bundled Claude Code CLI against the scripted model (no network), once per fixture,
with CLAUDE_CONFIG_DIR and HOME in a temporary directory. Each fixture directory gets the
transcript exactly as the CLI wrote it (gzipped, subagent transcripts included) and an
`expected.json` with the ground truth taken from the CLI's side, never from our parser: the
uuids the live stream reported for prompts, tool results, synthetic and subagent messages, the
SDK's own `get_session_messages()` view, and the CLI's answer to a files dry run for every user
message (`rewind_files` with `dry_run`), with the transcript size at the moment it answered.

Re-record when the SDK (and so the CLI) changes:

    .venv/bin/python scripts/record_transcripts.py            # every fixture
    .venv/bin/python scripts/record_transcripts.py rewinds    # one

This is the only place outside the session adapter allowed to use SDK internals: it sends the
`rewind_files` control request through `client._query` to get the CLI's dry-run answer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from claude_agent_sdk import (
    AssistantMessage,
    ClaudeAgentOptions,
    ClaudeSDKClient,
    Message,
    ResultMessage,
    ToolResultBlock,
    UserMessage,
    get_session_messages,
)
from claude_agent_sdk import __version__ as sdk_version
from claude_agent_sdk._cli_version import __cli_version__ as cli_version

import agent_rewind.testing.scripted_model as scripted_model
from agent_rewind.sessions.adapter import pin_leaf
from agent_rewind.testing import RECALL_PREFIX, ScriptedModel
from agent_rewind.transcript import compaction
from agent_rewind.transcript.index import TranscriptIndex

DATA = Path(__file__).resolve().parent.parent / "tests" / "unit" / "transcript" / "data"
# How long to let the CLI finish writing the transcript after a result before measuring it.
SETTLE_S = 0.3


# --- background tools ------------------------------------------------------------------------
# The scripted model always runs tools in the foreground. A background Bash is the simplest way
# to make the CLI inject a turn of its own (a task notification, marked with an `origin`), so the
# recorder adds one verb, `bgbash COMMAND`, on top of the model's language. Recording only.
_plan = scripted_model._plan


def _plan_with_background(prompt: str, cwd: str | None, tools: set[str]) -> list[Any]:
    background = any(line.strip().startswith("bgbash ") for line in prompt.splitlines())
    steps = _plan(prompt.replace("bgbash ", "bash "), cwd, tools)
    if background:
        for step in steps:
            if step.tool is not None and step.tool[0] == "Bash":
                step.tool[1]["run_in_background"] = True
    return steps


scripted_model._plan = _plan_with_background


# --- recording ---------------------------------------------------------------------------------
@dataclass
class TurnLog:
    """What the live stream said about one turn."""

    prompt: str
    prompt_uuid: str = ""
    assistant_ids: list[str] = field(default_factory=list)  # API ids (msg_...) of main-chain replies
    assistant_uuids: list[str] = field(default_factory=list)
    tool_results: list[str] = field(default_factory=list)
    synthetic: list[str] = field(default_factory=list)  # user messages the CLI made up
    subagent: list[str] = field(default_factory=list)  # uuids and msg ids of subagent messages
    result: str = ""
    texts: list[str] = field(default_factory=list)


class Recording:
    """One session in its own config dir, against one scripted model."""

    def __init__(self, name: str, model: ScriptedModel, root: Path) -> None:
        self.name = name
        self.model = model
        self.root = root / name
        self.workspace = self.root / "ws"
        self.config = self.root / "cfg"
        self.home = self.root / "home"
        for d in (self.workspace, self.config, self.home):
            d.mkdir(parents=True)
        self.session_id = str(uuid.uuid4())
        self.turns: list[TurnLog] = []
        self.dropped: set[str] = set()  # prompt uuids a conversation rewind dropped
        self.expected: dict[str, Any] = {
            "session_id": self.session_id,
            "sdk_version": sdk_version,
            "cli_version": cli_version,
            "checkpoint_window": 100,
        }

    @property
    def transcript(self) -> Path:
        # The CLI names the project directory after the cwd with every non-alphanumeric as "-".
        found = sorted((self.config / "projects").glob(f"*/{self.session_id}.jsonl"))
        assert len(found) == 1, found
        return found[0]

    def options(self, **kwargs: Any) -> ClaudeAgentOptions:
        return ClaudeAgentOptions(
            cwd=str(self.workspace),
            enable_file_checkpointing=True,
            permission_mode="acceptEdits",
            extra_args={"replay-user-messages": None},
            env={
                "ANTHROPIC_BASE_URL": self.model.base_url,
                "ANTHROPIC_API_KEY": "scripted",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "CLAUDE_CONFIG_DIR": str(self.config),
                "HOME": str(self.home),
            },
            **kwargs,
        )

    @contextlib.asynccontextmanager
    async def client(self, **kwargs: Any) -> AsyncIterator[ClaudeSDKClient]:
        if not self.turns and "resume" not in kwargs:
            kwargs.setdefault("session_id", self.session_id)
        async with ClaudeSDKClient(self.options(**kwargs)) as client:
            yield client

    def _log(self, log: TurnLog, msg: Message) -> None:
        if isinstance(msg, UserMessage):
            if msg.parent_tool_use_id is not None:
                log.subagent.append(str(msg.uuid))
            elif not log.prompt_uuid and msg.content == log.prompt:
                log.prompt_uuid = str(msg.uuid)
            elif isinstance(msg.content, list) and any(isinstance(b, ToolResultBlock) for b in msg.content):
                log.tool_results.append(str(msg.uuid))
            else:
                log.synthetic.append(str(msg.uuid))
        elif isinstance(msg, AssistantMessage):
            if msg.parent_tool_use_id is not None:
                log.subagent.extend([str(msg.uuid), str(msg.message_id)])
            else:
                log.assistant_ids.append(str(msg.message_id))
                log.assistant_uuids.append(str(msg.uuid))
                log.texts.extend(getattr(b, "text", "") for b in msg.content)
        elif isinstance(msg, ResultMessage):
            log.result = msg.subtype

    async def turn(
        self,
        client: ClaudeSDKClient,
        prompt: str,
        *,
        during: Callable[[ClaudeSDKClient], Awaitable[None]] | None = None,
    ) -> TurnLog:
        """Send one prompt and log its messages up to the result."""
        log = TurnLog(prompt)
        await client.query(prompt)
        if during is not None:
            await during(client)
        async for msg in client.receive_response():
            self._log(log, msg)
        # A slash command is run by the CLI itself and never replayed as a prompt.
        assert log.prompt_uuid or prompt.startswith("/"), f"no replay of the prompt {prompt!r}"
        self.turns.append(log)
        await asyncio.sleep(SETTLE_S)
        return log

    async def drain_injected_turn(self, client: ClaudeSDKClient, into: TurnLog) -> None:
        """Consume a turn the CLI starts on its own (a background task's notification)."""
        async with asyncio.timeout(30):
            async for msg in client.receive_response():
                self._log(into, msg)
        await asyncio.sleep(SETTLE_S)

    async def dry_run(self, client: ClaudeSDKClient, message_id: str) -> dict[str, Any]:
        # SDK internal: the public rewind_files() drops the CLI's answer (SDK-FACTS.md).
        request = {"subtype": "rewind_files", "user_message_id": message_id, "dry_run": True}
        assert client._query is not None, "connect first"
        answer: dict[str, Any] = await client._query._send_control_request(request)
        return answer

    async def checkpoints(self, client: ClaudeSDKClient, label: str, *, prompts_only: bool = False) -> None:
        """The CLI's dry-run answer for every message seen so far, with the transcript size."""
        await asyncio.sleep(SETTLE_S)
        ids = [t.prompt_uuid for t in self.turns if t.prompt_uuid]
        if not prompts_only:
            ids += [u for t in self.turns for u in (*t.tool_results, *t.synthetic, *t.assistant_uuids)]
        answers = {i: bool((await self.dry_run(client, i)).get("canRewind")) for i in ids}
        self.expected.setdefault("checkpoints", []).append(
            {"label": label, "size": self.transcript.stat().st_size, "can_rewind": answers}
        )

    def uuids_where(self, predicate: Callable[[dict[str, Any]], bool]) -> list[str]:
        entries = (json.loads(line) for line in self.transcript.read_text().splitlines())
        return [str(e["uuid"]) for e in entries if e.get("uuid") and predicate(e)]

    def entry(self, uuid_: str) -> dict[str, Any]:
        """One transcript entry by uuid (to find a prompt's parentUuid for resume_session_at)."""
        for line in self.transcript.read_text().splitlines():
            entry: dict[str, Any] = json.loads(line)
            if entry.get("uuid") == uuid_:
                return entry
        raise KeyError(uuid_)

    @contextlib.asynccontextmanager
    async def rewound(self, to: TurnLog) -> AsyncIterator[ClaudeSDKClient]:
        """A client resumed at the entry before `to`: the conversation rewind the service does."""
        anchor = self.entry(to.prompt_uuid)["parentUuid"]
        assert anchor, "the first prompt has nothing to resume at"
        at = self.turns.index(to)
        self.dropped.update(t.prompt_uuid for t in self.turns[at:] if t.prompt_uuid not in self.dropped)
        await asyncio.sleep(SETTLE_S)  # the previous process may still be writing its last lines
        size_before = self.transcript.stat().st_size
        async with self.client(resume=self.session_id, resume_session_at=anchor) as client:
            await asyncio.sleep(SETTLE_S)
            with self.transcript.open("rb") as f:
                f.seek(size_before)
                written = [json.loads(line).get("type") for line in f.read().splitlines()]
            self.expected.setdefault("rewinds", []).append(
                {
                    "to": to.prompt_uuid,
                    "anchor": anchor,
                    "anchor_type": self.entry(anchor)["type"],
                    "size_before": size_before,
                    "written_on_connect": written,
                }
            )
            yield client

    def visible_turns(self) -> list[TurnLog]:
        return [t for t in self.turns if t.prompt_uuid and t.prompt_uuid not in self.dropped]

    def save(self, **extra: Any) -> None:
        """Copy the transcript (and subagent transcripts) and write expected.json."""
        previous = os.environ.get("CLAUDE_CONFIG_DIR")
        os.environ["CLAUDE_CONFIG_DIR"] = str(self.config)  # get_session_messages reads it
        try:
            sdk_messages = get_session_messages(self.session_id, directory=str(self.workspace))
        finally:
            if previous is None:
                os.environ.pop("CLAUDE_CONFIG_DIR", None)
            else:
                os.environ["CLAUDE_CONFIG_DIR"] = previous
        self.expected.update(
            {
                "transcript": f"{self.session_id}.jsonl.gz",
                "size": self.transcript.stat().st_size,
                "turns": [
                    {
                        "prompt": t.prompt,
                        "uuid": t.prompt_uuid,
                        "visible": t.prompt_uuid not in self.dropped,
                        "assistant_ids": t.assistant_ids,
                        "assistant_uuids": t.assistant_uuids,
                        "tool_results": t.tool_results,
                        "synthetic": t.synthetic,
                        "subagent": t.subagent,
                        "result": t.result,
                    }
                    for t in self.turns
                ],
                "visible_prompts": [t.prompt_uuid for t in self.visible_turns()],
                "sdk_messages": [{"uuid": m.uuid, "type": m.type} for m in sdk_messages],
                **extra,
            }
        )
        out = DATA / self.name
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        source = self.transcript.parent
        for path in sorted(source.rglob("*")):
            if path.is_dir() or not (path.name.startswith(self.session_id) or "subagents" in path.parts):
                continue
            target = out / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            if path.suffix == ".jsonl":
                # mtime=0 and no name: the same transcript always gives the same bytes.
                with (
                    path.open("rb") as src,
                    Path(f"{target}.gz").open("wb") as raw,
                    gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as dst,
                ):
                    shutil.copyfileobj(src, dst)
            else:
                shutil.copyfile(path, target)
        (out / "expected.json").write_text(json.dumps(self.expected, indent=1) + "\n")
        print(f"{self.name}: {len(self.turns)} turns, {self.transcript.stat().st_size} bytes -> {out}")


def recalled(log: TurnLog) -> list[str]:
    """The prompts the model saw, from a `recall` turn's answer."""
    for text in log.texts:
        if text.startswith(RECALL_PREFIX):
            prompts: list[str] = json.loads(text[len(RECALL_PREFIX) :])
            return prompts
    raise AssertionError(f"no recall in {log.texts!r}")


# --- fixtures ----------------------------------------------------------------------------------
async def plain(rec: Recording) -> None:
    """Three chat turns, then a recall: the simplest session."""
    async with rec.client() as c:
        for prompt in ("say one", "say two", "say three", "recall"):
            last = await rec.turn(c, prompt)
        await rec.checkpoints(c, "end")
    rec.save(recall=recalled(last))


async def tools(rec: Recording) -> None:
    """Several tool calls in one turn, Bash, Read, and a foreground subagent that writes a file."""
    async with rec.client() as c:
        await rec.turn(
            c,
            "say starting\nwrite a.txt hello\nwrite b.txt bee\nedit a.txt hello => hi\nsay wrote and edited",
        )
        await rec.turn(c, "bash echo hi > c.txt\nsay ran bash")
        await rec.turn(c, "agent write d.txt dee\\nbash ls\\nsay sub done\nsay delegated")
        await rec.turn(c, "read a.txt\nsay read it")
        await rec.checkpoints(c, "end")
    rec.save()


async def synthetic(rec: Recording) -> None:
    """Turns where the CLI writes user messages nobody typed."""

    async def interrupt_soon(client: ClaudeSDKClient) -> None:
        await asyncio.sleep(1.0)
        await client.interrupt()

    async with rec.client() as c:
        await rec.turn(c, "write a.txt one\nsay wrote")
        # An answer with no visible text: the CLI adds an isMeta "[Your previous response had no
        # visible output...]" prompt and asks again.
        await rec.turn(c, "say")
        # Interrupted mid-turn: the CLI writes "[Request interrupted by user]".
        await rec.turn(c, "say slow\nsleep 3", during=interrupt_soon)
        # A background command: when it ends, the CLI runs a turn of its own for the
        # task notification, a user entry with an `origin`.
        bg = await rec.turn(c, "bgbash sleep 1; echo bg > bg.txt\nsay started")
        await rec.drain_injected_turn(c, bg)
        # The stream does not replay the injected prompt: find it by its text.
        bg.synthetic += rec.uuids_where(
            lambda e: str(e.get("message", {}).get("content")).startswith("<task-")
        )
        await rec.turn(c, "say last")
        await rec.checkpoints(c, "end")
    rec.save()


async def compact(rec: Recording) -> None:
    """/compact cuts the chain: the CLI cannot resume at an entry from before it."""
    async with rec.client() as c:
        await rec.turn(c, "say one")
        before = await rec.turn(c, "write a.txt A\nsay wrote")
        await rec.turn(c, "/compact")
        # Compaction starts a new chain (its boundary has no parentUuid): the prompts before it
        # leave the conversation the SDK shows; the service keeps them as compacted points.
        compacted = [t.prompt_uuid for t in rec.turns if t.prompt_uuid]
        rec.dropped.update(compacted)
        after = await rec.turn(c, "say after compact")
        last = await rec.turn(c, "recall")
        await rec.checkpoints(c, "end")
    anchor = rec.entry(before.prompt_uuid)["parentUuid"]
    error = ""
    try:
        async with rec.client(resume=rec.session_id, resume_session_at=anchor):
            pass
    except Exception as exc:  # the CLI refuses; keep its words for the lead
        error = str(exc).splitlines()[0]
    async with rec.client(resume=rec.session_id) as c:
        await rec.checkpoints(c, "fresh process")
    # After compaction the conversation can still be rewound, here to an anchor that is an
    # attachment entry (the first post-compact prompt's parent).
    async with rec.rewound(after) as c:
        again = await rec.turn(c, "recall")
        await rec.checkpoints(c, "after rewind")
    # (The CLI merges consecutive user entries into one API message, hence the substring checks.)
    seen = recalled(again)
    assert not any(after.prompt in text for text in seen) and seen[-1].endswith(last.prompt), seen
    rec.save(
        recall=recalled(again),
        pre_compact_resume_error=error,
        pre_compact_anchor=anchor,
        compacted_prompts=compacted,
    )


async def compactions(rec: Recording) -> None:
    """A /compact, then one the CLI starts by itself; then the conversation resumed from before
    each, through the service's copy of it (transcript/compaction.py), the model recalling what
    it sees."""
    async with rec.client() as c:
        one = await rec.turn(c, "say one")
        first = await rec.turn(c, "write a.txt A\nsay wrote")
        await rec.turn(c, "/compact")
        b_one = await rec.turn(c, "say b one")
        # A long context reported: the CLI compacts by itself before the next prompt.
        second = await rec.turn(c, "context 1000000\nsay b two")
        await rec.turn(c, "say c one")
        last = await rec.turn(c, "recall")
    boundaries = [e for e in _entries(rec.transcript) if e.get("subtype") == "compact_boundary"]
    assert [b["compactMetadata"]["trigger"] for b in boundaries] == ["manual", "auto"], boundaries
    resumes = []
    for target in (first, second):
        await asyncio.sleep(SETTLE_S)
        index = TranscriptIndex(rec.transcript)
        index.refresh()
        anchor = rec.entry(target.prompt_uuid)["parentUuid"]
        size_before = rec.transcript.stat().st_size
        plan = compaction.plan_resume(index, anchor)
        assert plan.lines, "an entry before the newest compaction needs a copy"
        compaction.append(rec.transcript, plan.lines)
        pin_leaf(rec.transcript, rec.session_id, plan.at)
        async with rec.client(resume=rec.session_id, resume_session_at=plan.at) as c:
            seen = await rec.turn(c, "recall")
        resumes.append(
            {
                "to": target.prompt_uuid,
                "anchor": anchor,
                "copy_anchor": plan.at,
                "size_before": size_before,
                "recall": recalled(seen),
                "recall_prompt": seen.prompt_uuid,
                "size_after": rec.transcript.stat().st_size,
            }
        )
    # The conversation now: the copy of the one from before the second compaction, then the last
    # recall. Its prompts before the first compaction are compacted points, under their own ids.
    rec.dropped.update(t.prompt_uuid for t in rec.turns if t.prompt_uuid)
    rec.save(
        recall=recalled(last),
        resumes=resumes,
        compacted_prompts=[one.prompt_uuid, first.prompt_uuid],
        visible_prompts=[b_one.prompt_uuid, resumes[-1]["recall_prompt"]],
    )


def _entries(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def rewinds(rec: Recording) -> None:
    """Two conversation rewinds, the second to a prompt made after the first.

    Prompts 0..3, rewind to 2; prompts 4..6, rewind to 5; prompt 7 recalls. Visible: 0, 1, 4, 7.
    Turn 3 (dropped by the first rewind) ran a subagent, so its messages are abandoned too.
    """
    async with rec.client() as c:
        await rec.turn(c, "write a.txt one\nsay wrote a")
        await rec.turn(c, "agent write s.txt sub\\nsay sub done\nsay delegated")
        p2 = await rec.turn(c, "edit a.txt one => two\nsay edited")
        await rec.turn(c, "agent say deep\nsay delegated again")
        await rec.checkpoints(c, "before first rewind")
    async with rec.rewound(p2) as c:
        await rec.turn(c, "say five after rewind")
        p5 = await rec.turn(c, "write c.txt cee\nsay six")
        await rec.turn(c, "say seven")
        await rec.checkpoints(c, "before second rewind")
    async with rec.rewound(p5) as c:
        last = await rec.turn(c, "recall")
        await rec.checkpoints(c, "end")
    expected = [t.prompt for t in rec.visible_turns()]
    assert recalled(last) == expected, (recalled(last), expected)
    rec.save(recall=recalled(last))


async def window(rec: Recording, prompts: int = 110, rewind_to: int = 60, after: int = 5) -> None:
    """More prompts than the file-checkpoint window, then a rewind and a few more prompts.

    The CLI keeps checkpoints for the 100 most recent prompts. Its answers are recorded three
    times: in the process that made the prompts, in the process that rewound and went on, and
    in a fresh process resumed afterwards.
    """
    async with rec.client() as c:
        for i in range(prompts):
            await rec.turn(c, f"write f{i % 3}.txt v{i}\nsay w{i}" if i % 10 == 0 else f"say {i}")
        await rec.checkpoints(c, "live, before rewind", prompts_only=True)
    async with rec.rewound(rec.turns[rewind_to]) as c:
        await rec.checkpoints(c, "rewound, before the next prompt", prompts_only=True)
        for i in range(after):
            await rec.turn(c, f"say after {i}")
        await rec.checkpoints(c, "live, after rewind", prompts_only=True)
    async with rec.client(resume=rec.session_id) as c:
        await rec.checkpoints(c, "fresh process", prompts_only=True)
    rec.save()


FIXTURES: dict[str, Callable[[Recording], Awaitable[None]]] = {
    "plain": plain,
    "tools": tools,
    "synthetic": synthetic,
    "compact": compact,
    "compactions": compactions,
    "rewinds": rewinds,
    "window": window,
}


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="record-transcripts-"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def main(names: list[str]) -> None:
    with scratch() as root, ScriptedModel() as model:
        for name in names:
            started = time.monotonic()
            await FIXTURES[name](Recording(name, model, root))
            print(f"  {time.monotonic() - started:.1f}s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "fixtures", nargs="*", metavar="FIXTURE", help=f"any of {', '.join(FIXTURES)}; default all"
    )
    args = parser.parse_args()
    unknown = sorted(set(args.fixtures) - set(FIXTURES))
    if unknown:
        parser.error(f"unknown fixtures: {', '.join(unknown)}")
    asyncio.run(main(args.fixtures or list(FIXTURES)))
