"""`agent-rewind prompt`, `rewind`, `undo` and `points`: run a turn, and move a session's history.

These are the commands that take a rewind mode and a conflict policy (and, for `rewind`, a scope
and the paths it is narrowed to).
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

import grpc

from agent_rewind.api.v1 import rewind_pb2, session_service_pb2
from agent_rewind.cli.common import (
    EXIT_INTERRUPTED,
    EXIT_RPC_ERROR,
    PROG,
    add_command,
    add_paging,
    print_line,
)
from agent_rewind.client import (
    MODES,
    SCOPES,
    TOOL_OUTPUT_BYTES,
    TOOL_OUTPUT_LINES,
    Client,
    UsageError,
    follow_turn,
    format_points,
    format_rewind_result,
    parse_mode,
    parse_scope,
    read_prompt_text,
    render_rpc_error,
    to_json,
)


def _mode_arg(text: str) -> rewind_pb2.RewindMode.ValueType:
    try:
        return parse_mode(text)
    except UsageError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _scope_arg(text: str) -> rewind_pb2.RewindScope.ValueType:
    try:
        return parse_scope(text)
    except UsageError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


# `rewind --conflicts`: what a files rewind does with a path also changed outside the agent.
CONFLICT_POLICIES: dict[str, rewind_pb2.ConflictPolicy.ValueType] = {
    "refuse": rewind_pb2.CONFLICT_POLICY_REFUSE,
    "skip": rewind_pb2.CONFLICT_POLICY_SKIP,
    "overwrite": rewind_pb2.CONFLICT_POLICY_OVERWRITE,
}


def _conflicts_arg(text: str) -> rewind_pb2.ConflictPolicy.ValueType:
    try:
        return CONFLICT_POLICIES[text.strip().lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(
            f"not a conflict policy: {text!r} (choose from {', '.join(CONFLICT_POLICIES)})"
        ) from None


def _prompt(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    text = read_prompt_text(args.text)
    rewind = None
    if args.rewind_to:
        rewind = session_service_pb2.PromptRewind(
            message_id=args.rewind_to, mode=args.mode, conflict_policy=args.conflicts
        )
        if args.expect_last is not None:
            rewind.expected_last_message_id = args.expect_last
    elif args.mode is not None or args.expect_last is not None:
        raise UsageError("--mode and --expect-last go with --rewind-to")
    stream = client.prompt(args.session_id, text, request_id=args.request_id or "", rewind=rewind)
    try:
        outcome = follow_turn(stream, out, json_lines=args.json, full=args.full)
    except KeyboardInterrupt:
        stream.cancel()
        sys.stderr.write(
            "stopped listening; the turn runs on to its end on the server "
            f"(`{PROG} session interrupt {args.session_id}` stops it)\n"
        )
        return EXIT_INTERRUPTED
    if outcome.result is None:
        sys.stderr.write("error: the turn's stream ended without a result\n")
        return EXIT_RPC_ERROR
    return EXIT_RPC_ERROR if outcome.result.is_error else 0


# Codes for which undo without REWIND_ID cannot read the events that name the latest rewind.
_NO_EVENTS = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNIMPLEMENTED)


def _latest_rewind(session_id: str, client: Client) -> str | None:
    """The session's latest rewind (its events, replayed), or None after saying on stderr why not."""
    try:
        rewind_id = client.latest_rewind_id(session_id)
    except grpc.RpcError as err:
        for line in render_rpc_error(err, server=client.server, tls=client.tls):
            sys.stderr.write(line + "\n")
        if err.code() in _NO_EVENTS:
            sys.stderr.write(
                "hint: undo without REWIND_ID reads the session's events (WatchRewindEvents) to find "
                "its latest rewind; pass REWIND_ID, the rewind_id the rewind printed\n"
            )
        return None
    if rewind_id is None:
        sys.stderr.write(
            f"error: session {session_id} has no rewind to undo (none among the events the server keeps); "
            "pass REWIND_ID to name one\n"
        )
    return rewind_id


