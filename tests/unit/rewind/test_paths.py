"""What a rewind's `paths` may name (rewind/paths.py): checked as text, then against the workspace."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent_rewind.errors import PathOutsideWorkspace
from agent_rewind.rewind.paths import MAX_PATH_BYTES, MAX_PATHS, check_links, covers, narrowed, normalized


def test_names_are_made_plain_sorted_and_without_repeats() -> None:
    assert normalized(["src/", "./a//b/./c", "src", "a/b/c/"]) == ("a/b/c", "src")


def test_no_names_and_the_whole_workspace_both_mean_no_narrowing() -> None:
    assert normalized([]) == ()
    assert normalized(["src", "."]) == ()
    assert normalized(["./"]) == ()


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("/etc/passwd", "is absolute"),
        ("../other", "leaves the workspace"),
        ("a/../../b", "leaves the workspace"),
        ("a/..", "leaves the workspace"),
        ("", "is empty"),
        ("a\x00b", "NUL"),
        ("x" * (MAX_PATH_BYTES + 1), "longer than"),
    ],
)
def test_a_name_that_is_not_inside_the_workspace_is_refused_naming_paths(name: str, said: str) -> None:
    with pytest.raises(PathOutsideWorkspace, match=said) as caught:
        normalized(["fine.txt", name])
    assert caught.value.reason == "PATH_OUTSIDE_WORKSPACE"
    assert caught.value.field == "paths"


def test_a_name_of_exactly_the_longest_length_is_accepted() -> None:
    longest = ("d" * 127 + "/") * (MAX_PATH_BYTES // 128 - 1) + "f" * 128
    assert len(longest.encode()) == MAX_PATH_BYTES
    assert normalized([longest]) == (longest,)


def test_narrowed_keeps_the_paths_the_names_cover() -> None:
    assert narrowed(("src",), ["src/a.py", "srcs/b.py", "README.md", "src"]) == {"src/a.py", "src"}
    assert narrowed((), ["a", "b"]) == {"a", "b"}


def test_too_many_names_are_refused() -> None:
    normalized([f"f{i}" for i in range(MAX_PATHS)])
    with pytest.raises(PathOutsideWorkspace, match="too many"):
        normalized([f"f{i}" for i in range(MAX_PATHS + 1)])


def test_a_name_covers_itself_and_what_is_under_it_only() -> None:
    chosen = ("src", "docs/a.md")
    assert covers(chosen, "src")
    assert covers(chosen, "src/x/y.py")
    assert covers(chosen, "docs/a.md")
    assert covers(chosen, "srcs/x.py") is False  # a name is a whole component, not a prefix
    assert not covers(chosen, "docs/a.md.bak")
    assert not covers(chosen, "docs/b.md")
    assert covers((), "anything")


def test_a_directory_on_the_way_that_is_a_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    os.symlink("/etc", tmp_path / "out")
    os.symlink(tmp_path / "real", tmp_path / "in")
    check_links(str(tmp_path), ("real/a.txt", "missing/b/c.txt", "out"))  # the link itself may be named
    for name in ("out/passwd", "in/a.txt"):  # even a link that leads back inside
        with pytest.raises(PathOutsideWorkspace, match="symbolic link"):
            check_links(str(tmp_path), (name,))


def test_a_link_deeper_on_the_way_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    os.symlink("/tmp", tmp_path / "a" / "b" / "c")
    with pytest.raises(PathOutsideWorkspace):
        check_links(str(tmp_path), ("a/b/c/d/e.txt",))


def test_narrowing_costs_no_more_with_a_thousand_names() -> None:
    """A caller may name MAX_PATHS paths: each path is looked up with its directories, never
    compared with every name (20,000 paths against 1,000 names would be 20 million compares)."""
    compares = 0

    class Counting(frozenset[str]):
        def __contains__(self, item: object) -> bool:
            nonlocal compares
            compares += 1
            return super().__contains__(item)

    names = Counting(f"dir{i}/sub" for i in range(MAX_PATHS))
    paths = [f"dir{i % 2000}/sub/f{i}.py" for i in range(20_000)]
    found = {p for p in paths if covers(names, p)}
    assert len(found) == 10_000
    assert compares <= 3 * len(paths), "at most one lookup per directory on each path's way"
