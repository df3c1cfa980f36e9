"""What a page shows as the code's own output is what the code prints now (scripts/gen_docs.py;
`make docs` regenerates every block)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
assert _spec is not None and _spec.loader is not None
gen_docs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen_docs)


@pytest.mark.parametrize("name", sorted(gen_docs.BLOCKS))
def test_a_generated_block_is_what_the_code_makes(name: str) -> None:
    page, make = gen_docs.BLOCKS[name]
    text = page.read_text()
    begin, end = gen_docs.region(text, name)
    assert text[begin:end] == make(), f"{page.name}: run `make docs` to regenerate the {name!r} block"