def _undo(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    rewind_id = args.rewind_id or _latest_rewind(args.session_id, client)
    if rewind_id is None:
        return EXIT_RPC_ERROR
    result = client.undo(
        args.session_id,
        rewind_id,
        validate_only=args.dry_run,
        request_id=args.request_id or "",
        conflict_policy=args.conflicts,
    )
    if args.json:
        print_line(out, to_json(result))
        return 0
    files, conversation = result.files.requested, result.conversation.requested
    mode = (
        rewind_pb2.REWIND_MODE_BOTH
        if files and conversation
        else rewind_pb2.REWIND_MODE_CONVERSATION
        if conversation
        else rewind_pb2.REWIND_MODE_FILES
    )
    print_line(out, format_rewind_result(result, mode, dry_run=args.dry_run, undo=True))
    return 0


def _points(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    if args.all:
        response = client.list_all_points(args.session_id, page_size=args.page_size)
    else:
        response = client.list_points(args.session_id, page_size=args.page_size, page_token=args.page_token)
    if args.json:
        print_line(out, to_json(response))
        return 0
    print_line(out, format_points(response.points, response.last_message_id))
    if response.next_page_token:
        print_line(out, f"more: --page-token {response.next_page_token} (or --all)")
    return 0


def _rewind(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    if args.diff and not args.dry_run:
        raise UsageError("--diff needs --dry-run: only a preview shows what a rewind would change")
    if args.scope == rewind_pb2.REWIND_SCOPE_TURN and args.mode != rewind_pb2.REWIND_MODE_FILES:
        raise UsageError(
            "--scope turn needs --mode files: a revert of one turn changes files, never the conversation"
        )
    result = client.rewind(
        args.session_id,
        args.message_id,
        args.mode,
        dry_run=args.dry_run,
        expected_last_message_id=args.expect_last,
        request_id=args.request_id or "",
        conflict_policy=args.conflicts,
        include_diff=args.diff,
        paths=args.paths,
        scope=args.scope,
    )
    if args.json:
        print_line(out, to_json(result))
        return 0
    print_line(
        out, format_rewind_result(result, args.mode, dry_run=args.dry_run, scope=args.scope, paths=args.paths)
    )
    return 0


def add_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """`prompt`, `undo`, `points` and `rewind`."""
    prompt = add_command(
        commands, "prompt", _prompt, "run one turn and print its messages as they arrive", common
    )
    prompt.add_argument("session_id", metavar="SESSION")
    prompt.add_argument("text", metavar="TEXT", help="the prompt, or - to read it from stdin")
    prompt.add_argument(
        "--full",
        action="store_true",
        help="show every tool result whole (default: a Bash command's output up to "
        f"{TOOL_OUTPUT_LINES} lines or {TOOL_OUTPUT_BYTES // 1024} KiB, any other result's first line)",
    )
    prompt.add_argument(
        "--request-id",
        metavar="UUID",
        help="a retry with the same id re-attaches to the turn it started instead of running another",
    )
    prompt.add_argument(
        "--rewind-to",
        metavar="MESSAGE_ID",
        help="rewind to this point first, in the same step (edit a prompt): nothing can slip in between",
    )
    prompt.add_argument(
        "--mode",
        type=_mode_arg,
        default=None,
        metavar="|".join(MODES),
        help="with --rewind-to: what to restore",
    )
    prompt.add_argument(
        "--conflicts",
        type=_conflicts_arg,
        default=rewind_pb2.CONFLICT_POLICY_UNSPECIFIED,
        metavar="|".join(CONFLICT_POLICIES),
        help="with --rewind-to: what to do with a path also changed outside the agent",
    )
    prompt.add_argument(
        "--expect-last",
        metavar="ID",
        default=None,
        help="with --rewind-to: refuse unless this is the newest message",
    )

    undo = add_command(
        commands,
        "undo",
        _undo,
        "undo the session's latest rewind (files and conversation back as they were), while no turn ran after it",
        common,
    )
    undo.add_argument("session_id", metavar="SESSION")
    undo.add_argument(
        "rewind_id",
        metavar="REWIND_ID",
        nargs="?",
        default=None,
        help="the rewind to undo, which must be the session's latest (default: the latest, found in the "
        "session's events)",
    )
    undo.add_argument("--dry-run", action="store_true", help="preview: apply nothing (validate_only)")
    undo.add_argument(
        "--conflicts",
        type=_conflicts_arg,
        default=rewind_pb2.CONFLICT_POLICY_UNSPECIFIED,
        metavar="|".join(CONFLICT_POLICIES),
        help="what to do with a file changed since the rewind: refuse (the default), skip, overwrite",
    )
    undo.add_argument("--request-id", metavar="UUID", help="a retry with the same id applies nothing again")

    points = add_command(commands, "points", _points, "list a session's rewind points, oldest first", common)
    points.add_argument("session_id", metavar="SESSION")
    add_paging(points)

    rewind = add_command(commands, "rewind", _rewind, "rewind a session to a prompt (or preview it)", common)
    rewind.add_argument("session_id", metavar="SESSION")
    rewind.add_argument(
        "message_id", metavar="MESSAGE_ID", help="a rewind point's message_id (or a msg_... id)"
    )
    rewind.add_argument(
        "--mode", type=_mode_arg, required=True, metavar="|".join(MODES), help="what to restore"
    )
    rewind.add_argument("--dry-run", action="store_true", help="preview: apply nothing")
    rewind.add_argument(
        "--diff",
        action="store_true",
        help="with --dry-run: also print each path's change and its unified diff",
    )
    rewind.add_argument(
        "--path",
        dest="paths",
        action="append",
        default=[],
        metavar="PATH",
        help="narrow the files half to this file or directory (and what is under it), relative to "
        "the workspace; repeat for more. Every other path keeps its content, and --dry-run "
        "previews only these",
    )
    rewind.add_argument(
        "--scope",
        type=_scope_arg,
        default=rewind_pb2.REWIND_SCOPE_UNSPECIFIED,
        metavar="|".join(SCOPES),
        help="since (the default): undo everything since the prompt; turn: revert only what that "
        "prompt's turn changed in files, merged with what changed them since (later turns' and "
        "people's changes stay). turn needs --mode files",
    )
    rewind.add_argument(
        "--conflicts",
        type=_conflicts_arg,
        default=rewind_pb2.CONFLICT_POLICY_UNSPECIFIED,
        metavar="|".join(CONFLICT_POLICIES),
        help="what to do with a path also changed outside the agent (with --scope turn: a file "
        "changed since in the lines the turn changed, or as a whole): refuse the files half (the "
        "default), skip the path, or overwrite the change",
    )
    rewind.add_argument(
        "--expect-last", metavar="ID", default=None, help="refuse unless this is still the newest message"
    )
    rewind.add_argument("--request-id", metavar="UUID", help="a retry with the same id applies nothing again")
