"""What a rewind (or an undo) did, or would do: one definition, shared by the engine and the undo,
from which the ledger's JSON, an event's data and the protobuf (rpc/convert.py, the one place
that touches protobuf) are all made.

- The ledger's JSON is the dataclasses' own (`to_json`), read back field by field from their
  types (`from_json`): a field added here is written and read with no more code, and a row
  written before it was added reads it as its default.
- An event tells watchers less than the result (`event_data`, read back by `from_event`): ids,
  the mode, the files half as the result tells it but for its fields marked `RESULT_ONLY` (text,
  or what only a preview or a refusal has), of the conversation whether it changed and how many
  messages left it (the event has no conversation half of its own), the newest message. No
  side effects, no text.

So adding a field to a rewind's result is adding it here and to its protobuf conversion.
"""

from __future__ import annotations

import enum
import types
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any, Union, cast, get_args, get_origin, get_type_hints

from agent_rewind.errors import AgentRewindError
from agent_rewind.rewind.side_effects import SideEffect

# A field's metadata: the result tells it, an event does not.
RESULT_ONLY: Mapping[str, Any] = types.MappingProxyType({"event": False})


class Mode(enum.Enum):
    FILES = "files"
    CONVERSATION = "conversation"
    BOTH = "both"

    @property
    def files(self) -> bool:
        return self in (Mode.FILES, Mode.BOTH)

    @property
    def conversation(self) -> bool:
        return self in (Mode.CONVERSATION, Mode.BOTH)


# A rewind's scope: everything since the point (every rewind before round 4), or only what the
# point's own turn changed in files (a revert, rewind/revert.py).
SINCE = "since"
TURN = "turn"


@dataclass(frozen=True)
class Refusal:
    """Why one half would be refused: the reason and message of the error Rewind fails with."""

    reason: str
    message: str
    metadata: dict[str, str] = field(default_factory=dict)


def refuse(err: AgentRewindError) -> Refusal:
    return Refusal(err.reason, err.message, dict(err.metadata))


class RefusedHalf(AgentRewindError):
    """Raised by Rewind for a refused half; carries the refusal's own reason."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message, metadata=refusal.metadata)
        self.reason = refusal.reason


@dataclass(frozen=True)
class FilesHalf:
    requested: bool = False
    can_rewind: bool = False
    files_changed: tuple[str, ...] = ()
    insertions: int = 0
    deletions: int = 0
    skipped_links: int = 0
    # (An applied rewind has none: a refused half refuses the whole rewind.)
    refusal: Refusal | None = field(default=None, metadata=RESULT_ONLY)
    # "checkpoint" (the CLI's) or "snapshot" (the service's workspace snapshots).
    source: str = "checkpoint"
    # (path, resolution). (Events have never told them.)
    conflicts: tuple[tuple[str, str], ...] = field(default=(), metadata=RESULT_ONLY)
    # DryRun with include_diff only: text.
    diffs: tuple[dict[str, Any], ...] = field(default=(), metadata=RESULT_ONLY)
    diffs_truncated: bool = field(default=False, metadata=RESULT_ONLY)


@dataclass(frozen=True)
class ConversationHalf:
    requested: bool = False
    can_rewind: bool = False
    rewound: bool = False
    messages_dropped: int = 0
    refusal: Refusal | None = None


@dataclass(frozen=True)
class RewindOutcome:
    rewind_id: str
    files: FilesHalf
    conversation: ConversationHalf
    last_message_id: str
    # What the turns it takes back did that no rewind undoes (rewind/side_effects.py).
    side_effects: tuple[SideEffect, ...] = ()

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        if not self.side_effects:
            del data["side_effects"]  # as earlier versions wrote it, so they read it back the same
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RewindOutcome:
        """What `to_json` wrote, this version's or an earlier one's (the fields it did not write
        take their defaults). Keys beside the outcome's own are left (an applied rewind's "undo");
        a key a half does not have, or a field missing that has no default, is a TypeError."""
        own = {name: value for name, value in data.items() if name in _OWN}
        return cast(RewindOutcome, _reader(cls)(own))


# The outcome's own keys in the JSON (an applied rewind's result has others beside them).
_OWN = frozenset(f.name for f in fields(RewindOutcome))


def event_data(
    target: str,
    mode: str,
    outcome: RewindOutcome,
    owner: str,
    *,
    paths: tuple[str, ...] = (),
    scope: str = SINCE,
) -> dict[str, Any]:
    """What a REWOUND or UNDONE event tells watchers (see above). `target`: the prompt rewound to;
    `owner`: the session's principal, who (with admins) may see the event; `paths`, `scope`: the
    request's (written only when set, as events before them were)."""
    files, conversation = outcome.files, outcome.conversation
    told: dict[str, Any] = {"paths": list(paths)} if paths else {}
    if scope != SINCE:
        told["scope"] = scope
    return told | {
        "owner": owner,
        "message_id": target,
        "mode": mode,
        "files": {name: _plain(getattr(files, name)) for name in _TOLD},
        "messages_dropped": conversation.messages_dropped,
        "conversation_changed": conversation.rewound,
        "last_message_id": outcome.last_message_id,
    }


