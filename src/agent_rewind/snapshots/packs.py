"""Writing many objects at once as one pack, not one loose object (a file) each.

A first snapshot writes every blob of the workspace and every tree: at 100,000 files, as loose
objects, creating those files is most of its cost. Here they are appended to one pack file
(`PACK`, version 2, each object `zlib`-compressed whole, no deltas) beside the repository's
packs; at the end its header gets the count, its trailer the SHA-1, and `git index-pack` (the
store's sealed git) reads it back, checks every object and writes its `.idx`. Only then is it
renamed into `objects/pack/`, the index last, so git never sees half a pack. A pack left behind
by a crash is a `.tmp` file git ignores; the next `keep_only` repacks the rest as usual.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import struct
import zlib
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from agent_rewind.snapshots.errors import SnapshotError
from agent_rewind.snapshots.git import EMPTY_TREE, Git
from agent_rewind.snapshots.objects import MODE_TREE, tree_body

BLOB, TREE = 3, 2
_KINDS = {BLOB: b"blob", TREE: b"tree"}
_HEADER = struct.Struct(">4sII")


def object_header(kind: int, size: int) -> bytes:
    """A pack entry's header: the type and the size, 4 then 7 bits a byte."""
    first = (kind << 4) | (size & 0x0F)
    size >>= 4
    out = bytearray()
    while size:
        out.append(first | 0x80)
        first = size & 0x7F
        size >>= 7
    out.append(first)
    return bytes(out)


def encode(kind: int, body: bytes) -> tuple[str, bytes]:
    """An object's id and its entry in a pack (header and compressed body). Thread-safe: zlib
    and the read before it let other threads run."""
    digest = hashlib.sha1(_KINDS[kind] + b" %d\0" % len(body), usedforsecurity=False)
    digest.update(body)
    return digest.hexdigest(), object_header(kind, len(body)) + zlib.compress(body, 1)


def write_trees(pack: PackWriter, files: Mapping[str, tuple[str, str]]) -> str:
    """Writes the trees holding `files` (path -> (mode, blob id)) into `pack`; the root's id.
    The same trees `git write-tree` writes for an index of these entries."""
    root: dict[str, Any] = {}
    for path, entry in files.items():
        *dirs, name = path.split("/")
        node = root
        for part in dirs:
            node = node.setdefault(part, {})
        node[name] = entry

    def write(node: dict[str, Any]) -> str:
        entries = {
            name: (MODE_TREE, write(value)) if isinstance(value, dict) else value
            for name, value in node.items()
        }
        return pack.add(TREE, tree_body(entries))

    return write(root) if root else EMPTY_TREE


class PackWriter:
    """Objects appended to a new pack of `git`'s repository; `finish()` puts it in place (or,
    with no object, nothing), `abort()` or leaving the `with` on an error drops it."""

    def __init__(self, git: Git) -> None:
        self._git = git
        directory = git.repo / "objects" / "pack"
        directory.mkdir(parents=True, exist_ok=True)
        # Git looks for packs by their `.idx`: until the end, neither file is one it would read.
        self._path = directory / f"tmp_bulk_{secrets.token_hex(6)}.pack"
        self._index = directory / f"tmp_bulk_{secrets.token_hex(6)}.idx.tmp"
        self._file = self._path.open("w+b")
        self._file.write(_HEADER.pack(b"PACK", 2, 0))
        self._written: set[str] = set()

    def __enter__(self) -> PackWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        if kind is not None:
            self.abort()

    def add(self, kind: int, body: bytes) -> str:
        """Appends one object (once: the same content twice is written once); its id."""
        oid, entry = encode(kind, body)
        self.append(oid, entry)
        return oid

    def append(self, oid: str, entry: bytes) -> None:
        """Appends an object `encode` made (in any thread), unless the pack holds it already."""
        if oid not in self._written:
            self._written.add(oid)
            self._file.write(entry)

    def finish(self, deadline: float) -> None:
        """Completes the pack, has git check and index it, and moves it into place."""
        try:
            if not self._written:
                return
            self._file.seek(0)
            self._file.write(_HEADER.pack(b"PACK", 2, len(self._written)))
            self._file.seek(0)
            digest = hashlib.sha1(usedforsecurity=False)
            while chunk := self._file.read(1 << 22):
                digest.update(chunk)
            self._file.write(digest.digest())
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            said = self._git.run("index-pack", "-o", str(self._index), str(self._path), deadline=deadline)
            name = said.decode().split()[-1]
            if name != digest.hexdigest():
                raise SnapshotError(f"git index-pack named the pack {name}, not {digest.hexdigest()}")
            final = self._path.parent / f"pack-{name}"
            self._path.replace(final.with_suffix(".pack"))
            self._index.replace(final.with_suffix(".idx"))
        finally:
            self.abort()

    def abort(self) -> None:
        if not self._file.closed:
            self._file.close()
        self._path.unlink(missing_ok=True)
        self._index.unlink(missing_ok=True)
