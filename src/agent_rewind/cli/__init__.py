"""The `agent-rewind` command: `serve` runs the service; `token` makes and hashes bearer tokens;
`webhooks` reads the ledger; every other command is a client of the service.

Client commands print plain-text tables (or, with `--json`, the API's messages as JSON) on stdout,
and a failed RPC as `error: <STATUS> <REASON>: <message>` on stderr with exit code 1. Usage errors
(a missing or unreadable credentials file among them) exit 2.

This module builds the parser and runs a command; each command group is a module of its own
(`sessions`, `turns`, `service`, `tokens`, over what they share in `common`).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
from collections.abc import Sequence

import grpc

from agent_rewind import config
from agent_rewind.cli import service, sessions, tokens, turns, webhooks
from agent_rewind.cli.common import (
    EXIT_INTERRUPTED,
    EXIT_RPC_ERROR,
    EXIT_USAGE,
    PROG,
    Handler,
    LocalHandler,
    client_options,
)
from agent_rewind.cli.tokens import DEFAULT_PERMISSIONS, TOKEN_NOTE
from agent_rewind.cli.turns import CONFLICT_POLICIES
from agent_rewind.client import (
    Client,
    UsageError,
    is_loopback,
    render_rpc_error,
    resolve_credentials,
    resolve_server,
)

__all__ = [
    "CONFLICT_POLICIES",
    "DEFAULT_PERMISSIONS",
    "EXIT_INTERRUPTED",
    "EXIT_RPC_ERROR",
    "EXIT_USAGE",
    "PROG",
    "TOKEN_NOTE",
    "Handler",
    "LocalHandler",
    "build_parser",
    "main",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Host Claude Agent SDK sessions and rewind their files and conversation.",
        parents=[client_options(top_level=True)],
    )
    common = client_options(top_level=False)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    # Only a placeholder: `main` hands everything after `serve` to the serve flags' own parser
    # (agent_rewind.config), built only for `serve`, so that its environment fallbacks, and any
    # bad value among them, never touch the client commands.
    commands.add_parser("serve", help="run the gRPC service (`serve --help` for its flags)", add_help=False)
    sessions.add_commands(commands, common)
    turns.add_commands(commands, common)
    service.add_commands(commands, common)
    tokens.add_commands(commands)
    webhooks.add_commands(commands, client_options(top_level=False, server=False))
    return parser


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
        # Said with the usage of the command they were given to (every command names its parser),
        # not the top level's, which shows none of the command's own flags.
        command_parser: argparse.ArgumentParser = getattr(args, "subparser", parser)
        command_parser.error(f"unrecognized arguments: {' '.join(rest)}")
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
