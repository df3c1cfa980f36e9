"""The rewind intent: what the ledger records of a rewind (or an undo) before anything of it is
applied, and what it keeps of one once applied. The recorded intent is the commit point of the
design (rewind/engine.py): recovery finishes a rewind from it alone, in a later process, perhaps
on another replica, perhaps of another version.

Version 1 is the JSON the engine wrote before these records existed, with no "version" field;
`from_json` reads it with or without one, including intents of older builds that lack the fields
added since (the snapshot, what an undo needs, what the rewind was planned against). `to_json`
writes version 1 with its number: every key the previous version wrote, with the same values (but
an undo's null `whole`, which it read as absent), so a server of that version (a rollback, or an
older replica finishing another's rewind) reads it too; it ignores the number.

An intent this version cannot read, malformed or of a later version, raises UnreadableIntent. It
is not an AgentRewindError, on purpose: like the KeyError such an intent raised before, it stops
recovery (the server does not start), keeps the intent pending, and fails the session's next call
as an internal error, rather than being skipped or dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from agent_rewind.rewind.outcome import SINCE, RewindOutcome
from agent_rewind.store.ledger import Anchor, RewindRecord

VERSION = 1
# Version 2 is version 1 with what an older server must not finish as version 1 would: a files
# rewind from the CLI's checkpoints narrowed to some paths (version 1 would have the CLI restore
# every file). Only such intents are written as version 2; every other is still version 1.
NARROWED = 2

_T = TypeVar("_T")


class UnreadableIntent(ValueError):
    """A recorded intent (or an applied rewind's result) this version cannot read."""


def _get(data: dict[str, Any], key: str, kind: type[_T]) -> _T:
    if key not in data:
        raise UnreadableIntent(f"it has no {key!r}")
    value = data[key]
    if not isinstance(value, kind):
        raise UnreadableIntent(f"its {key!r} is not a {kind.__name__}: {value!r}")
    return value


def _optional(data: dict[str, Any], key: str, kind: type[_T]) -> _T | None:
    """A field older versions may lack, or write as null."""
    return None if data.get(key) is None else _get(data, key, kind)


def _object(data: dict[str, Any], key: str) -> dict[str, Any] | None:
    return _optional(data, key, dict)


def _paths(data: dict[str, Any]) -> tuple[str, ...]:
    paths = _get(data, "paths", list)
    if not all(isinstance(p, str) for p in paths):
        raise UnreadableIntent(f"its paths are not strings: {paths!r}")
    return tuple(paths)


def _checked(data: Any, versions: tuple[int, ...] = (VERSION,)) -> dict[str, Any]:
    """The JSON object of a version this one reads (`versions`)."""
    if not isinstance(data, dict):
        raise UnreadableIntent(f"it is not a JSON object: {data!r}")
    version = data.get("version", 1)
    if version not in versions or isinstance(version, bool):
        shown = " or ".join(str(v) for v in versions)
        raise UnreadableIntent(f"it is of version {version!r}; this server reads version {shown}")
    return data


def _named(record: RewindRecord, read: Callable[[Any], _T]) -> _T:
    """The record's intent, read; an UnreadableIntent says which record it is."""
    try:
        return read(record.plan)
    except UnreadableIntent as err:
        raise UnreadableIntent(
            f"the intent of {record.kind} {record.rewind_id} cannot be read: {err}"
        ) from err


def _outcome(data: dict[str, Any]) -> RewindOutcome:
    try:
        return RewindOutcome.from_json(_get(data, "outcome", dict))
    except (KeyError, TypeError, ValueError) as err:
        raise UnreadableIntent(f"its outcome cannot be read: {err!r}") from err


@dataclass(frozen=True)
class SnapshotRestore:
    """A files half served by workspace snapshots: the paths made equal to the point's tree."""

    start: str  # the tree at the point's turn start: what is restored
    now: str  # the workspace when the rewind was planned: the rollback
    paths: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"start": self.start, "now": self.now, "paths": list(self.paths)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SnapshotRestore:
        return cls(_get(data, "start", str), _get(data, "now", str), _paths(data))


@dataclass(frozen=True)
class FilesBefore:
    """What an undo of a rewind needs of its files, kept when the rewind is planned: the paths it
    changes (workspace-relative), as they were (a tree of the session's snapshot store)."""

    tree: str
    paths: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"before": self.tree, "paths": list(self.paths)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FilesBefore:
        return cls(_get(data, "before", str), _paths(data))


def _anchor(data: dict[str, Any]) -> Anchor:
    return Anchor(
        session_id=_get(data, "session_id", str),
        anchor_uuid=_get(data, "anchor_uuid", str),
        target_message_id=_get(data, "target_message_id", str),
        transcript_size=_get(data, "transcript_size", int),
        drops_turn=_optional(data, "drops_turn", str),
        rewind_id=_get(data, "rewind_id", str),
    )


@dataclass(frozen=True)
class Intent:
    """A rewind's intent (a record of kind "rewind"): everything finishing it needs."""

    target: str  # the prompt rewound to
    restores_files: bool  # the mode has a files half
    outcome: RewindOutcome  # both halves as planned (its last_message_id is not known yet)
    anchor: Anchor | None  # the conversation cut, for a mode with a conversation half
    snapshot: SnapshotRestore | None = None  # a files half served by workspace snapshots
    files_before: FilesBefore | None = None  # None: this rewind's files cannot be undone
    # What it was planned against: the conversation's leaf (what an undo brings back), and its
    # newest message and transcript size (it never cuts a conversation that has moved on).
    # None in intents of versions that did not record them.
    planned_leaf: str | None = None
    planned_last_message_id: str | None = None
    planned_transcript_size: int | None = None
    # The files half from checkpoints was planned without the CLI: its files_changed are those
    # the rewind may change, and what it did change is seen once it has (rewind/checkpoints.py).
    observed: bool = False
    # The paths the files half was narrowed to (empty: all), and the rewind's scope ("since", or
    # "turn": a revert of one turn, rewind/revert.py), for its event.
    paths: tuple[str, ...] = ()
    scope: str = SINCE

    @property
    def narrows_checkpoints(self) -> bool:
        """A files half from the CLI's checkpoints narrowed to some paths: the service restores
        them from the CLI's backups itself (rewind/checkpoints.py `planned`)."""
        return self.restores_files and self.snapshot is None and bool(self.paths)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "version": NARROWED if self.narrows_checkpoints else VERSION,
            "target": self.target,
            "files": self.restores_files,
            "snapshot": self.snapshot.to_json() if self.snapshot is not None else None,
            "undo": self.files_before.to_json() if self.files_before is not None else None,
            "planned_leaf": self.planned_leaf,
            "anchor": asdict(self.anchor) if self.anchor is not None else None,
            "outcome": self.outcome.to_json(),
            "planned_last_message_id": self.planned_last_message_id,
            "planned_transcript_size": self.planned_transcript_size,
        }
        # (Each written only when set: an older version's intent is written back as it was.)
        if self.observed:
            data["observed"] = True
        if self.paths:
            data["paths"] = list(self.paths)
        if self.scope != SINCE:
            data["scope"] = self.scope
        return data

    @classmethod
    def from_json(cls, data: Any) -> Intent:
        data = _checked(data, (VERSION, NARROWED))
        anchor = _object(data, "anchor")
        snapshot = _object(data, "snapshot")
        before = _object(data, "undo")
        return cls(
            target=_get(data, "target", str),
            restores_files=_get(data, "files", bool),
            outcome=_outcome(data),
            anchor=_anchor(anchor) if anchor is not None else None,
            snapshot=SnapshotRestore.from_json(snapshot) if snapshot is not None else None,
            files_before=FilesBefore.from_json(before) if before is not None else None,
            planned_leaf=_optional(data, "planned_leaf", str),
            planned_last_message_id=_optional(data, "planned_last_message_id", str),
            planned_transcript_size=_optional(data, "planned_transcript_size", int),
            observed=_optional(data, "observed", bool) or False,
            paths=_paths(data) if data.get("paths") is not None else (),
            scope=_optional(data, "scope", str) or SINCE,
        )

    @classmethod
    def of(cls, record: RewindRecord) -> Intent:
        """The intent the ledger recorded for a rewind; UnreadableIntent names it."""
        return _named(record, cls.from_json)


