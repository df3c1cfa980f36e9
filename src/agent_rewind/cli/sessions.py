"""`agent-rewind session ...`: create, list, show, close, interrupt, delete and fork sessions."""

from __future__ import annotations

import argparse
import json
import os
from typing import TextIO

from agent_rewind.cli.common import add_command, add_paging, print_line
from agent_rewind.client import Client, build_options, format_session, format_sessions, to_json


def _session_create(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    options = build_options(args.option or (), args.options_json)
    # A relative --cwd means relative to where the command runs; the server resolves paths on its own machine.
    cwd = os.path.abspath(args.cwd) if args.cwd else ""
    session = client.create_session(
        cwd=cwd,
        session_id=args.session_id or "",
        options=options,
        file_checkpointing=False if args.no_checkpointing else None,
        workspace_snapshots=args.workspace_snapshots,
        request_id=args.request_id or "",
    )
    print_line(out, to_json(session) if args.json else format_session(session))
    return 0


def _session_list(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    if args.all:
        response = client.list_all_sessions(page_size=args.page_size)
    else:
        response = client.list_sessions(page_size=args.page_size, page_token=args.page_token)
    if args.json:
        print_line(out, to_json(response))
        return 0
    print_line(out, format_sessions(response.sessions))
    if response.next_page_token:
        print_line(out, f"more: --page-token {response.next_page_token} (or --all)")
    return 0


def _session_show(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    session = client.get_session(args.session_id)
    print_line(out, to_json(session) if args.json else format_session(session))
    return 0


def _session_close(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    session = client.close_session(args.session_id)
    print_line(out, to_json(session) if args.json else format_session(session))
    return 0


def _session_delete(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    client.delete_session(args.session_id, delete_workspace=args.workspace, request_id=args.request_id or "")
    if args.json:
        print_line(
            out,
            json.dumps({"session_id": args.session_id, "deleted": True, "workspace_deleted": args.workspace}),
        )
    else:
        print_line(out, f"deleted {args.session_id}" + (" and its workspace" if args.workspace else ""))
    return 0


def _session_interrupt(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    session = client.interrupt(args.session_id)
    print_line(out, to_json(session) if args.json else format_session(session))
    return 0


def _session_fork(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    session = client.fork_session(
        args.session_id,
        args.message_id or "",
        new_session_id=args.id or "",
        cwd=args.cwd or "",
        request_id=args.request_id or "",
    )
    print_line(out, to_json(session) if args.json else format_session(session))
    return 0


def add_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """The `session` group and its actions."""
    session = commands.add_parser("session", help="create, list, show, close, interrupt or delete sessions")
    session_commands = session.add_subparsers(dest="session_command", metavar="ACTION", required=True)

    create = add_command(session_commands, "create", _session_create, "register a session", common)
    create.add_argument(
        "--cwd", metavar="DIR", help="the workspace (default: a fresh one of the session's own)"
    )
    create.add_argument(
        "--session-id", metavar="UUID", help="the SDK session id to use (default: the server's)"
    )
    create.add_argument(
        "--no-checkpointing",
        action="store_true",
        help="track no files: no file checkpoints and, unless --workspace-snapshots, no snapshots "
        "(files rewinds are refused)",
    )
    create.add_argument(
        "--workspace-snapshots",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="snapshot the whole workspace at each turn, so files rewinds cover Bash and subagent "
        "edits (default: the server's)",
    )
    create.add_argument(
        "--option",
        action="append",
        metavar="KEY=JSON",
        help="an SDK option; VALUE is read as JSON, else as a plain string (repeatable)",
    )
    create.add_argument("--options-json", metavar="'{...}'", help="SDK options as one JSON object")
    create.add_argument("--request-id", metavar="UUID", help="makes a retried create idempotent")

    listing = add_command(session_commands, "list", _session_list, "list sessions, newest first", common)
    add_paging(listing)
    for name, handler, help_text in (
        ("show", _session_show, "show one session"),
        ("close", _session_close, "end the session's live SDK client; the transcript stays"),
        ("interrupt", _session_interrupt, "stop the turn in flight, if any"),
    ):
        add_command(session_commands, name, handler, help_text, common).add_argument(
            "session_id", metavar="ID"
        )
    delete = add_command(
        session_commands,
        "delete",
        _session_delete,
        "erase the session for good: its transcript with every hidden branch, subagent transcripts, "
        "file backups and workspace snapshots; then it is not found",
        common,
    )
    fork = add_command(
        session_commands,
        "fork",
        _session_fork,
        "a new session whose conversation and files are this one's just before a point (or as they are)",
        common,
    )
    fork.add_argument("session_id", metavar="ID")
    fork.add_argument(
        "message_id", metavar="MESSAGE_ID", nargs="?", help="the point to fork at; none: the whole session"
    )
    fork.add_argument("--id", metavar="UUID", help="the new session's id (default: one is chosen)")
    fork.add_argument("--cwd", metavar="DIR", help="the new session's workspace (default: a fresh one)")
    fork.add_argument("--request-id", metavar="UUID", help="a retry with the same id returns the same fork")
    delete.add_argument("session_id", metavar="ID")
    delete.add_argument("--workspace", action="store_true", help="delete its workspace directory too")
    delete.add_argument(
        "--request-id", metavar="UUID", help="a retry with the same id answers as the first delete did"
    )
