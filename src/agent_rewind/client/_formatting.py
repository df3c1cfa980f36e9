"""Plain-text views of the API's messages: tables and key/value blocks (a turn's events: `_turns`).

Pure functions from protobuf messages to strings, so they are tested without a server.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC
from typing import Any

from google.protobuf import json_format, struct_pb2, timestamp_pb2
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from agent_rewind.api.v1 import rewind_pb2, rewind_service_pb2, session_pb2

from ._errors import refusal_hint
from ._parsing import mode_name, scope_name

PREVIEW = 60  # characters of prompt text a table shows


def to_json(message: Message, *, compact: bool = False) -> str:
    """The message as JSON with the proto's own field names and every field shown, defaults included."""
    return json_format.MessageToJson(
        message,
        preserving_proto_field_name=True,
        indent=None if compact else 2,
        ensure_ascii=False,
        always_print_fields_with_no_presence=True,
    )


def one_line(text: str, limit: int | None = None) -> str:
    """Newlines shown as ` ⏎ `, then cut to `limit` characters with a trailing `…`."""
    flat = " ⏎ ".join(part.strip() for part in text.strip().splitlines())
    if limit is not None and len(flat) > limit:
        return flat[: max(limit - 1, 0)] + "…"
    return flat


def format_time(ts: timestamp_pb2.Timestamp) -> str:
    """ISO 8601 in UTC to the second; `-` for an unset timestamp."""
    if ts.seconds == 0 and ts.nanos == 0:
        return "-"
    return ts.ToDatetime(tzinfo=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def yes_no(value: bool) -> str:
    return "yes" if value else "no"


_SIZE_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def format_size(size: int) -> str:
    """Bytes in binary units to one decimal: `512 B`, `1.5 KiB`, `12.0 MiB`."""
    if size < 1024:
        return f"{size} B"
    value = float(size)
    for unit in _SIZE_UNITS:
        value /= 1024
        if round(value, 1) < 1024 or unit == _SIZE_UNITS[-1]:
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, right: Sequence[int] = ()) -> str:
    """Columns two spaces apart under their headers; the columns in `right` are right-aligned."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        parts = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(cells)]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), *(line(r) for r in rows)])


def state_name(state: session_pb2.SessionState.ValueType) -> str:
    """`SESSION_STATE_IDLE` -> `IDLE`."""
    try:
        name = session_pb2.SessionState.Name(state)
    except ValueError:
        return f"STATE_{int(state)}"
    return name.removeprefix("SESSION_STATE_")


def _key_values(pairs: Sequence[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in pairs)
    return "\n".join(f"{k.ljust(width)}  {v}".rstrip() for k, v in pairs)


def struct_to_text(struct: struct_pb2.Struct) -> str:
    """A Struct as compact JSON with sorted keys (a Struct keeps no order), whole numbers without `.0`."""
    return json.dumps(
        json_whole(json_format.MessageToDict(struct)),
        ensure_ascii=False,
        separators=(", ", ": "),
        sort_keys=True,
    )


def json_whole(value: Any) -> Any:
    """Struct numbers are doubles; show 5.0 as 5."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: json_whole(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_whole(v) for v in value]
    return value


# --- sessions -----------------------------------------------------------------------------------


def _snapshots(session: session_pb2.Session) -> str:
    """Whether the session takes workspace snapshots, and what they hold on disk."""
    if not session.workspace_snapshots and not session.snapshot_bytes:
        return "no"
    return f"{yes_no(session.workspace_snapshots)}, {format_size(session.snapshot_bytes)} on disk"


def _storage(session: session_pb2.Session) -> str:
    """What the session holds, as last measured: its workspace, and what its rewinds need."""
    if not session.HasField("storage"):
        return "- (not measured yet)"
    storage = session.storage
    return (
        f"{format_size(storage.workspace_bytes + storage.history_bytes)}: workspace "
        f"{format_size(storage.workspace_bytes)}, history {format_size(storage.history_bytes)}"
    )


