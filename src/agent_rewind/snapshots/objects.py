"""Git objects read and written in Python, for the work that need not start a git process.

Writing: a loose object is `zlib(kind size\\0body)` under `objects/xx/yyyy`, named by its SHA-1;
written beside its name and renamed into place, read-only, as git does. Reading: a loose object
is read here; one git has packed (`keep_only` repacks) through one `git cat-file --batch`,
started on first need. Trees are kept in a bounded cache (a tree id names its content forever).

`Objects.edit` is `write-tree` for a few paths: the tree `root` with some paths set or removed,
rewriting only the trees on the way to them. Its trees are exactly those git writes for the same
entries: names sorted as git sorts them (a directory as its name and `/`), directories left empty
dropped, git's modes.
"""

from __future__ import annotations

import hashlib
import secrets
import subprocess
import zlib
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

from agent_rewind.snapshots.errors import SnapshotError
from agent_rewind.snapshots.git import EMPTY_TREE, Git

MODE_TREE = "40000"

# name -> (mode, oid) of one tree
TreeEntries = dict[str, tuple[str, str]]

# Trees kept parsed (about 100 bytes an entry): the chains a session's edits go through.
TREE_CACHE = 4096


def tree_body(entries: Mapping[str, tuple[str, str]]) -> bytes:
    """A tree object's body, as git writes it: entries in git's order (a directory sorts as its
    name followed by "/"), each `mode name\\0` and the raw id."""

    def key(name: str) -> bytes:
        encoded = name.encode("utf-8", "surrogateescape")
        return encoded + b"/" if entries[name][0] == MODE_TREE else encoded

    return b"".join(
        entries[name][0].encode() + b" " + name.encode("utf-8", "surrogateescape") + b"\0"
        + bytes.fromhex(entries[name][1])
        for name in sorted(entries, key=key)
    )  # fmt: skip


class ObjectKindError(SnapshotError):
    pass


class Objects:
    """One repository's objects. Not thread-safe (the store uses it under its lock); `close()`
    ends the `cat-file` process if one was started."""

    def __init__(self, repo: Path, git: Git) -> None:
        self.repo = repo
        self._git = git
        self._batch: subprocess.Popen[bytes] | None = None
        self._trees: OrderedDict[str, TreeEntries] = OrderedDict()

    def __enter__(self) -> Objects:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._batch is not None:
            self._batch.kill()
            self._batch.communicate()
            self._batch = None

    # --- reading

    def read(self, oid: str, kind: bytes) -> bytes:
        """The body of object `oid`, which must be a `kind` (b"blob", b"tree")."""
        try:
            raw = zlib.decompress((self.repo / "objects" / oid[:2] / oid[2:]).read_bytes())
        except FileNotFoundError:
            return self._read_packed(oid, kind)
        except zlib.error as err:
            raise SnapshotError(f"object {oid} is corrupt in the snapshot repository: {err}") from err
        header, _, body = raw.partition(b"\0")
        found, _, size = header.partition(b" ")
        if found != kind or int(size) != len(body):
            raise ObjectKindError(f"object {oid} is not a whole {kind.decode()} in the snapshot repository")
        return body

    def _read_packed(self, oid: str, kind: bytes) -> bytes:
        if self._batch is None:
            self._batch = self._git.popen("cat-file", "--batch")
        stdin, stdout = self._batch.stdin, self._batch.stdout
        assert stdin is not None and stdout is not None  # both are pipes
        stdin.write(oid.encode() + b"\n")
        stdin.flush()
        header = stdout.readline().split()
        if len(header) != 3 or header[1] != kind:
            raise ObjectKindError(f"object {oid} is not a {kind.decode()} in the snapshot repository")
        size = int(header[2])
        data = stdout.read(size)
        stdout.read(1)  # the newline after the content
        if len(data) != size:
            raise SnapshotError(f"object {oid} was cut short")
        return data

    def tree(self, oid: str) -> TreeEntries:
        """The entries of tree `oid` (do not change the dict: it is cached)."""
        found = self._trees.get(oid)
        if found is not None:
            self._trees.move_to_end(oid)
            return found
        body = b"" if oid == EMPTY_TREE else self.read(oid, b"tree")
        entries: TreeEntries = {}
        at = 0
        while at < len(body):
            space = body.index(b" ", at)
            nul = body.index(b"\0", space)
            mode = body[at:space].decode()
            name = body[space + 1 : nul].decode("utf-8", "surrogateescape")
            entries[name] = (mode, body[nul + 1 : nul + 21].hex())
            at = nul + 21
        self._remember(oid, entries)
        return entries

    def lookup(self, root: str, path: str) -> tuple[str, str] | None:
        """The (mode, oid) at `path` in tree `root`, or None."""
        *dirs, name = path.split("/")
        oid = root
        for part in dirs:
            entry = self.tree(oid).get(part)
            if entry is None or entry[0] != MODE_TREE:
                return None
            oid = entry[1]
        return self.tree(oid).get(name)

    # --- writing

    def write(self, kind: bytes, body: bytes) -> str:
        """Writes a loose object unless it exists; its id."""
        raw = kind + b" %d\0" % len(body) + body
        oid = hashlib.sha1(raw, usedforsecurity=False).hexdigest()
        target = self.repo / "objects" / oid[:2] / oid[2:]
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            scratch = target.with_name(f".{oid[2:]}.{secrets.token_hex(4)}.tmp")
            scratch.write_bytes(zlib.compress(raw, 1))
            scratch.chmod(0o444)
            scratch.replace(target)
        return oid

    def write_tree(self, entries: Mapping[str, tuple[str, str]]) -> str:
        oid = self.write(b"tree", tree_body(entries))
        self._remember(oid, dict(entries))
        return oid

    def edit(self, root: str, changes: Mapping[str, tuple[str, str] | None]) -> str:
        """Tree `root` with each path of `changes` set to its (mode, blob oid), or removed when
        None; a directory left empty is removed, as git never writes one. A path under a file
        that stays a file, set to None, is nothing to remove. Setting a path under an entry that
        is not a directory raises SnapshotError (the caller lets git write such a tree)."""
        split = {tuple(path.split("/")): value for path, value in changes.items()}
        return self._edit(root, split) or EMPTY_TREE

    def _edit(self, oid: str | None, changes: dict[tuple[str, ...], tuple[str, str] | None]) -> str | None:
        entries = dict(self.tree(oid)) if oid is not None else {}
        below: dict[str, dict[tuple[str, ...], tuple[str, str] | None]] = {}
        for parts, value in changes.items():
            if len(parts) > 1:
                below.setdefault(parts[0], {})[parts[1:]] = value
            elif value is None:
                entries.pop(parts[0], None)
            else:
                entries[parts[0]] = value
        for name, inner in below.items():
            current = entries.get(name)
            if current is not None and current[0] != MODE_TREE:
                if any(value is not None for value in inner.values()):
                    raise SnapshotError(f"{name!r} is not a directory in the snapshot")
                continue
            edited = self._edit(current[1] if current is not None else None, inner)
            if edited is None:
                entries.pop(name, None)
            else:
                entries[name] = (MODE_TREE, edited)
        if not entries:
            return None
        if oid is not None and entries == self.tree(oid):
            return oid
        return self.write_tree(entries)

    def _remember(self, oid: str, entries: TreeEntries) -> None:
        self._trees[oid] = entries
        self._trees.move_to_end(oid)
        while len(self._trees) > TREE_CACHE:
            self._trees.popitem(last=False)
