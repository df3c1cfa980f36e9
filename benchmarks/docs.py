"""The generated results block of docs/benchmarks.md (`make bench ARGS="--update-docs"`).

Only the text between the two markers is rewritten; the prose around it is hand-written and
quotes no measured figure, so the document never contradicts its own tables.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from benchmarks.common import Report

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
BEGIN = "<!-- bench:results:begin -->"
END = "<!-- bench:results:end -->"


def results_block(facts: Mapping[str, str], reports: Sequence[Report], summary: str) -> str:
    args = shlex.join(a for a in sys.argv[1:] if a != "--update-docs")
    command = f'make bench ARGS="{args}"' if args else "make bench"
    out = [
        BEGIN,
        '<!-- Generated from one run by `make bench ARGS="--update-docs"`: do not edit by hand. -->',
        "",
        f"`{command}`, {facts.get('date', '?')}: **{summary}**.",
        "",
        *(f"- {key}: {value}" for key, value in facts.items() if key != "date"),
        "",
    ]
    for report in reports:
        out += [report.render(level=3), ""]
    out.append(END)
    return "\n".join(out)


def update_results(facts: Mapping[str, str], reports: Sequence[Report], summary: str) -> None:
    """Replaces the block between the markers of docs/benchmarks.md with this run's results."""
    text = DOC.read_text()
    begin, end = text.find(BEGIN), text.find(END)
    if begin < 0 or end < begin:
        raise RuntimeError(f"{DOC} lacks the markers {BEGIN} ... {END}")
    DOC.write_text(text[:begin] + results_block(facts, reports, summary) + text[end + len(END) :])
