"""Reading a transcript file as it grows: the complete lines appended since the last read, each
parsed unless it is bookkeeping the index never needs, and the parts of an assistant entry it keeps.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20
# Bookkeeping lines we never need, recognised by how the CLI starts them (`{"type":"...`), so
# their often large bodies (a 30 KB request shape) are not parsed. A line that starts any other
# way is parsed, so a change in key order costs time, never correctness.
_SKIPPED_TYPES = frozenset(
    {
        b"api-request",
        b"api-request-blob",
        b"api-request-shape",
        b"queue-operation",
        b"atis-latch",
        b"tools-used",
        b"cost-state",
        b"last-prompt",
        b"mode",
    }
)
_TYPE_PREFIX = b'{"type":"'
_AGENT_TOOLS = frozenset({"Agent", "Task"})


@dataclass(slots=True)
class IndexStats:
    """Counters that let tests check the index does no more work than the new bytes need."""

    bytes_read: int = 0
    lines_parsed: int = 0  # json.loads calls (skipped bookkeeping lines are not parsed)
    entries_walked: int = 0  # entries visited while building chains for views
    entries_copied: int = 0  # entries copied from a shared chain (a view on another branch)
    resets: int = 0  # re-reads from scratch (file replaced, shrunk or removed)


class LineReader:
    """Reads the complete lines appended to a file since the last call.

    A partial last line (the CLI is mid-write) is kept and completed on the next call. A file
    that was replaced (new inode, different first bytes), shrank or vanished is read again from
    the start, after a call to `on_reset`.
    """

    _HEAD = 64

    def __init__(self, path: Path, stats: IndexStats) -> None:
        self.path = path
        self.position = 0  # bytes read so far, a partial last line included
        self._partial = b""
        self._identity: tuple[int, int] | None = None
        self._head = b""
        self._stats = stats

    def read(self, on_reset: Callable[[], None]) -> Iterator[tuple[int, bytes]]:
        """Yield (offset, line) for each new complete line, one chunk in memory at a time."""
        try:
            f = self.path.open("rb")
        except OSError as err:
            # Not written yet (or a name the file system cannot hold): an empty transcript.
            if err.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ENAMETOOLONG):
                raise
            if self.position:
                self._restart(None, on_reset)
            return
        with f:
            st = os.fstat(f.fileno())
            identity = (st.st_dev, st.st_ino)
            if self.position and (
                identity != self._identity
                or st.st_size < self.position
                or os.pread(f.fileno(), len(self._head), 0) != self._head
            ):
                self._restart(identity, on_reset)
            self._identity = identity
            f.seek(self.position)
            while chunk := f.read(_CHUNK):
                if len(self._head) < self._HEAD:  # then it holds every byte read so far
                    self._head = (self._head + chunk)[: self._HEAD]
                self._stats.bytes_read += len(chunk)
                data = self._partial + chunk
                start = self.position - len(self._partial)
                self.position += len(chunk)
                end = data.rfind(b"\n") + 1
                self._partial = data[end:]
                pos = 0
                while pos < end:
                    nl = data.index(b"\n", pos)
                    if nl > pos:
                        yield start + pos, data[pos:nl]
                    pos = nl + 1

    @property
    def size(self) -> int:
        """Bytes of complete lines read: every entry at an offset from here on is still to come."""
        return self.position - len(self._partial)

    def _restart(self, identity: tuple[int, int] | None, on_reset: Callable[[], None]) -> None:
        self._stats.resets += 1
        self.position = 0
        self._partial = b""
        self._head = b""
        self._identity = identity
        on_reset()


def parse_line(line: bytes, stats: IndexStats) -> dict[str, Any] | None:
    if line.startswith(_TYPE_PREFIX):
        end = line.find(b'"', len(_TYPE_PREFIX))
        if line[len(_TYPE_PREFIX) : end] in _SKIPPED_TYPES:
            return None
    stats.lines_parsed += 1
    try:
        raw = json.loads(line)
    except (ValueError, RecursionError):  # a corrupt (or absurdly nested) line: the CLI skips those too
        return None
    return raw if isinstance(raw, dict) else None


def assistant_parts(raw: Mapping[str, Any]) -> tuple[str, list[str]]:
    """An assistant entry's API message id and the ids of the subagent calls it makes."""
    message = raw.get("message")
    if not isinstance(message, dict):
        return "", []
    api_id = message.get("id")
    calls = [
        str(block["id"])
        for block in _tool_uses(message)
        if block.get("name") in _AGENT_TOOLS and isinstance(block.get("id"), str)
    ]
    return (api_id if isinstance(api_id, str) else ""), calls


def tool_names(raw: Mapping[str, Any]) -> tuple[str, ...]:
    """The tools an assistant entry calls, in order (usually none or one)."""
    message = raw.get("message")
    if not isinstance(message, dict):
        return ()
    return tuple(str(block["name"]) for block in _tool_uses(message) if isinstance(block.get("name"), str))


def _tool_uses(message: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [block for block in content if isinstance(block, dict) and block.get("type") == "tool_use"]
