"""Line counts of a files rewind planned without the CLI, against git's own (`git diff --numstat`,
what a rewind served from snapshots reports)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from agent_rewind.rewind.diffstat import line_counts

_LINES = st.lists(st.sampled_from([b"a", b"b", b"c", b"", b"  x = 1"]), max_size=40)


@st.composite
def _files(draw: st.DrawFn) -> bytes:
    text = b"\n".join(draw(_LINES))
    return text + b"\n" if text and draw(st.booleans()) else text


def _git_numstat(tmp: Path, before: bytes, after: bytes) -> tuple[int, int]:
    (tmp / "before").write_bytes(before)
    (tmp / "after").write_bytes(after)
    out = subprocess.run(
        ["git", "diff", "--no-index", "--numstat", "before", "after"],
        cwd=tmp,
        capture_output=True,
        check=False,
    ).stdout.split()
    return (int(out[0]), int(out[1])) if out else (0, 0)


@settings(max_examples=150, deadline=None)
@given(before=_files(), after=_files())
def test_the_counts_are_gits(tmp_path_factory, before: bytes, after: bytes) -> None:
    assert line_counts(before, after) == _git_numstat(tmp_path_factory.mktemp("numstat"), before, after)


def test_a_file_made_or_removed_counts_all_its_lines() -> None:
    assert line_counts(None, b"one\ntwo\n") == (2, 0)
    assert line_counts(b"one\ntwo\nthree", None) == (0, 3)
    assert line_counts(None, None) == (0, 0)


def test_a_last_line_that_gains_its_newline_is_a_changed_line() -> None:
    assert line_counts(b"a\nb", b"a\nb\n") == (1, 1)


def test_binary_content_counts_no_lines() -> None:
    assert line_counts(b"a\n\0b\n", b"c\n") == (0, 0)


def test_a_pair_too_costly_to_diff_is_counted_as_multisets(tmp_path: Path) -> None:
    # Every line differs, in 3,000-line files: the search would take (6,000 x 6,000) steps.
    before = b"".join(b"old %d\n" % i for i in range(3000))
    after = b"".join(b"new %d\n" % i for i in range(3000))
    assert line_counts(before, after) == (3000, 3000) == _git_numstat(tmp_path, before, after)
    # Reordered: as multisets nothing changed but the order, which the fallback does not see.
    shuffled = b"".join(b"old %d\n" % ((i * 7919) % 3000) for i in range(3000))
    assert line_counts(before, shuffled) == (0, 0)
