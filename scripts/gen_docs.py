"""Regenerates what the docs show as the code's own output (run by `make docs`).

Each block lies between `<!-- NAME:begin ... -->` and `<!-- NAME:end -->` markers in its page;
tests/unit/docs/test_generated.py fails when a page's block differs from what this script makes,
so a doc cannot drift from the code:

- `flags` in docs/operations.md: every `serve` flag, its variable and default (config.SERVE_FLAGS);
- `serve-help` in docs/cli.md: `agent-rewind serve --help` as it prints, at 100 columns.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from agent_rewind.config import SERVE_FLAGS, build_parser  # noqa: E402


def flag_table() -> str:
    rows = ["| flag | environment | default | meaning |", "| --- | --- | --- | --- |"]
    rows += [f"| `{f.name}` | `{f.env_var}` | {f.default_text()} | {f.help} |" for f in SERVE_FLAGS]
    return "\n".join(rows) + "\n"


def serve_help() -> str:
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            build_parser("agent-rewind serve").print_help()
    finally:
        if previous is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = previous
    return "```text\n$ agent-rewind serve --help\n" + out.getvalue() + "```\n"


BLOCKS = {
    "flags": (ROOT / "docs" / "operations.md", flag_table),
    "serve-help": (ROOT / "docs" / "cli.md", serve_help),
}


def region(text: str, name: str) -> tuple[int, int]:
    """Where block `name` of a page lies: after its begin marker's line, up to its end marker."""
    begin = text.index("\n", text.index(f"<!-- {name}:begin")) + 1
    return begin, text.index(f"<!-- {name}:end -->")


def main() -> None:
    for name, (page, make) in BLOCKS.items():
        text = page.read_text()
        begin, end = region(text, name)
        fresh = text[:begin] + make() + text[end:]
        if fresh != text:
            page.write_text(fresh)
            print(f"gen_docs: {page.relative_to(ROOT)}: {name} regenerated")


if __name__ == "__main__":
    main()
