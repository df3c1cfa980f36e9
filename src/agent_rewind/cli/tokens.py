"""`agent-rewind token ...`: make a bearer token and its access file entry, or hash a token.

These commands call no server.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
import textwrap
from typing import TextIO

from agent_rewind.access import Permission, hash_token, new_token
from agent_rewind.cli.common import client_options, print_line
from agent_rewind.client import TOKEN_ENV, UsageError


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
        print_line(out, json.dumps({"token": token, "entry": entry}, indent=2))
        sys.stderr.write(note + "\n")
        return 0
    add = textwrap.fill(
        'Add this entry to the "principals" list of the service\'s access file (--access-file); the '
        "service reads the file again when it changes:",
        100,
        break_on_hyphens=False,
    )
    print_line(out, f"token: {token}\n\n{note}\n\n{add}\n{json.dumps(entry, indent=2)}")
    return 0


def _token_hash(args: argparse.Namespace, out: TextIO) -> int:
    # From a terminal the token is not echoed; from a pipe or a file it is read whole.
    token = (getpass.getpass("token (not echoed): ") if sys.stdin.isatty() else sys.stdin.read()).strip()
    if not token:
        raise UsageError("no token on stdin")
    if "\n" in token:
        raise UsageError("stdin holds more than one line: give one token")
    digest = hash_token(token)
    print_line(out, json.dumps({"token_sha256": digest}) if args.json else digest)
    return 0


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The `token` group and its actions."""
    local = client_options(top_level=False, server=False)
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
