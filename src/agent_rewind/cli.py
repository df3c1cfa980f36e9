"""The `agent-rewind` command: `serve` runs the service; `token` makes and hashes bearer tokens;
every other command is a client of the service.

Client commands print plain-text tables (or, with `--json`, the API's messages as JSON) on stdout,
and a failed RPC as `error: <STATUS> <REASON>: <message>` on stderr with exit code 1. Usage errors
(a missing or unreadable credentials file among them) exit 2.
"""

from __future__ import annotations

import argparse
import getpass
import io
import json
import os
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import TextIO

import grpc

from agent_rewind import config
from agent_rewind.access import Permission, hash_token, new_token
from agent_rewind.api.v1 import rewind_pb2, session_service_pb2
from agent_rewind.client import (
    MODES,
    TLS_CA_ENV,
    TLS_CERT_ENV,
    TLS_KEY_ENV,
    TOKEN_ENV,
    Client,
    UsageError,
    build_options,
    follow_turn,
    format_capabilities,
    format_points,
    format_rewind_result,
    format_session,
    format_sessions,
    format_watch_response,
    is_loopback,
    parse_mode,
    read_prompt_text,
    render_rpc_error,
    resolve_credentials,
    resolve_server,
    to_json,
)

PROG = "agent-rewind"
EXIT_RPC_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

Handler = Callable[[argparse.Namespace, Client, TextIO], int]
# A command that calls no server (`token ...`).
LocalHandler = Callable[[argparse.Namespace, TextIO], int]


# --- argument types -----------------------------------------------------------------------------


def _mode_arg(text: str) -> rewind_pb2.RewindMode.ValueType:
    try:
        return parse_mode(text)
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


def _permission_arg(text: str) -> Permission:
    try:
        return Permission(text.strip().lower())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a permission: {text!r} (choose from {', '.join(p.value for p in Permission)})"
        ) from None


