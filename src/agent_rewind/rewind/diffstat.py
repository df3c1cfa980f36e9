"""Lines added and removed between two versions of a file, counted as `git diff --numstat`
counts them (what a rewind served from snapshots reports): lines end at "\\n", a last line without
one differs from the same line with one, and a binary file (a NUL in its first 8,000 bytes, git's
test) counts no lines.

The counts are those of a shortest edit script (Myers' O(ND) algorithm, after the common head
and tail are set aside). A pair whose edit script would take too long to find in Python (it grows
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
    x, y = (_lines(a) if a else []), (_lines(b) if b else [])
    head = 0
    while head < len(x) and head < len(y) and x[head] == y[head]:
        head += 1
    tail = 0
    while tail < len(x) - head and tail < len(y) - head and x[-1 - tail] == y[-1 - tail]:
        tail += 1
    x, y = x[head : len(x) - tail], y[head : len(y) - tail]
    if not x or not y:
        return len(y), len(x)
    edits = _edits(x, y, max(_MIN_EDITS, _WORK // (len(x) + len(y))))
    if edits is None:
        missing = Counter(x)
        missing.subtract(Counter(y))
        deletions = sum(n for n in missing.values() if n > 0)
        return deletions + len(y) - len(x), deletions
    common = (len(x) + len(y) - edits) // 2
    return len(y) - common, len(x) - common


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
