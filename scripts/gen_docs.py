"""Regenerates what the docs show as the code's own output (run by `make docs`).

Each block lies between `<!-- NAME:begin ... -->` and `<!-- NAME:end -->` markers in its page;
tests/unit/docs/test_generated.py fails when a page's block differs from what this script makes,
so a doc cannot drift from the code:

- `flags` in docs/operations.md: every `serve` flag, its variable and default (config.SERVE_FLAGS);
- `serve-help` and `rewind-help` in docs/cli.md: `agent-rewind serve --help` and
  `agent-rewind rewind --help` as they print, at 100 columns;
- `errors-table` in docs/errors.md: the "what to do" of every reason (agent_rewind.errors.NEXT_STEPS);
- `cli-memory` in docs/operations.md: what a live Claude Code process held when `make bench` last
  measured it (its table in docs/benchmarks.md, which `make bench ARGS=--update-docs` writes).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from agent_rewind.cli import build_parser as build_cli_parser  # noqa: E402
from agent_rewind.config import SERVE_FLAGS, build_parser  # noqa: E402
from agent_rewind.errors import NEXT_STEPS  # noqa: E402


def flag_table() -> str:
    rows = ["| flag | environment | default | meaning |", "| --- | --- | --- | --- |"]
    rows += [f"| `{f.name}` | `{f.env_var}` | {f.default_text()} | {f.help} |" for f in SERVE_FLAGS]
    return "\n".join(rows) + "\n"


def _help(command: str, parser: argparse.ArgumentParser) -> str:
    """`agent-rewind COMMAND --help` as it prints in a terminal 100 columns wide."""
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            parser.print_help()
    finally:
        if previous is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = previous
    return f"```text\n$ agent-rewind {command} --help\n" + out.getvalue() + "```\n"


def serve_help() -> str:
    return _help("serve", build_parser("agent-rewind serve"))


def rewind_help() -> str:
    # The parser of a client command is the one its parsed arguments name.
    args = build_cli_parser().parse_args(["rewind", "SESSION", "MESSAGE_ID", "--mode", "files"])
    return _help("rewind", args.subparser)


ERRORS_PAGE = ROOT / "docs" / "errors.md"


def errors_table() -> str:
    """docs/errors.md's table of reasons, its "what to do" column from NEXT_STEPS (the status and
    "when" columns are the page's own; tests/unit/rpc/test_errors.py checks the statuses)."""
    text = ERRORS_PAGE.read_text()
    begin, end = region(text, "errors-table")
    header, rule, *rows = text[begin:end].splitlines()
    fresh = [header, rule]
    for row in rows:
        match = re.match(r"^\| `[A-Z_]+` \| `([A-Z_]+)` \| ", row)
        if match is None:
            raise ValueError(f"docs/errors.md: not a row of the table: {row!r}")
        if match.group(1) not in NEXT_STEPS:
            raise LookupError(f"agent_rewind.errors.NEXT_STEPS says nothing of {match.group(1)}")
        fresh.append(f"{row.removesuffix(' |').rsplit(' | ', 1)[0]} | {NEXT_STEPS[match.group(1)]} |")
    return "\n".join(fresh) + "\n"


def _bench_row(label: str) -> dict[str, str]:
    """A row of the last benchmark run's memory table (docs/benchmarks.md), by its first cell."""
    lines = (ROOT / "docs" / "benchmarks.md").read_text().splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("| session ") and "VmHWM" in line)
    names = [cell.strip() for cell in lines[head].strip("|").split("|")]
    for line in lines[head + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells[0].startswith(label):
            return dict(zip(names, cells, strict=True))
    raise LookupError(f"docs/benchmarks.md has no memory row {label!r}: run make bench ARGS=--update-docs")


def cli_memory() -> str:
    idle = _bench_row("live, idle after its turns")
    rewound = _bench_row("rewound: from the moment a conversation Rewind returned")
    return (
        "A live session's Claude Code process, as `make bench` last measured it on its machine\n"
        f'([benchmarks.md](benchmarks.md), "Memory per session"): {idle["VmRSS (median)"]} resident once\n'
        f"idle after its turns, {rewound['VmRSS (max)']} at most right after a conversation rewind, and\n"
        f"a peak (VmHWM) of {max(idle['VmHWM (max)'], rewound['VmHWM (max)'], key=_megabytes)}. "
        "Newer CLIs and longer conversations can\n"
        "hold more: the service budgets 320 MiB for each.\n"
    )


def _megabytes(text: str) -> float:
    number, unit = text.split()
    return float(number) * {"KB": 1 / 1000, "MB": 1.0, "GB": 1000.0}[unit]


BLOCKS = {
    "flags": (ROOT / "docs" / "operations.md", flag_table),
    "serve-help": (ROOT / "docs" / "cli.md", serve_help),
    "rewind-help": (ROOT / "docs" / "cli.md", rewind_help),
    "cli-memory": (ROOT / "docs" / "operations.md", cli_memory),
    "errors-table": (ERRORS_PAGE, errors_table),
}


def region(text: str, name: str) -> tuple[int, int]:
    """Where block `name` of a page lies: after its begin marker's line, up to its end marker."""
    begin = text.index("\n", text.index(f"<!-- {name}:begin")) + 1
    return begin, text.index(f"<!-- {name}:end -->")


def _shown(page: Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else str(page)


def main(blocks: dict[str, tuple[Path, Callable[[], str]]] = BLOCKS) -> None:
    """Rewrite every page whose blocks differ from what the code makes, and say which (each page
    with the blocks that changed), or that all were up to date."""
    pages: dict[Path, list[str]] = {}
    for name, (page, _) in blocks.items():
        pages.setdefault(page, []).append(name)
    rewritten = 0
    for page, names in pages.items():
        text = fresh = page.read_text()
        changed = []
        for name in names:
            begin, end = region(fresh, name)
            block = blocks[name][1]()
            if fresh[begin:end] != block:
                fresh = fresh[:begin] + block + fresh[end:]
                changed.append(name)
        if fresh != text:
            page.write_text(fresh)
            rewritten += 1
            print(f"gen_docs: rewrote {_shown(page)} ({', '.join(changed)})")
    if not rewritten:
        shown = ", ".join(_shown(page) for page in pages)
        print(f"gen_docs: all {len(blocks)} generated blocks were up to date ({shown})")


if __name__ == "__main__":
    main()