@dataclass(frozen=True)
class UndoFiles:
    """The files an undo puts back: the paths its rewind changed, as they were before it."""

    before: str  # the tree the rewind kept (FilesBefore): what is restored
    now: str  # the same paths when the undo was planned: the rollback
    paths: tuple[str, ...]  # those that differ now (after conflict_policy)
    insertions: int
    deletions: int
    conflicts: tuple[tuple[str, str], ...]  # (path, resolution)
    source: str  # the rewind's: "checkpoint" or "snapshot"
    # The whole workspace before the undo, for a session with snapshots (the tree after it is
    # computed from it, without a scan); None when unknown.
    whole: str | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "before": self.before,
            "now": self.now,
            "paths": list(self.paths),
            "insertions": self.insertions,
            "deletions": self.deletions,
            "conflicts": [list(c) for c in self.conflicts],
            "source": self.source,
        }
        if self.whole is not None:
            data["whole"] = self.whole
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> UndoFiles:
        conflicts = _get(data, "conflicts", list)
        if not all(
            isinstance(c, list) and len(c) == 2 and all(isinstance(x, str) for x in c) for c in conflicts
        ):
            raise UnreadableIntent(f"its conflicts are not (path, resolution) pairs: {conflicts!r}")
        return cls(
            before=_get(data, "before", str),
            now=_get(data, "now", str),
            paths=_paths(data),
            insertions=_get(data, "insertions", int),
            deletions=_get(data, "deletions", int),
            conflicts=tuple((p, how) for p, how in conflicts),
            source=_get(data, "source", str),
            whole=_optional(data, "whole", str),
        )


