"""Git's index file, read and written here (git's gitformat-index, versions 2, 3 and 4).

Read: the workspace's own `.git/index`, which the agent may have written: so nothing in it is
trusted but its shape. The trailing checksum must match, entries must parse within the file,
and every entry is returned with its flags for the caller to judge (`seed`). A split index (the
`link` extension: its entries are in another file) is refused; other extensions are skipped.

Written: the store's private index, version 2 with no extension, from entries whose stat data
the store took itself, so that git's next `diff-files` finds them unchanged and hashes nothing.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Iterable
from typing import NamedTuple

SIGNATURE = b"DIRC"
_HEAD = struct.Struct(">4sII")  # signature, version, entries
# ctime s, ns; mtime s, ns; dev; ino; mode; uid; gid; size; oid (20 bytes); flags
_ENTRY = struct.Struct(">10I20sH")
_OID = 20

# flags
ASSUME_VALID = 0x8000
EXTENDED = 0x4000
STAGE_MASK = 0x3000
NAME_MASK = 0x0FFF
# extended flags (version 3 and later)
SKIP_WORKTREE = 0x4000
INTENT_TO_ADD = 0x2000

MODE_FILE = 0o100644
MODE_EXECUTABLE = 0o100755
MODE_SYMLINK = 0o120000
MODE_GITLINK = 0o160000
MODE_DIRECTORY = 0o040000  # a sparse directory entry


class BadIndex(ValueError):
    """The file is not an index this module reads (bad signature, version, checksum, shape)."""


class Stat(NamedTuple):
    """The stat data an index entry keeps (each field as git keeps it: 32 bits)."""

    ctime_s: int
    ctime_ns: int
    mtime_s: int
    mtime_ns: int
    dev: int
    ino: int
    mode: int  # git's mode: 100644, 100755, 120000 (or 160000, 040000 in a read index)
    uid: int
    gid: int
    size: int

    @classmethod
    def of(cls, st_mode: int, st: os.stat_result) -> Stat:
        """The stat data git would record for a file with this `os.stat_result` (lstat)."""
        return cls(
            int(st.st_ctime_ns // 1_000_000_000) & 0xFFFFFFFF,
            int(st.st_ctime_ns % 1_000_000_000),
            int(st.st_mtime_ns // 1_000_000_000) & 0xFFFFFFFF,
            int(st.st_mtime_ns % 1_000_000_000),
            st.st_dev & 0xFFFFFFFF,
            st.st_ino & 0xFFFFFFFF,
            st_mode,
            st.st_uid & 0xFFFFFFFF,
            st.st_gid & 0xFFFFFFFF,
            st.st_size & 0xFFFFFFFF,
        )


class IndexEntry(NamedTuple):
    path: bytes
    oid: str
    stat: Stat
    flags: int
    extended: int  # the extended flags (0 when the entry has none)

    @property
    def stage(self) -> int:
        return (self.flags & STAGE_MASK) >> 12


def parse(data: bytes) -> list[IndexEntry]:
    """The entries of an index file's bytes. Raises BadIndex for anything git would not read,
    and for a split index."""
    if len(data) < _HEAD.size + _OID:
        raise BadIndex("too short")
    body, checksum = data[:-_OID], data[-_OID:]
    # gremlin: pardon[untestable] True differs only where hashlib is FIPS-restricted (SHA-1 refused); no test machine is
    digest = hashlib.sha1(body, usedforsecurity=False).digest()
    if digest != checksum:
        raise BadIndex("its checksum does not match (not a SHA-1 index, or damaged)")
    signature, version, count = _HEAD.unpack_from(body, 0)
    if signature != SIGNATURE:
        raise BadIndex("not an index (signature)")
    if version not in (2, 3, 4):
        raise BadIndex(f"index version {version}")
    entries: list[IndexEntry] = []
    append = entries.append
    at = _HEAD.size
    previous = b""
    unpack = _ENTRY.unpack_from
    size = _ENTRY.size
    end = len(body)
    # The loop runs once per file of the workspace (100,000 in a big one): kept lean, the tuples
    # made as `_make` makes them, without its call.
    new = tuple.__new__
    for _ in range(count):
        if at + size > end:
            raise BadIndex("an entry runs past the end")
        fields = unpack(body, at)
        flags = fields[11]
        start = at
        at += size
        extended = 0
        if flags & EXTENDED:
            if version < 3:
                raise BadIndex("an extended entry in a version 2 index")
            (extended,) = struct.unpack_from(">H", body, at)
            at += 2
        if version == 4:
            strip, at = _varint(body, at)
            if strip > len(previous):
                raise BadIndex("a prefix longer than the previous name")
            nul = body.find(b"\0", at)
            if nul < 0:
                raise BadIndex("a name without its end")
            path = previous[: len(previous) - strip] + body[at:nul]
            at = nul + 1
            previous = path
        else:
            length = flags & NAME_MASK
            if length < NAME_MASK:
                nul = at + length
                if nul >= end or body[nul]:
                    raise BadIndex("a name of the wrong length")
            else:
                nul = body.find(b"\0", at)
                if nul < 0:
                    raise BadIndex("a name without its end")
            path = body[at:nul]
            # padded with 1 to 8 NULs to a multiple of 8 bytes from the entry's start
            at = start + ((nul - start + 8) & ~7)
            if at > end:
                raise BadIndex("an entry's padding runs past the end")
        append(new(IndexEntry, (path, fields[10].hex(), new(Stat, fields[:10]), flags, extended)))
    _check_extensions(body, at)
    return entries


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """Git's offset varint (version 4 prefixes): 7 bits a byte, each continuation adds one."""
    if at >= len(data):
        raise BadIndex("a prefix runs past the end")
    byte = data[at]
    at += 1
    value = byte & 0x7F
    while byte & 0x80:
        if at >= len(data) or value > 1 << 32:
            raise BadIndex("a bad prefix length")
        byte = data[at]
        at += 1
        value = ((value + 1) << 7) | (byte & 0x7F)
    return value, at


def _check_extensions(body: bytes, at: int) -> None:
    while at < len(body):
        if at + 8 > len(body):
            raise BadIndex("a truncated extension")
        name = body[at : at + 4]
        (length,) = struct.unpack_from(">I", body, at + 4)
        if name == b"link":
            raise BadIndex("a split index (its entries are in another file)")
        at += 8 + length
        if at > len(body):
            raise BadIndex("an extension runs past the end")


def write(entries: Iterable[tuple[bytes, str, Stat]]) -> bytes:
    """A version 2 index of `(path, oid, stat)` entries, sorted as git sorts them (byte order),
    stage 0, no extension. The caller gives each path once."""
    rows = sorted(entries, key=lambda e: e[0])
    out = [_HEAD.pack(SIGNATURE, 2, len(rows))]
    pack = _ENTRY.pack
    for path, oid, st in rows:
        head = pack(
            st.ctime_s, st.ctime_ns, st.mtime_s, st.mtime_ns, st.dev, st.ino, st.mode, st.uid, st.gid,
            st.size, bytes.fromhex(oid), min(len(path), NAME_MASK),
        )  # fmt: skip
        used = _ENTRY.size + len(path)
        out.append(head + path + b"\0" * (8 - used % 8))
    body = b"".join(out)
    # gremlin: pardon[untestable] True differs only where hashlib is FIPS-restricted (SHA-1 refused); no test machine is
    digest = hashlib.sha1(body, usedforsecurity=False).digest()
    return body + digest
