"""What every `agent-rewind` command group shares: the exit codes, the handler shapes, the
client options (--server, the credentials, --json) and the helpers that add a command or paging.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import TextIO

from agent_rewind.client import TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV, TOKEN_ENV, Client

PROG = "agent-rewind"
EXIT_RPC_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

Handler = Callable[[argparse.Namespace, Client, TextIO], int]
# A command that calls no server (`token ...`).
LocalHandler = Callable[[argparse.Namespace, TextIO], int]


def page_size_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 (the server's default) or more")
    return value


def print_line(out: TextIO, text: str) -> None:
    out.write(text + "\n")
    out.flush()


class NoTokenFlag(argparse.Action):
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


def client_options(*, top_level: bool, server: bool = True) -> argparse.ArgumentParser:
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
            "--token", nargs="?", action=NoTokenFlag, default=argparse.SUPPRESS, help=argparse.SUPPRESS
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


def add_command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    handler: Handler,
    help_text: str,
    common: argparse.ArgumentParser,
) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(name, help=help_text, description=help_text, parents=[common])
    parser.set_defaults(handler=handler, subparser=parser)
    return parser


def add_paging(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--page-size", type=page_size_arg, default=0, metavar="N", help="at most N per page (server default)"
    )
    parser.add_argument("--page-token", default="", help="the page after a previous listing")
    parser.add_argument("--all", action="store_true", help="fetch every page")
