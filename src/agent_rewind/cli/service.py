"""`agent-rewind watch` and `capabilities`: the deployment's rewind events, and what it supports."""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

import grpc

from agent_rewind.cli.common import EXIT_INTERRUPTED, EXIT_RPC_ERROR, add_command, print_line
from agent_rewind.client import Client, format_capabilities, format_watch_response, render_rpc_error, to_json


def _cursor_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a cursor: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("a cursor is 0 (from the oldest event kept) or more")
    return value


def _capabilities(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    caps = client.capabilities()
    print_line(out, to_json(caps) if args.json else format_capabilities(caps))
    return 0


def _watch(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    """One line per response, flushed at once, until Ctrl-C or the stream ends. No reconnecting: a
    failure says the cursor to pass to --after, and the caller decides."""
    stream = client.watch_events(args.session_id or "", after_cursor=args.after)
    # The cursor a resumed watch passes to --after: the newest printed (an event's, or caught_up's).
    # Taken only once its line is out: a Ctrl-C in a write blocked on a full pipe must not skip it.
    last: int | None = None
    try:
        for response in stream:
            print_line(out, to_json(response, compact=True) if args.json else format_watch_response(response))
            kind = response.WhichOneof("response")
            if kind == "event":
                last = response.event.cursor
            elif kind == "caught_up":
                last = max(last or 0, response.caught_up.cursor)
    except KeyboardInterrupt:
        stream.cancel()
        if last is not None:
            sys.stderr.write(f"stopped watching; resume with --after {last}\n")
        return EXIT_INTERRUPTED
    except grpc.RpcError as err:
        out.flush()
        for line in render_rpc_error(err, server=client.server, tls=client.tls, resume_after=last):
            sys.stderr.write(line + "\n")
        return EXIT_RPC_ERROR
    resume = f"; resume with --after {last}" if last is not None else ""
    sys.stderr.write(f"the server ended the watch{resume}\n")
    return 0


def add_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """`watch` and `capabilities`."""
    watch = add_command(
        commands,
        "watch",
        _watch,
        "print rewind events as they happen, one line each, until Ctrl-C",
        common,
    )
    watch.epilog = (
        "Prints the events that changed sessions' history (rewound, undone, session deleted), one line "
        "each, flushed at once; a line `caught up at cursor N` marks the end of the replay. With --json, "
        "each WatchRewindEventsResponse as one JSON object per line. It does not reconnect: when the "
        "stream fails (exit 1), run it again with --after the last cursor printed; the events after it "
        "are replayed, as long as the server keeps them."
    )
    watch.add_argument(
        "session_id",
        metavar="SESSION",
        nargs="?",
        default="",
        help="only this session's events (default: all)",
    )
    watch.add_argument(
        "--after",
        type=_cursor_arg,
        default=None,
        metavar="CURSOR",
        help="first replay the events after CURSOR (0: from the oldest event kept), then follow live; "
        "pass the last cursor printed to resume. Default: only new events",
    )

    add_command(commands, "capabilities", _capabilities, "what this deployment supports", common)