def _principal_arg(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("a principal needs a name")
    if text != text.strip():
        raise argparse.ArgumentTypeError(f"a principal's name has no surrounding whitespace: {text!r}")
    return text


def _cursor_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a cursor: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("a cursor is 0 (from the oldest event kept) or more")
    return value


def _page_size_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 (the server's default) or more")
    return value


# --- client commands ----------------------------------------------------------------------------


def _print(out: TextIO, text: str) -> None:
    out.write(text + "\n")
    out.flush()


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
    _print(out, to_json(session) if args.json else format_session(session))
    return 0


def _session_list(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    if args.all:
        response = client.list_all_sessions(page_size=args.page_size)
    else:
        response = client.list_sessions(page_size=args.page_size, page_token=args.page_token)
    if args.json:
        _print(out, to_json(response))
        return 0
    _print(out, format_sessions(response.sessions))
    if response.next_page_token:
        _print(out, f"more: --page-token {response.next_page_token} (or --all)")
    return 0


def _session_show(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    session = client.get_session(args.session_id)
    _print(out, to_json(session) if args.json else format_session(session))
    return 0


def _session_close(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    session = client.close_session(args.session_id)
    _print(out, to_json(session) if args.json else format_session(session))
    return 0


def _session_delete(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    client.delete_session(args.session_id, delete_workspace=args.workspace, request_id=args.request_id or "")
    if args.json:
        _print(
            out,
            json.dumps({"session_id": args.session_id, "deleted": True, "workspace_deleted": args.workspace}),
        )
    else:
        _print(out, f"deleted {args.session_id}" + (" and its workspace" if args.workspace else ""))
    return 0


def _session_interrupt(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    session = client.interrupt(args.session_id)
    _print(out, to_json(session) if args.json else format_session(session))
    return 0


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
        outcome = follow_turn(stream, out, json_lines=args.json)
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


def _session_fork(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    session = client.fork_session(
        args.session_id,
        args.message_id or "",
        new_session_id=args.id or "",
        cwd=args.cwd or "",
        request_id=args.request_id or "",
    )
    _print(out, to_json(session) if args.json else format_session(session))
    return 0


def _undo(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    result = client.undo(
        args.session_id,
        args.rewind_id,
        validate_only=args.dry_run,
        request_id=args.request_id or "",
        conflict_policy=args.conflicts,
    )
    if args.json:
        _print(out, to_json(result))
        return 0
    files, conversation = result.files.requested, result.conversation.requested
    mode = (
        rewind_pb2.REWIND_MODE_BOTH
        if files and conversation
        else rewind_pb2.REWIND_MODE_CONVERSATION
        if conversation
        else rewind_pb2.REWIND_MODE_FILES
    )
    text = format_rewind_result(result, mode, dry_run=args.dry_run)
    _print(out, text.replace("rewind_id        ", "undid            ", 1) if not args.dry_run else text)
    return 0


def _points(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    if args.all:
        response = client.list_all_points(args.session_id, page_size=args.page_size)
    else:
        response = client.list_points(args.session_id, page_size=args.page_size, page_token=args.page_token)
    if args.json:
        _print(out, to_json(response))
        return 0
    _print(out, format_points(response.points, response.last_message_id))
    if response.next_page_token:
        _print(out, f"more: --page-token {response.next_page_token} (or --all)")
    return 0


def _rewind(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    if args.diff and not args.dry_run:
        raise UsageError("--diff needs --dry-run: only a preview shows what a rewind would change")
    result = client.rewind(
        args.session_id,
        args.message_id,
        args.mode,
        dry_run=args.dry_run,
        expected_last_message_id=args.expect_last,
        request_id=args.request_id or "",
        conflict_policy=args.conflicts,
        include_diff=args.diff,
    )
    _print(
        out, to_json(result) if args.json else format_rewind_result(result, args.mode, dry_run=args.dry_run)
    )
    return 0


def _capabilities(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    caps = client.capabilities()
    _print(out, to_json(caps) if args.json else format_capabilities(caps))
    return 0


def _watch(args: argparse.Namespace, client: Client, out: TextIO) -> int:
    """One line per response, flushed at once, until Ctrl-C or the stream ends. No reconnecting: a
    failure says the cursor to pass to --after, and the caller decides."""
    stream = client.watch_events(args.session_id or "", after_cursor=args.after)
    # The cursor a resumed watch passes to --after: the newest printed (an event's, or caught_up's).
    last: int | None = None
    try:
        for response in stream:
            kind = response.WhichOneof("response")
            if kind == "event":
                last = response.event.cursor
            elif kind == "caught_up":
                last = max(last or 0, response.caught_up.cursor)
            _print(out, to_json(response, compact=True) if args.json else format_watch_response(response))
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


# --- token commands (no server) -----------------------------------------------------------------

DEFAULT_PERMISSIONS = tuple(p for p in Permission if p is not Permission.ADMIN)
TOKEN_NOTE = (
    "The token is not stored anywhere, by this command or by the service (whose access file holds only "
    "its SHA-256): this is the only time it is shown. Keep it secret, as you would a password; give "
    f"it to its caller in a file for --token-file, or in ${TOKEN_ENV}."
)


def _token_create(args: argparse.Namespace, out: TextIO) -> int:
    chosen = set(args.permission or DEFAULT_PERMISSIONS)
    permissions = [p.value for p in Permission if p in chosen]  # the enum's order, each once
    token = new_token()
    entry = {"name": args.principal, "permissions": permissions, "token_sha256": [hash_token(token)]}
    note = textwrap.fill(TOKEN_NOTE, 100, break_on_hyphens=False)
    if args.json:
        _print(out, json.dumps({"token": token, "entry": entry}, indent=2))
        sys.stderr.write(note + "\n")
        return 0
    add = textwrap.fill(
        'Add this entry to the "principals" list of the service\'s access file (--access-file); the '
        "service reads the file again when it changes:",
        100,
        break_on_hyphens=False,
    )
    _print(out, f"token: {token}\n\n{note}\n\n{add}\n{json.dumps(entry, indent=2)}")
    return 0


def _token_hash(args: argparse.Namespace, out: TextIO) -> int:
    # From a terminal the token is not echoed; from a pipe or a file it is read whole.
    token = (getpass.getpass("token (not echoed): ") if sys.stdin.isatty() else sys.stdin.read()).strip()
    if not token:
        raise UsageError("no token on stdin")
    if "\n" in token:
        raise UsageError("stdin holds more than one line: give one token")
    digest = hash_token(token)
    _print(out, json.dumps({"token_sha256": digest}) if args.json else digest)
    return 0


# --- the parser ---------------------------------------------------------------------------------


class _NoTokenFlag(argparse.Action):
    """`--token`: refused, without echoing the value (which argparse would otherwise take as an
    abbreviation of --token-file and print back as a file name)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[object] | None,
        option_string: str | None = None,
    ) -> None:
        parser.error(
            "there is no --token flag: a token on the command line shows in process lists and shell "
            f"history; put it in a file for --token-file FILE, or in ${TOKEN_ENV}"
        )


def _client_options(*, top_level: bool, server: bool = True) -> argparse.ArgumentParser:
    """--server, the credentials and --json, accepted before or after the command (`server=False`:
    --json only, for the commands that call no server).

    On subcommands their default is SUPPRESS, so a value given before the command is not overwritten.
    """
    parser = argparse.ArgumentParser(add_help=False)
    unset = None if top_level else argparse.SUPPRESS
    if server:
        parser.add_argument(
            "--server",
            metavar="HOST:PORT",
            default=unset,
            help="the agent-rewind server (default $AGENT_REWIND_SERVER, else 127.0.0.1:50051)",
        )
        parser.add_argument(
            "--token-file",
            metavar="FILE",
            default=unset,
            help=f"send the bearer token this file holds (default ${TOKEN_ENV}, the token itself)",
        )
        parser.add_argument(
            "--token", nargs="?", action=_NoTokenFlag, default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )
        parser.add_argument(
            "--tls-ca",
            metavar="FILE",
            default=unset,
            help=f"call over TLS, trusting the CA certificates (PEM) in FILE (default ${TLS_CA_ENV})",
        )
        parser.add_argument(
            "--tls-cert",
            metavar="FILE",
            default=unset,
            help=f"mutual TLS: the client certificate chain (PEM) to present (default ${TLS_CERT_ENV}); "
            "goes with --tls-key. Without --tls-ca, the system's CAs are trusted",
        )
        parser.add_argument(
            "--tls-key",
            metavar="FILE",
            default=unset,
            help=f"the private key (PEM) of --tls-cert (default ${TLS_KEY_ENV})",
        )
    parser.add_argument(
        "--json",
        action="store_true",
        default=False if top_level else argparse.SUPPRESS,
        help="print the API's messages as JSON instead of tables" if server else "print one JSON object",
    )
    return parser


def _command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    handler: Handler,
    help_text: str,
    common: argparse.ArgumentParser,
) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(name, help=help_text, description=help_text, parents=[common])
    parser.set_defaults(handler=handler, subparser=parser)
    return parser


def _add_paging(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--page-size", type=_page_size_arg, default=0, metavar="N", help="at most N per page (server default)"
    )
    parser.add_argument("--page-token", default="", help="the page after a previous listing")
    parser.add_argument("--all", action="store_true", help="fetch every page")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Host Claude Agent SDK sessions and rewind their files and conversation.",
        parents=[_client_options(top_level=True)],
    )
    common = _client_options(top_level=False)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    # Only a placeholder: `main` hands everything after `serve` to the serve flags' own parser
    # (agent_rewind.config), built only for `serve`, so that its environment fallbacks, and any
    # bad value among them, never touch the client commands.
    commands.add_parser("serve", help="run the gRPC service (`serve --help` for its flags)", add_help=False)

    session = commands.add_parser("session", help="create, list, show, close, interrupt or delete sessions")
    session_commands = session.add_subparsers(dest="session_command", metavar="ACTION", required=True)

    create = _command(session_commands, "create", _session_create, "register a session", common)
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

    listing = _command(session_commands, "list", _session_list, "list sessions, newest first", common)
    _add_paging(listing)
    for name, handler, help_text in (
        ("show", _session_show, "show one session"),
        ("close", _session_close, "end the session's live SDK client; the transcript stays"),
        ("interrupt", _session_interrupt, "stop the turn in flight, if any"),
    ):
        _command(session_commands, name, handler, help_text, common).add_argument("session_id", metavar="ID")
    delete = _command(
        session_commands,
        "delete",
        _session_delete,
        "erase the session for good: its transcript with every hidden branch, subagent transcripts, "
        "file backups and workspace snapshots; then it is not found",
        common,
    )
    fork = _command(
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

    prompt = _command(
        commands, "prompt", _prompt, "run one turn and print its messages as they arrive", common
    )
    prompt.add_argument("session_id", metavar="SESSION")
    prompt.add_argument("text", metavar="TEXT", help="the prompt, or - to read it from stdin")
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

    undo = _command(
        commands,
        "undo",
        _undo,
        "undo the session's latest rewind (files and conversation back as they were), while no turn ran after it",
        common,
    )
    undo.add_argument("session_id", metavar="SESSION")
    undo.add_argument("rewind_id", metavar="REWIND_ID", help="the rewind to undo: the session's latest")
    undo.add_argument("--dry-run", action="store_true", help="preview: apply nothing (validate_only)")
    undo.add_argument(
        "--conflicts",
        type=_conflicts_arg,
        default=rewind_pb2.CONFLICT_POLICY_UNSPECIFIED,
        metavar="|".join(CONFLICT_POLICIES),
        help="what to do with a file changed since the rewind: refuse (the default), skip, overwrite",
    )
    undo.add_argument("--request-id", metavar="UUID", help="a retry with the same id applies nothing again")

    points = _command(commands, "points", _points, "list a session's rewind points, oldest first", common)
    points.add_argument("session_id", metavar="SESSION")
    _add_paging(points)

    rewind = _command(commands, "rewind", _rewind, "rewind a session to a prompt (or preview it)", common)
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
        "--conflicts",
        type=_conflicts_arg,
        default=rewind_pb2.CONFLICT_POLICY_UNSPECIFIED,
        metavar="|".join(CONFLICT_POLICIES),
        help="what to do with a path also changed outside the agent: refuse the files half "
        "(the default), skip the path, or overwrite the outside change",
    )
    rewind.add_argument(
        "--expect-last", metavar="ID", default=None, help="refuse unless this is still the newest message"
    )
    rewind.add_argument("--request-id", metavar="UUID", help="a retry with the same id applies nothing again")

    watch = _command(
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

    _command(commands, "capabilities", _capabilities, "what this deployment supports", common)

    local = _client_options(top_level=False, server=False)
    token = commands.add_parser(
        "token", help="make a bearer token and its access file entry, or hash a token (no server needed)"
    )
    token_commands = token.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    create_help = "print a new token, once, and the entry that admits it in the access file"
    token_create = token_commands.add_parser(
        "create", help=create_help, description=create_help, parents=[local]
    )
    token_create.set_defaults(local=_token_create, subparser=token_create)
    token_create.add_argument(
        "--principal", required=True, type=_principal_arg, metavar="NAME", help="who the token names"
    )
    token_create.add_argument(
        "--permission",
        action="extend",
        nargs="+",
        type=_permission_arg,
        metavar="P",
        help=f"a permission: {', '.join(p.value for p in Permission)}; repeatable "
        f"(default: all but {Permission.ADMIN.value})",
    )
    hash_help = "print the SHA-256 of a token read from stdin, for the access file's token_sha256"
    token_hash = token_commands.add_parser("hash", help=hash_help, description=hash_help, parents=[local])
    token_hash.set_defaults(local=_token_hash, subparser=token_hash)
    return parser


# --- entry point --------------------------------------------------------------------------------


def _serve(argv: Sequence[str]) -> int:
    settings = config.parse_args(argv, prog=f"{PROG} serve")  # exits 2 on a bad flag or variable
    # Imported here so the client commands work without the server's dependencies loaded.
    from agent_rewind.server import run

    return int(run(settings))


def _tolerant_stdout() -> None:
    """Print what the terminal cannot encode as `?` rather than failing on the first arrow."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="replace")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "serve":
        return _serve(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    _tolerant_stdout()
    local: LocalHandler | None = getattr(args, "local", None)
    if local is not None:
        try:
            return local(args, sys.stdout)
        except UsageError as err:
            args.subparser.error(str(err))  # exits 2
            return EXIT_USAGE
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED
    server = resolve_server(args.server)
    try:
        credentials = resolve_credentials(
            token_file=args.token_file, tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key
        )
    except UsageError as err:
        args.subparser.error(str(err))  # exits 2
        return EXIT_USAGE
    tls = credentials.tls is not None
    if credentials.token is not None and not tls and not is_loopback(server):
        sys.stderr.write(
            f"warning: sending the bearer token to {server} without TLS: anyone on the way can read it "
            "(--tls-ca makes the channel TLS)\n"
        )
    try:
        with Client(server, token=credentials.token, tls=credentials.tls) as client:
            code: int = args.handler(args, client, sys.stdout)
            return code
    except UsageError as err:
        args.subparser.error(str(err))  # exits 2
        return EXIT_USAGE
    except grpc.RpcError as err:
        sys.stdout.flush()
        for line in render_rpc_error(err, server=server, tls=tls):
            sys.stderr.write(line + "\n")
        return EXIT_RPC_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader (`| head`) went away; point stdout at devnull so the exit flush cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
