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


def test_make_docs_says_which_pages_it_rewrote_or_that_all_were_up_to_date(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page, other = tmp_path / "a.md", tmp_path / "b.md"
    page.write_text(
        "x\n<!-- one:begin -->\nold\n<!-- one:end -->\n<!-- two:begin -->\nnew\n<!-- two:end -->\n"
    )
    other.write_text("<!-- three:begin -->\nnew\n<!-- three:end -->\n")
    blocks = {name: (p, lambda: "new\n") for name, p in (("one", page), ("two", page), ("three", other))}
    gen_docs.main(blocks)
    assert capsys.readouterr().out == f"gen_docs: rewrote {page} (one)\n"
    assert page.read_text().count("new\n") == 2
    gen_docs.main(blocks)
    assert capsys.readouterr().out == f"gen_docs: all 3 generated blocks were up to date ({page}, {other})\n"