def format_session(session: session_pb2.Session) -> str:
    options = struct_to_text(session.options) if session.options.fields else "{}"
    return _key_values(
        [
            ("session_id", session.session_id),
            ("state", state_name(session.state)),
            ("cwd", session.cwd),
            ("turns", str(session.turn_count)),
            ("last_message_id", session.last_message_id or "-"),
            ("file_checkpointing", yes_no(session.file_checkpointing)),
            ("snapshots", _snapshots(session)),
            ("storage", _storage(session)),
            *_origin(session),
            ("created", format_time(session.create_time)),
            ("updated", format_time(session.update_time)),
            ("options", options),
        ]
    )


def _origin(session: session_pb2.Session) -> list[tuple[str, str]]:
    """`forked_from` for a fork: its source, and the prompt it was forked before (or `whole`)."""
    if not session.HasField("forked_from"):
        return []
    origin = session.forked_from
    return [("forked_from", f"{origin.session_id} before {origin.message_id or '- (the whole session)'}")]


def format_sessions(sessions: Sequence[session_pb2.Session]) -> str:
    if not sessions:
        return "no sessions"
    rows = [
        [
            s.session_id,
            state_name(s.state),
            str(s.turn_count),
            # What the session's workspace snapshots hold; `-` for a session that takes none.
            format_size(s.snapshot_bytes) if s.workspace_snapshots or s.snapshot_bytes else "-",
            s.last_message_id or "-",
            s.cwd,
            format_time(s.update_time),
        ]
        for s in sessions
    ]
    return format_table(
        ["SESSION", "STATE", "TURNS", "SNAPSHOTS", "LAST MESSAGE", "CWD", "UPDATED"], rows, right=[2, 3]
    )


# --- rewind points ------------------------------------------------------------------------------


def format_points(points: Sequence[rewind_pb2.RewindPoint], last_message_id: str) -> str:
    footer = f"last_message_id: {last_message_id or '-'}"
    if not points:
        return f"no rewind points\n{footer}"
    rows = [
        [
            str(p.index),
            p.message_id,
            p.resume_at_message_id or "-",
            "pruned" if p.files_pruned else yes_no(p.files_rewindable),
            yes_no(p.snapshot_available),
            yes_no(p.compacted),
            format_time(p.create_time),
            one_line(p.text, PREVIEW),
        ]
        for p in points
    ]
    table = format_table(
        ["#", "MESSAGE_ID", "RESUME_AT", "FILES", "SNAPSHOT", "COMPACTED", "CREATED", "TEXT"], rows, right=[0]
    )
    return f"{table}\n{footer}"


# --- rewinds ------------------------------------------------------------------------------------


def _refusal_lines(half: str, can_rewind: bool, refusal: rewind_pb2.Refusal, pad: str) -> list[str]:
    head = f"{half:<17}can_rewind: {yes_no(can_rewind)} · refused {refusal.reason}"
    lines = [f"{head}: {refusal.message}" if refusal.message else head]
    lines.extend(f"{pad}  {k}: {refusal.metadata[k]}" for k in sorted(refusal.metadata))
    return lines


def _hint_lines(refusal: rewind_pb2.Refusal, pad: str) -> list[str]:
    """What to do after a refused half, last in its block."""
    hint = refusal_hint(refusal.reason, refusal.metadata)
    return [f"{pad}hint: {hint}"] if hint else []


