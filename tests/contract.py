"""The API contract (API.md) as tests read it: its error table and the RPC signatures it fixes.

The contract lives in the design docs beside the repository (`../shared/design/API.md`, checked
out next to the clone in CI). The repository carries a verbatim copy in `docs/contract/API.md`, so
a clone without the design docs still tests against the contract itself; where both exist, a test
fails unless they are identical.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "design" / "API.md"
VENDORED = ROOT / "docs" / "contract" / "API.md"

_ERROR_ROW = re.compile(r"^\|\s*`([A-Z_]+)`\s*\|\s*`([A-Z_]+)`\s*\|", re.MULTILINE)
_SIGNATURE = re.compile(r"`(\w+)\((\w+)\) returns \((stream )?([\w.]+)\)`")


def text() -> str:
    """The contract's text: the design docs' when checked out beside the repo, else the copy."""
    return (SHARED if SHARED.is_file() else VENDORED).read_text()


def error_table() -> dict[str, str]:
    """reason -> status code name, from every row of the Errors table (| `STATUS` | `REASON` | when |)."""
    rows = _ERROR_ROW.findall(text())
    assert rows, "no error rows (| `STATUS` | `REASON` | when |) found in the contract"
    table: dict[str, str] = {}
    for status, reason in rows:
        assert table.get(reason, status) == status, f"{reason} is listed with two statuses"
        table[reason] = status
    return table


def rpc_signatures() -> dict[str, tuple[str, str, bool]]:
    """rpc -> (request, response, streams), as the contract writes them; a later mention wins
    (Round 2 changes WatchRewindEvents' response type)."""
    found: dict[str, tuple[str, str, bool]] = {}
    for rpc, request, stream, response in _SIGNATURE.findall(text()):
        response = response.removeprefix("google.protobuf.")
        found[rpc] = (request, response, bool(stream))
    assert found, "no RPC signatures found in the contract"
    return found