@dataclass(frozen=True)
class UndoIntent:
    """An undo's intent (a record of kind "undo"): everything finishing it needs."""

    undoes: str  # the rewind it undoes
    files: UndoFiles | None  # None: no files to put back
    leaf: str | None  # the conversation's leaf before that rewind; None: no conversation half
    outcome: RewindOutcome  # what the undo reports

    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "undoes": self.undoes,
            "files": self.files.to_json() if self.files is not None else None,
            "leaf": self.leaf,
            "outcome": self.outcome.to_json(),
        }

    @classmethod
    def from_json(cls, data: Any) -> UndoIntent:
        data = _checked(data)
        files = _object(data, "files")
        return cls(
            undoes=_get(data, "undoes", str),
            files=UndoFiles.from_json(files) if files is not None else None,
            leaf=_optional(data, "leaf", str),
            outcome=_outcome(data),
        )

    @classmethod
    def of(cls, record: RewindRecord) -> UndoIntent:
        """The intent the ledger recorded for an undo; UnreadableIntent names it."""
        return _named(record, cls.from_json)


@dataclass(frozen=True)
class Applied:
    """What the ledger keeps of a rewind once applied: its outcome and, for an undo of it, the
    files it changed as it left them (a tree of the snapshot store; what differs from it now was
    changed since, by someone else)."""

    outcome: RewindOutcome
    files_after: str | None = None

    def to_json(self) -> dict[str, Any]:
        data = self.outcome.to_json()
        if self.files_after is not None:
            data["undo"] = {"after": self.files_after}
        return data

    @classmethod
    def from_json(cls, data: Any) -> Applied:
        if not isinstance(data, dict):
            raise UnreadableIntent(f"a rewind's result is not a JSON object: {data!r}")
        kept = _object(data, "undo")
        try:
            outcome = RewindOutcome.from_json(data)
        except (KeyError, TypeError, ValueError) as err:
            raise UnreadableIntent(f"a rewind's result cannot be read: {err!r}") from err
        return cls(outcome, _optional(kept, "after", str) if kept is not None else None)


# What retention keeps of the snapshot store besides the snapshots (storage/retention.py)


def undo_trees(rewinds: Sequence[RewindRecord], kept: Callable[[str], bool]) -> set[str]:
    """The trees of a session's snapshot store its rewinds still need that are no snapshot (a
    files half from checkpoints captures its paths): a pending intent's, whatever it is, and the
    latest rewind's (what an undo of it restores and compares with) while `kept` says the point
    it rewound to keeps its files. An intent that cannot be read raises UnreadableIntent."""
    trees: set[str] = set()
    for record in rewinds:
        if record.state != "applied":
            trees |= _trees(record)
    applied = [r for r in rewinds if r.state == "applied"]
    if applied and applied[-1].kind == "rewind" and applied[-1].result is not None:
        latest = applied[-1]
        if kept(Intent.of(latest).target):
            trees |= _trees(latest)
            after = Applied.from_json(latest.result).files_after
            if after:
                trees.add(after)
    return trees


def _trees(record: RewindRecord) -> set[str]:
    """The trees a rewind's (or an undo's) intent names."""
    found: tuple[str | None, ...] = ()
    if record.kind == "undo":
        files = UndoIntent.of(record).files
        if files is not None:
            found = (files.before, files.now, files.whole)
    else:
        intent = Intent.of(record)
        if intent.snapshot is not None:
            found = (intent.snapshot.start, intent.snapshot.now)
        if intent.files_before is not None:
            found = (*found, intent.files_before.tree)
    return {tree for tree in found if tree}