_SOURCES = {
    rewind_pb2.FILES_SOURCE_SNAPSHOT: "from the workspace snapshot",
    rewind_pb2.FILES_SOURCE_CHECKPOINT: "from the CLI's checkpoints",
}
_RESOLUTIONS = {
    rewind_pb2.CONFLICT_RESOLUTION_REFUSED: "refused (the files half is refused: nothing is applied)",
    rewind_pb2.CONFLICT_RESOLUTION_SKIPPED: "skipped (left as it is)",
    rewind_pb2.CONFLICT_RESOLUTION_OVERWRITTEN: "overwritten (restored; the external change is lost)",
}
# A revert's conflicts are files changed since the turn where the turn changed them: by later
# turns as well as by people, so "outside the agent" would be wrong, and "restored" too.
_REVERT_RESOLUTIONS = {
    rewind_pb2.CONFLICT_RESOLUTION_REFUSED: "refused (the revert is refused: nothing is applied)",
    rewind_pb2.CONFLICT_RESOLUTION_SKIPPED: "skipped (left as it is)",
    rewind_pb2.CONFLICT_RESOLUTION_OVERWRITTEN: "overwritten (put back as before the turn; what changed since is lost)",
}
_CHANGES = {
    rewind_pb2.FILE_CHANGE_ADDED: "added",
    rewind_pb2.FILE_CHANGE_MODIFIED: "modified",
    rewind_pb2.FILE_CHANGE_DELETED: "deleted",
}


def _conflict_lines(conflicts: Sequence[rewind_pb2.FileConflict], pad: str, *, revert: bool) -> list[str]:
    """The paths also changed outside the agent (for a revert: changed since in the lines the turn
    changed, or as a whole), and what happened (or would happen) to each."""
    if not conflicts:
        return []
    noun = "conflict" if len(conflicts) == 1 else "conflicts"
    why = (
        "changed since in the lines the turn changed, or as a whole"
        if revert
        else "also changed outside the agent"
    )
    resolutions = _REVERT_RESOLUTIONS if revert else _RESOLUTIONS
    lines = [f"{pad}{len(conflicts)} {noun} ({why}):"]
    lines.extend(f"{pad}  {c.path}: {resolutions.get(c.resolution, 'unknown resolution')}" for c in conflicts)
    return lines


def _diff_lines(files: rewind_pb2.FilesRewindResult, pad: str) -> list[str]:
    """Each path's change and its unified diff, the diff indented under it."""
    lines: list[str] = []
    for i, diff in enumerate(files.diffs):
        key = "diffs" if i == 0 else ""
        head = f"{key:<17}{_CHANGES.get(diff.change, 'changed')} {diff.path}"
        if diff.binary:
            lines.append(f"{head}: binary file, no diff")
            continue
        lines.append(head)
        # Split at newlines only, and kept as they are, trailing whitespace included: it may be the change.
        body = diff.unified_diff.removesuffix("\n")
        lines.extend(f"{pad}  {line}" for line in (body.split("\n") if body else []))
        if diff.truncated:
            lines.append(f"{pad}  … (this diff is cut at the service's size bound)")
    if files.diffs_truncated:
        key = "" if files.diffs else "diffs"
        lines.append(f"{key:<17}… (diffs of further paths left out: the service's size bound was reached)")
    return lines


def _wants(mode: rewind_pb2.RewindMode.ValueType) -> tuple[bool, bool]:
    """Which halves (files, conversation) a mode asks for."""
    name = mode_name(mode)
    return name in ("files", "both"), name in ("conversation", "both")


def _asked_lines(scope: rewind_pb2.RewindScope.ValueType, paths: Sequence[str]) -> list[str]:
    """What the request narrowed, which the result does not repeat: a revert's scope, the paths."""
    lines = []
    if scope == rewind_pb2.REWIND_SCOPE_TURN:
        lines.append(f"{'scope':<17}turn: reverts only what that turn changed; later changes stay")
    if paths:
        lines.append(f"{'paths':<17}{', '.join(paths)} (every other path keeps its content)")
    return lines