def from_event(data: Mapping[str, Any]) -> RewindOutcome | None:
    """The outcome as an event's data tells it (`event_data`'s inverse; what it does not tell at
    its default, its rewind id in the event's own column); None for an event that tells none (a
    SESSION_DELETED's data has no files). Events of earlier versions read the same: every one
    wrote the files half, the fields it had."""
    files = data.get("files")
    if not isinstance(files, dict):
        return None
    return RewindOutcome(
        rewind_id="",
        files=cast(FilesHalf, _reader(FilesHalf)(files)),
        conversation=ConversationHalf(
            rewound=bool(data.get("conversation_changed", False)),
            messages_dropped=int(data.get("messages_dropped", 0)),
        ),
        last_message_id=str(data.get("last_message_id", "")),
    )


# The files half's fields an event tells.
_TOLD = tuple(f.name for f in fields(FilesHalf) if f.metadata.get("event", True))


def _plain(value: Any) -> Any:
    """A value as `asdict` and JSON have it (tuples as lists)."""
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    return asdict(value) if is_dataclass(value) and not isinstance(value, type) else value


# How to read a value of each type from its JSON, made once per type (`_reader`).
_READERS: dict[Any, Callable[[Any], Any]] = {}


def _reader(kind: Any) -> Callable[[Any], Any]:
    """How to read a value of the type `kind` from the JSON of it (`asdict`'s, once stored)."""
    found = _READERS.get(kind)
    if found is None:
        found = _READERS[kind] = _make_reader(kind)
    return found


def _same(raw: Any) -> Any:
    return raw


def _make_reader(kind: Any) -> Callable[[Any], Any]:
    if isinstance(kind, type) and is_dataclass(kind):
        hints = get_type_hints(kind)
        parts = {f.name: _reader(hints[f.name]) for f in fields(kind)}
        made = kind

        def read_object(raw: Any) -> Any:
            if not isinstance(raw, dict):
                raise TypeError(f"a {made.__name__} is not a JSON object: {raw!r}")
            unknown = raw.keys() - parts.keys()
            if unknown:
                raise TypeError(f"a {made.__name__} has no {sorted(unknown)}")
            return made(**{name: parts[name](value) for name, value in raw.items()})

        return read_object
    origin, args = get_origin(kind), get_args(kind)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        item = _reader(args[0])
        return tuple if item is _same else lambda raw: tuple(item(x) for x in raw)
    if origin is tuple:
        items = [_reader(arg) for arg in args]
        return lambda raw: tuple(read(x) for read, x in zip(items, raw, strict=True))
    if origin in (Union, types.UnionType):
        (inner,) = (_reader(arg) for arg in args if arg is not type(None))
        return lambda raw: None if raw is None else inner(raw)
    return _same
