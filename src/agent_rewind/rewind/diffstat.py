"""Lines added and removed between two versions of a file, counted as `git diff --numstat`
counts them (what a rewind served from snapshots reports): lines end at "\\n", a last line without
one differs from the same line with one, and a binary file (a NUL in its first 8,000 bytes, git's
test) counts no lines.

The counts are those of git's xdiff: the common head and tail are set aside, lines that cannot
match are dropped, and so is a line that matches many times when it sits in a run of lines that
match nothing (xdiff's `xdl_cleanup_records`: git counts it as changed rather than align one
stray `}` or blank line); then a shortest edit script (Myers' O(ND) algorithm) of the rest. A pair whose edit script would take too long to find in Python (it grows
with the lines times the edits) is counted as the Claude Code CLI counts such a pair: the lines of
each side that the other side lacks, as multisets.
"""

from __future__ import annotations

from collections import Counter

_BINARY_PROBE = 8000  # git's buffer_is_binary looks this far for a NUL
_WORK = 200_000  # at most (lines left after trimming) x (edits) steps of the search (~50 ms)
_MIN_EDITS = 64  # edits the search always may find, however long the files


def _binary(data: bytes) -> bool:
    return b"\0" in data[:_BINARY_PROBE]


def _lines(data: bytes) -> list[bytes]:
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()  # the file ends with a newline
    else:
        lines[-1] += b"\n"  # a line cannot hold "\n": it tells the unterminated last line apart
    return lines


def line_counts(before: bytes | None, after: bytes | None) -> tuple[int, int]:
    """(insertions, deletions) from `before` to `after`; None is no file (no lines)."""
    a, b = before or b"", after or b""
    if a == b or _binary(a) or _binary(b):
        return 0, 0
    whole_x, whole_y = (_lines(a) if a else []), (_lines(b) if b else [])
    head = 0
    while head < len(whole_x) and head < len(whole_y) and whole_x[head] == whole_y[head]:
        head += 1
    tail = 0
    while (
        tail < len(whole_x) - head and tail < len(whole_y) - head and whole_x[-1 - tail] == whole_y[-1 - tail]
    ):
        tail += 1
    x, y = whole_x[head : len(whole_x) - tail], whole_y[head : len(whole_y) - tail]
    kept_x, kept_y = _kept(x, whole_x, whole_y), _kept(y, whole_y, whole_x)
    if not kept_x or not kept_y:
        return len(y), len(x)
    edits = _edits(kept_x, kept_y, max(_MIN_EDITS, _WORK // (len(kept_x) + len(kept_y))))
    if edits is None:
        missing = Counter(x)
        missing.subtract(Counter(y))
        deletions = sum(n for n in missing.values() if n > 0)
        return deletions + len(y) - len(x), deletions
    common = (len(kept_x) + len(kept_y) - edits) // 2
    return len(y) - common, len(x) - common


# xdiff's limits (xdiff/xdiffi.h, xprepare.c).
_MAX_EQLIMIT = 1024
_SIMSCAN_WINDOW = 100
_KPDIS_RUN = 4


def _bogosqrt(n: int) -> int:
    """xdiff's integer square root approximation."""
    i = 1
    while n > 0:
        i <<= 1
        n >>= 2
    return i


def _kept(lines: list[bytes], whole: list[bytes], other: list[bytes]) -> list[bytes]:
    """The lines of `lines` (one side, its common head and tail set aside; `whole`: all of that
    side) xdiff keeps for the edit script: a line with no match on the `other` side is dropped,
    and so is one with many matches amid a run of such lines (`xdl_cleanup_records`)."""
    counts = Counter(other)
    limit = min(_bogosqrt(len(whole)), _MAX_EQLIMIT)
    # 0: no match, 1: a match, 2: many matches (at least `limit`).
    marks = [0 if (n := counts[line]) == 0 else 2 if n >= limit else 1 for line in lines]
    return [
        line
        for i, line in enumerate(lines)
        if marks[i] == 1 or (marks[i] == 2 and not _amid_unmatched(marks, i))
    ]


def _amid_unmatched(marks: list[int], i: int) -> bool:
    """xdiff's `xdl_clean_mmatch`: whether the many-matched line `i` sits in a run of lines
    with no match (or many) on both sides, mostly of lines with no match."""
    start, end = max(0, i - _SIMSCAN_WINDOW), min(len(marks) - 1, i + _SIMSCAN_WINDOW)
    before, many_before = _run(marks, range(i - 1, start - 1, -1))
    if before == 0:
        return False
    after, many_after = _run(marks, range(i + 1, end + 1))
    if after == 0:
        return False
    unmatched, many = before + after, many_before + many_after
    return many * _KPDIS_RUN < many + unmatched


def _run(marks: list[int], indexes: range) -> tuple[int, int]:
    """(lines with no match, 1 + lines with many) in the run along `indexes`, up to a matched line."""
    unmatched, many = 0, 1
    for j in indexes:
        if marks[j] == 0:
            unmatched += 1
        elif marks[j] == 2:
            many += 1
        else:
            break
    return unmatched, many


def _edits(x: list[bytes], y: list[bytes], limit: int) -> int | None:
    """The length of a shortest edit script from `x` to `y` (Myers 1986), None beyond `limit`."""
    n, m = len(x), len(y)
    offset = min(n + m, limit) + 1
    furthest = [0] * (2 * offset + 1)  # diagonal k -> the furthest x reached on it
    for d in range(min(n + m, limit) + 1):
        for k in range(-d, d + 1, 2):
            if k == -d or (k != d and furthest[offset + k - 1] < furthest[offset + k + 1]):
                i = furthest[offset + k + 1]  # a line inserted
            else:
                i = furthest[offset + k - 1] + 1  # a line deleted
            j = i - k
            while i < n and j < m and x[i] == y[j]:
                i += 1
                j += 1
            furthest[offset + k] = i
            if i >= n and j >= m:
                return d
    return None
