"""`agent-rewind webhooks`: each webhook URL's delivery, as the ledger has it.

An operator's command, like a backup or a migration: it reads the ledger itself (the SQLite file
in --state-dir, or PostgreSQL with --database-url), not a server, so it answers while no server
runs, and shows the whole deployment's URLs whichever replica delivers each. Each URL (without
its query, user or password, which may hold a token) with its cursor, its lag (events committed
after it), who delivers it and whether that lease is current, how many events were delivered and
failed, the last error, and the newest failed cursors.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
from pathlib import Path
from typing import Any, TextIO

from agent_rewind.cli.common import print_line
from agent_rewind.client import UsageError

FAILURES_SHOWN = 5


def _options(args: argparse.Namespace) -> tuple[Path, str, Path | None]:
    state = Path(args.state_dir or os.environ.get("AGENT_REWIND_STATE_DIR") or "./var")
    url = args.database_url or os.environ.get("AGENT_REWIND_DATABASE_URL") or ""
    password = args.database_password_file or os.environ.get("AGENT_REWIND_DATABASE_PASSWORD_FILE") or None
    return state, url, Path(password) if password else None


def _check_sqlite(path: Path) -> None:
    """The file exists and is at this version's schema: a listing neither makes nor migrates one."""
    from agent_rewind.store.sqlite import MIGRATIONS

    if not path.is_file():
        raise UsageError(f"no ledger at {path}: give the server's --state-dir (or --database-url)")
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            version = int(db.execute("PRAGMA user_version").fetchone()[0])
    except sqlite3.Error as err:
        raise UsageError(f"cannot read the ledger {path}: {err}") from None
    if version != len(MIGRATIONS):
        raise UsageError(
            f"the ledger {path} is at schema {version}, this agent-rewind reads {len(MIGRATIONS)}: "
            "run the agent-rewind of the server that uses it"
        )


async def _report(state: Path, url: str, password: Path | None) -> list[dict[str, Any]]:
    from agent_rewind import components
    from agent_rewind.config import Config
    from agent_rewind.webhooks.subscriptions import shown

    config = Config(state_dir=state, database_url=url, database_password_file=password).resolved()
    if not url:
        _check_sqlite(config.ledger_path)
    try:
        ledger = await components.ledger_of(config)
    except Exception as err:
        raise UsageError(f"cannot open the ledger: {err}") from None
    try:
        _, newest = await ledger.event_bounds()
        rows = []
        for record in await ledger.webhooks():
            failures = await ledger.webhook_failures(record.url, FAILURES_SHOWN)
            rows.append(
                {
                    "url": shown(record.url),
                    "cursor": record.cursor,
                    "lag": max(0, newest - record.cursor),
                    "holder": record.holder,
                    "held": record.held,
                    "delivered": record.delivered,
                    "failed": record.failed,
                    "last_error": record.last_error,
                    "recent_failures": [f.cursor for f in failures],
                    "update_time": record.update_time.isoformat(),
                }
            )
        return rows
    finally:
        await ledger.close()


def _webhooks(args: argparse.Namespace, out: TextIO) -> int:
    from agent_rewind import logs

    logs.configure("auto", "warning")  # the ledger's own log lines on stderr, and only its warnings
    rows = asyncio.run(_report(*_options(args)))
    if args.json:
        print_line(out, json.dumps({"webhooks": rows}, indent=2))
        return 0
    if not rows:
        print_line(out, "no webhook URL has been delivered to (serve --webhook-url)")
        return 0
    for row in rows:
        holder = (
            f"{row['holder']} ({'delivering' if row['held'] else 'lease lapsed'})"
            if row["holder"]
            else "none"
        )
        failed = f"{row['failed']}" + (
            f" (newest: {', '.join(map(str, row['recent_failures']))}; last error: {row['last_error']})"
            if row["failed"]
            else ""
        )
        print_line(
            out,
            f"{row['url']}\n  cursor {row['cursor']}, lag {row['lag']}, delivered {row['delivered']}, "
            f"failed {failed}\n  held by {holder}, last moved {row['update_time']}",
        )
    return 0


def add_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], local: argparse.ArgumentParser
) -> None:
    help_text = "each webhook URL's cursor, lag and failures, read from the ledger (no server needed)"
    parser = commands.add_parser("webhooks", help=help_text, description=help_text, parents=[local])
    parser.epilog = (
        "Reads the ledger the servers use: the SQLite file in --state-dir, or the PostgreSQL database "
        "of --database-url (with its password in --database-password-file), each falling back to the "
        "variable `serve` reads. Lag is the number of events committed after the URL's cursor; a "
        "failed event is one every attempt of which failed (it was skipped)."
    )
    parser.set_defaults(local=_webhooks, subparser=parser)
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        help="the server's state dir (default $AGENT_REWIND_STATE_DIR, else ./var)",
    )
    parser.add_argument(
        "--database-url",
        metavar="URL",
        help="the deployment's PostgreSQL (default $AGENT_REWIND_DATABASE_URL)",
    )
    parser.add_argument(
        "--database-password-file",
        metavar="FILE",
        help="its password, the file's first line (default $AGENT_REWIND_DATABASE_PASSWORD_FILE)",
    )
