"""docs/operations.md lists every `serve` flag as the code declares it."""

from __future__ import annotations

from pathlib import Path

from agent_rewind.config import SERVE_FLAGS

DOC = Path(__file__).resolve().parents[3] / "docs" / "operations.md"


def _table() -> str:
    rows = ["| flag | environment | default | meaning |", "| --- | --- | --- | --- |"]
    rows += [f"| `{f.name}` | `{f.env_var}` | {f.default_text()} | {f.help} |" for f in SERVE_FLAGS]
    return "\n".join(rows) + "\n"


def test_the_flag_table_is_the_code_s() -> None:
    text = DOC.read_text()
    begin = text.index("\n", text.index("<!-- flags:begin")) + 1
    end = text.index("<!-- flags:end -->")
    assert text[begin:end] == _table(), "regenerate the table between the flags markers:\n" + _table()