def format_rewind_result(
    result: rewind_pb2.RewindResult,
    mode: rewind_pb2.RewindMode.ValueType,
    *,
    dry_run: bool,
    scope: rewind_pb2.RewindScope.ValueType = rewind_pb2.REWIND_SCOPE_UNSPECIFIED,
    paths: Sequence[str] = (),
    undo: bool = False,
) -> str:
    """Both halves of a DryRun or Rewind result (for files: what serves them, and the paths also
    changed outside the agent, or for a revert changed since the turn), then the rewind id, the
    newest message id and any diffs. `scope` and `paths` are the request's: a line each comes
    first when they narrow it (the result does not carry them). `undo`: the result of an
    UndoRewind, whose rewind_id names the rewind undone."""
    want_files, want_conversation = _wants(mode)
    revert = scope == rewind_pb2.REWIND_SCOPE_TURN
    pad = " " * 17
    lines = _asked_lines(scope, paths)

    files = result.files
    if not (files.requested or want_files):
        lines.append(f"{'files':<17}not requested")
    elif files.refusal.reason:
        lines.extend(_refusal_lines("files", files.can_rewind, files.refusal, pad))
        if files.source in _SOURCES:
            lines.append(f"{pad}{_SOURCES[files.source]}")
        lines.extend(_conflict_lines(files.conflicts, pad, revert=revert))
        lines.extend(_hint_lines(files.refusal, pad))
    else:
        changed = len(files.files_changed)
        noun = "file" if changed == 1 else "files"
        source = f" · {_SOURCES[files.source]}" if files.source in _SOURCES else ""
        lines.append(
            f"{'files':<17}can_rewind: {yes_no(files.can_rewind)} · {changed} {noun} changed"
            f" (+{files.insertions} -{files.deletions}) · skipped links: {files.skipped_links}{source}"
        )
        lines.extend(f"{pad}  {path}" for path in files.files_changed)
        lines.extend(_conflict_lines(files.conflicts, pad, revert=revert))

    conv = result.conversation
    if not (conv.requested or want_conversation):
        lines.append(f"{'conversation':<17}not requested")
    elif conv.refusal.reason:
        lines.extend(_refusal_lines("conversation", conv.can_rewind, conv.refusal, pad))
        lines.extend(_hint_lines(conv.refusal, pad))
    else:
        lines.append(
            f"{'conversation':<17}can_rewind: {yes_no(conv.can_rewind)} · rewound: {yes_no(conv.rewound)}"
            f" · messages dropped: {conv.messages_dropped}"
        )

    lines.extend(_side_effect_lines(result.side_effects, pad))

    lines.append(_rewind_id_line(result.rewind_id, dry_run=dry_run, undo=undo))
    lines.append(f"{'last_message_id':<17}{result.last_message_id or '-'}")
    # Last, so that the summary stays together however long the diffs are.
    lines.extend(_diff_lines(files, pad))
    return "\n".join(lines)


# What every preview says in place of the id of what it would have done (rewind and undo alike).
DRY_RUN_NOTE = "(dry run: nothing was applied)"


def _rewind_id_line(rewind_id: str, *, dry_run: bool, undo: bool) -> str:
    """`rewind_id` of a rewind; for an undo, `undid` (or, previewed, `would undo`) the rewind it names."""
    if undo:
        key = "would undo" if dry_run else "undid"
        return f"{key:<17}{rewind_id or '-'}" + (f" {DRY_RUN_NOTE}" if dry_run else "")
    return f"{'rewind_id':<17}{rewind_id or ('- ' + DRY_RUN_NOTE if dry_run else '-')}"


def _side_effect_lines(effects: Sequence[rewind_pb2.SideEffect], pad: str) -> list[str]:
    """What the dropped turns did that no rewind undoes: a count, then one line each."""
    if not effects:
        return []
    noun = "call" if len(effects) == 1 else "calls"
    lines = [f"{'side effects':<17}{len(effects)} {noun} no rewind undoes"]
    lines.extend(
        f"{pad}  {one_line(e.tool, 60)}: {one_line(e.summary, 160)} (turn {e.message_id or '-'})"
        for e in effects
    )
    return lines


# --- rewind events -------------------------------------------------------------------------------

_SINCE = (rewind_pb2.REWIND_SCOPE_UNSPECIFIED, rewind_pb2.REWIND_SCOPE_SINCE)


