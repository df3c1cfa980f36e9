"""A guided tour of agent-rewind: three turns, a dry run, a rewind of files and conversation, a recall,
an undo and a fork.

Run `make run` in one terminal, then `make demo` (or `python scripts/demo.py --server HOST:PORT`) in
another. The demo reads the session's workspace directly, so it expects the server on this machine.
It uses the same client code as the `agent-rewind` CLI and prints the CLI command for each step.

Against a server that authenticates its callers, set the variables the CLI reads: $AGENT_REWIND_TOKEN
(the bearer token), and for TLS $AGENT_REWIND_TLS_CA (and $AGENT_REWIND_CLIENT_CERT with
$AGENT_REWIND_CLIENT_KEY for mutual TLS). The commands the demo prints then work as shown.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import textwrap
import uuid
from pathlib import Path

import grpc

from agent_rewind.api.v1 import rewind_pb2
from agent_rewind.client import (
    Client,
    TurnOutcome,
    UsageError,
    follow_turn,
    format_capabilities,
    format_points,
    format_rewind_result,
    format_session,
    render_rpc_error,
    resolve_credentials,
    resolve_server,
)

PROMPT_1 = "write notes.txt first draft\nwrite todo.txt buy milk\nsay I wrote two files"
PROMPT_2 = "edit notes.txt first draft => second draft\nsay I edited notes.txt"
PROMPT_3 = "write extra.txt created late\nsay one more file"
RECALL = "recall"
RECALL_PREFIX = "RECALL: "
WIDTH = 88


class Tour:
    """Narration, the equivalent CLI commands, and a tally of the checks along the way."""

    def __init__(self, client: Client, *, pause: bool) -> None:
        self.client = client
        self.pause = pause
        self.step = 0
        self.failures: list[str] = []

    def heading(self, title: str) -> None:
        if self.pause and self.step:
            input("\n(press Enter for the next step) ")
        self.step += 1
        label = f"── {self.step}. {title} "
        print(f"\n{label}{'─' * max(WIDTH - len(label), 3)}")

    def say(self, text: str) -> None:
        print(
            textwrap.fill(
                textwrap.dedent(text).strip(), WIDTH, break_on_hyphens=False, break_long_words=False
            )
        )
        print()

    def command(self, *argv: str) -> None:
        server = [] if self.client.server == resolve_server(None) else ["--server", self.client.server]
        print("$ " + shlex.join(["agent-rewind", *server, *argv]), flush=True)

    def check(self, ok: bool, what: str) -> None:
        print(f"{'✓' if ok else '✗'} {what}")
        if not ok:
            self.failures.append(what)

    def prompt(self, session_id: str, text: str) -> TurnOutcome:
        self.command("prompt", session_id, text)
        outcome = follow_turn(self.client.prompt(session_id, text), sys.stdout)
        self.check(outcome.ok, "the turn ended with a successful result")
        print()
        return outcome


def show_workspace(cwd: Path) -> dict[str, str]:
    """Print every regular file under the workspace (hidden ones aside) and return their contents."""
    files: dict[str, str] = {}
    for path in sorted(cwd.rglob("*")):
        rel = path.relative_to(cwd)
        if any(part.startswith(".") for part in rel.parts) or not path.is_file():
            continue
        files[rel.as_posix()] = path.read_text(errors="replace")
    if not files:
        print("  (no files)")
    for name, content in files.items():
        print(f"  {name:<12} {json.dumps(content, ensure_ascii=False)}")
    print()
    return files


def recalled_prompts(outcome: TurnOutcome) -> list[str] | None:
    """The prompts the scripted model says it sees, from its `RECALL: [...]` answer."""
    for text in outcome.assistant_texts:
        for line in text.splitlines():
            if line.startswith(RECALL_PREFIX):
                try:
                    value = json.loads(line.removeprefix(RECALL_PREFIX))
                except ValueError:
                    return None
                if isinstance(value, list):
                    return [str(v) for v in value]
    return None


def run(tour: Tour) -> None:
    client = tour.client

    tour.heading("What this server supports")
    tour.say(
        """
        agent-rewind hosts Claude Agent SDK sessions and can rewind them to any earlier prompt:
        the files the agent wrote, the conversation it remembers, or both. Clients first ask the
        server what it supports, instead of calling and catching errors.
        """
    )
    tour.command("capabilities")
    caps = client.capabilities()
    print(format_capabilities(caps))
    print()

    tour.heading("Create a session")
    tour.say(
        """
        A session is one agent conversation with its own working directory (its workspace). With no
        --cwd the server makes a fresh workspace for it. File checkpointing is on by default: before
        each prompt, the agent's file edits are checkpointed so they can be undone.
        """
    )
    tour.command("session", "create")
    session = client.create_session()
    print(format_session(session))
    print()
    sid = session.session_id
    cwd = Path(session.cwd)
    local = cwd.is_dir()
    if local:
        tour.say(
            f"""
            The workspace is {cwd}. It lives on the server's machine; this demo runs on the same
            machine, so it can show you the files directly.
            """
        )
    else:
        tour.say(
            f"""
            The workspace {cwd} is not visible from here: the server seems to run on another
            machine. The demo goes on, but cannot show or check the files.
            """
        )

    tour.heading("Three turns")
    tour.say(
        """
        Each prompt is one turn. The server streams the turn's messages as they happen: the prompt
        (with its message_id, which is also its rewind point), the assistant's text, its tool calls
        and their results, and a final result line. The offline scripted model follows one
        instruction per line: `write PATH TEXT`, `edit PATH OLD => NEW`, `say TEXT`.
        """
    )
    print("Turn 1 writes two files:")
    first = tour.prompt(sid, PROMPT_1)
    print("Turn 2 edits one of them:")
    second = tour.prompt(sid, PROMPT_2)
    print("Turn 3 creates one more:")
    tour.prompt(sid, PROMPT_3)

    if local:
        print("The workspace now holds:")
        before = show_workspace(cwd)
        tour.check(before.get("notes.txt") == "second draft\n", 'notes.txt says "second draft"')
        tour.check("extra.txt" in before, "extra.txt exists")

    tour.heading("Rewind points")
    tour.say(
        """
        Every prompt is a rewind point. Rewinding to a point restores the state just before that
        prompt was sent. `resume_at` is the last message before the prompt, where the conversation
        would pick up again (the first prompt has none, so its conversation cannot be rewound).
        `files` says whether a files rewind to that point can still be served. The footer's
        last_message_id is the newest message: pass it back with a rewind to make sure nobody else
        changed the session in between.
        """
    )
    tour.command("points", sid)
    points = client.list_all_points(sid)
    print(format_points(points.points, points.last_message_id))
    print()
    tour.check(len(points.points) == 3, "three rewind points, one per prompt")
    if len(points.points) < 2:
        tour.failures.append("too few rewind points to go on")
        return
    target = points.points[1]
    tour.check(
        [p.message_id for p in points.points[:2]] == [first.prompt_message_id, second.prompt_message_id],
        "points #0 and #1 carry the message_ids turns 1 and 2 streamed",
    )

    tour.heading("Preview the rewind (dry run)")
    tour.say(
        f"""
        We want to go back to just before prompt 2 ({target.message_id}), for files and conversation
        both. A dry run applies nothing: it reports what each half would do, or why it would be
        refused.
        """
    )
    both = rewind_pb2.REWIND_MODE_BOTH
    tour.command("rewind", sid, target.message_id, "--mode", "both", "--dry-run")
    preview = client.rewind(sid, target.message_id, both, dry_run=True)
    print(format_rewind_result(preview, both, dry_run=True))
    print()
    tour.check(preview.files.can_rewind and preview.conversation.can_rewind, "both halves can rewind")

    tour.heading("Rewind files and conversation")
    tour.say(
        """
        Now for real. Files go first: notes.txt gets its content from before prompt 2 back and
        extra.txt, created since, is deleted; todo.txt was written before the point and stays. Then
        the conversation: prompts 2 and 3 and their answers leave it (they are hidden, not deleted).
        The session keeps its id. `--expect-last` makes the rewind fail with REWIND_CONFLICT if the
        session moved on since we listed the points; `--request-id` makes a retry safe.
        """
    )
    request_id = str(uuid.uuid4())
    tour.command(
        "rewind",
        sid,
        target.message_id,
        "--mode",
        "both",
        "--expect-last",
        points.last_message_id,
        "--request-id",
        request_id,
    )
    result = client.rewind(
        sid,
        target.message_id,
        both,
        expected_last_message_id=points.last_message_id,
        request_id=request_id,
    )
    print(format_rewind_result(result, both, dry_run=False))
    print()
    tour.check(bool(result.rewind_id), "the rewind has an id")
    tour.check(result.conversation.rewound, "the conversation was rewound")

    if local:
        print("Files before the rewind:")
        for name, content in before.items():
            print(f"  {name:<12} {json.dumps(content, ensure_ascii=False)}")
        print("\nFiles after the rewind:")
        after = show_workspace(cwd)
        tour.check(after.get("notes.txt") == "first draft\n", 'notes.txt is back to "first draft"')
        tour.check("extra.txt" not in after, "extra.txt is gone")
        tour.check(after.get("todo.txt") == "buy milk\n", "todo.txt is untouched")

    tour.heading("What does the agent remember?")
    tour.say(
        """
        The scripted model answers `recall` with every prompt it can see in the conversation. After
        the rewind it should see prompt 1 and this recall, and nothing of prompts 2 and 3.
        """
    )
    recall = tour.prompt(sid, RECALL)
    seen = recalled_prompts(recall)
    if seen is None:
        print("(no RECALL answer: the server runs a real model, which answers in its own words)\n")
    else:
        tour.check(PROMPT_1 in seen, "the model still sees prompt 1")
        tour.check(PROMPT_2 not in seen and PROMPT_3 not in seen, "prompts 2 and 3 are forgotten")
        print()

    tour.heading("Rewind points after the rewind")
    tour.say(
        """
        The dropped prompts are no longer points; the new turn is. A rewind is durable: a server
        restart does not bring the dropped messages back.
        """
    )
    tour.command("points", sid)
    after_points = client.list_all_points(sid)
    print(format_points(after_points.points, after_points.last_message_id))
    print()
    ids = [p.message_id for p in after_points.points]
    tour.check(
        ids == [first.prompt_message_id, recall.prompt_message_id], "two points: prompt 1 and the recall"
    )

    tour.heading("Changed your mind? Undo a rewind")
    tour.say(
        """
        A rewind can be undone while no turn ran after it: the files and the conversation go back
        exactly as they were just before it. Here we rewind the files to before prompt 1, which
        empties the workspace of the agent's files, then undo that.
        """
    )
    files_mode = rewind_pb2.REWIND_MODE_FILES
    tour.command("rewind", sid, first.prompt_message_id, "--mode", "files")
    emptied = client.rewind(sid, first.prompt_message_id, files_mode)
    print(format_rewind_result(emptied, files_mode, dry_run=False))
    print()
    if local:
        tour.check("notes.txt" not in show_workspace(cwd), "notes.txt is gone")
    tour.command("undo", sid, emptied.rewind_id)
    undone = client.undo(sid, emptied.rewind_id)
    print(format_rewind_result(undone, files_mode, dry_run=False, undo=True))
    print()
    tour.check(undone.rewind_id == emptied.rewind_id, "the undo names the rewind it undid")
    if local:
        back = show_workspace(cwd)
        tour.check(back.get("notes.txt") == "first draft\n", 'notes.txt is back, "first draft"')

    tour.heading("Fork: try another direction without losing this one")
    tour.say(
        """
        A fork is a new session whose conversation and files are this one's, as they are now or
        just before a point. From then on the two live apart: what happens in one never shows in
        the other.
        """
    )
    tour.command("session", "fork", sid)
    fork = client.fork_session(sid)
    print(format_session(fork))
    print()
    forked = tour.prompt(fork.session_id, "write fork.txt only in the fork\nsay forked")
    tour.check(forked.result is not None and not forked.result.is_error, "the fork answers")
    if local:
        tour.check(Path(fork.cwd, "fork.txt").is_file(), "the fork wrote fork.txt in its own workspace")
        tour.check(not (cwd / "fork.txt").exists(), "the source's workspace is untouched")
    fork_recall = recalled_prompts(tour.prompt(fork.session_id, RECALL))
    if fork_recall is not None:
        tour.check(PROMPT_1 in fork_recall, "the fork remembers the source's conversation")

    tour.heading("Done")
    tour.command("session", "close", sid)
    closed = client.close_session(sid)
    print(format_session(closed))
    print()
    tour.say(
        f"""
        The session is closed; it can still be read and rewound, and a new prompt reopens it. Try
        `agent-rewind points {sid}`, `agent-rewind rewind {sid} MESSAGE_ID --mode files --dry-run`,
        or `agent-rewind --help`. docs/cli.md has every command.
        """
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None,
        epilog="Credentials come from $AGENT_REWIND_TOKEN and $AGENT_REWIND_TLS_CA, _CERT, _KEY, as for the CLI.",
    )
    parser.add_argument(
        "--server",
        metavar="HOST:PORT",
        help="the agent-rewind server (default $AGENT_REWIND_SERVER, else 127.0.0.1:50051)",
    )
    parser.add_argument("--pause", action="store_true", help="wait for Enter between steps")
    parser.add_argument(
        "--wait",
        type=float,
        default=180.0,
        metavar="SECONDS",
        help="how long to wait for the server to be serving (default 180: `make run` may still be installing)",
    )
    args = parser.parse_args(argv)
    server = resolve_server(args.server)
    try:
        credentials = resolve_credentials()  # the variables only: the demo has no credential flags
    except UsageError as err:
        parser.error(str(err))  # exits 2
    tls = credentials.tls is not None
    with Client(server, token=credentials.token, tls=credentials.tls) as client:

        def waiting() -> None:
            print(
                f"waiting for the server at {server} (start it with `make run` in another terminal; "
                f"up to {args.wait:.0f} s)...",
                file=sys.stderr,
                flush=True,
            )

        if not client.wait_until_serving(args.wait, waiting=waiting):
            print(
                f"error: no agent-rewind server is serving at {server} after {args.wait:.0f} s",
                file=sys.stderr,
            )
            return 1
        tour = Tour(client, pause=args.pause)
        try:
            run(tour)
        except grpc.RpcError as err:
            sys.stdout.flush()
            for line in render_rpc_error(err, server=server, tls=tls):
                print(line, file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130
    if tour.failures:
        print(f"\n{len(tour.failures)} check(s) failed:", file=sys.stderr)
        for what in tour.failures:
            print(f"  ✗ {what}", file=sys.stderr)
        return 1
    print("\nEvery check passed.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