def event_kind_name(kind: rewind_pb2.RewindEventKind.ValueType) -> str:
    """`REWIND_EVENT_KIND_REWOUND` -> `REWOUND`."""
    try:
        name = rewind_pb2.RewindEventKind.Name(kind)
    except ValueError:
        return f"KIND_{int(kind)}"
    return name.removeprefix("REWIND_EVENT_KIND_")


def format_rewind_event(event: rewind_pb2.RewindEvent) -> str:
    """One line: cursor, time, kind, session, rewind id, mode, a revert's scope and the paths the
    files half was narrowed to (each only when set), target message, files changed, messages dropped
    and who made the change; `-` for what the event does not carry."""
    changed = len(event.files.files_changed)
    noun = "file" if changed == 1 else "files"
    # Scope since is what every rewind does: said only when it is not that.
    narrowed = [] if event.scope in _SINCE else [f"scope {scope_name(event.scope)}"]
    if event.paths:
        narrowed.append(f"paths {', '.join(event.paths)}")
    return " · ".join(
        [
            f"cursor {event.cursor}",
            format_time(event.occur_time),
            event_kind_name(event.kind),
            f"session {event.session_id or '-'}",
            f"rewind {event.rewind_id or '-'}",
            # A deleted session's event has no mode (mode_name would call it files).
            f"mode {mode_name(event.mode) if event.mode else '-'}",
            *narrowed,
            f"message {event.message_id or '-'}",
            f"{changed} {noun} changed (+{event.files.insertions} -{event.files.deletions})",
            f"messages dropped: {event.messages_dropped}",
            f"by {event.principal or '-'}",
        ]
    )


def format_caught_up(caught_up: rewind_pb2.CaughtUp) -> str:
    return f"caught up at cursor {caught_up.cursor}; following live events"


def format_watch_response(response: rewind_service_pb2.WatchRewindEventsResponse) -> str:
    """The line one WatchRewindEvents response prints as (an event, or the caught_up mark)."""
    kind = response.WhichOneof("response")
    if kind == "event":
        return format_rewind_event(response.event)
    if kind == "caught_up":
        return format_caught_up(response.caught_up)
    return "(a response this client does not know)"


# Capabilities fields shown first, in this order (what runs, then what it serves); every other
# field follows in the proto's order, so a field added to the message cannot be left out.
_CAPABILITIES_FIRST = ("service_version", "sdk_version", "cli_version", "modes", "file_checkpoint_window")
_CAPABILITIES_TEXT: dict[str, Callable[[Any], str]] = {
    "modes": lambda modes: ", ".join(mode_name(m) for m in modes) or "-",
    "file_checkpoint_window": lambda window: f"{window} most recent prompts",
    "max_live_sessions": lambda count: str(count) if count else "-",
}


def _field_text(message: Message, field: FieldDescriptor) -> str:
    """A field's value on one line: yes/no, `-` for an empty string or list, a message's own fields
    as `name: value` pairs."""
    value = getattr(message, field.name)
    if field.name in _CAPABILITIES_TEXT:
        return _CAPABILITIES_TEXT[field.name](value)
    if field.message_type is not None and not field.is_repeated:
        return " · ".join(f"{sub.name}: {_field_text(value, sub)}" for sub in field.message_type.fields)
    if field.is_repeated:
        return ", ".join(str(v) for v in value) or "-"
    if field.type == FieldDescriptor.TYPE_BOOL:
        return yes_no(value)
    return str(value) if value != "" else "-"


def format_capabilities(caps: rewind_pb2.Capabilities) -> str:
    """Every field of the message, one line each (a message field's own fields on its line)."""
    fields = caps.DESCRIPTOR.fields_by_name
    names = [
        *_CAPABILITIES_FIRST,
        *(f.name for f in caps.DESCRIPTOR.fields if f.name not in _CAPABILITIES_FIRST),
    ]
    return _key_values([(name, _field_text(caps, fields[name])) for name in names])
