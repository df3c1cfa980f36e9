"""Domain objects <-> protobuf messages. Nothing outside rpc/ sees generated code."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from google.protobuf import json_format, struct_pb2, timestamp_pb2

from agent_rewind.api.v1 import rewind_pb2, session_pb2
from agent_rewind.errors import InvalidArgument
from agent_rewind.rewind.outcome import (
    SINCE,
    TURN,
    ConversationHalf,
    FilesHalf,
    Mode,
    Refusal,
    RewindOutcome,
    from_event,
)
from agent_rewind.sessions.turn_events import (
    AssistantEvent,
    PromptEvent,
    ResultEvent,
    RewoundEvent,
    ToolResultEvent,
    TurnEvent,
)
from agent_rewind.sessions.worker import SessionWorker, State
from agent_rewind.store.ledger import EventRecord
from agent_rewind.transcript.entries import PREVIEW_CHARS, RewindPoint

_STATES = {
    State.IDLE: session_pb2.SESSION_STATE_IDLE,
    State.RUNNING: session_pb2.SESSION_STATE_RUNNING,
    State.HIBERNATED: session_pb2.SESSION_STATE_HIBERNATED,
    State.CLOSED: session_pb2.SESSION_STATE_CLOSED,
}
_MODES = {
    rewind_pb2.REWIND_MODE_UNSPECIFIED: Mode.FILES,
    rewind_pb2.REWIND_MODE_FILES: Mode.FILES,
    rewind_pb2.REWIND_MODE_CONVERSATION: Mode.CONVERSATION,
    rewind_pb2.REWIND_MODE_BOTH: Mode.BOTH,
}
MODES_SERVED = [
    rewind_pb2.REWIND_MODE_FILES,
    rewind_pb2.REWIND_MODE_CONVERSATION,
    rewind_pb2.REWIND_MODE_BOTH,
]


def timestamp(value: datetime | None) -> timestamp_pb2.Timestamp | None:
    if value is None:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(value)
    return ts


def struct_to_dict(value: struct_pb2.Struct, field: str = "options") -> dict[str, Any]:
    try:
        return json_format.MessageToDict(value)
    except ValueError as err:  # NaN or infinite numbers have no JSON form
        raise InvalidArgument(field, str(err)) from None


def _struct(value: dict[str, Any]) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(value)
    return out


def shown_options(options: dict[str, Any]) -> dict[str, Any]:
    """A session's options as callers see them: MCP header values (credentials) are masked."""
    servers = options.get("mcp_servers")
    if not isinstance(servers, dict):
        return options
    masked = {
        name: {**config, "headers": {k: "[redacted]" for k in config["headers"]}}
        if isinstance(config, dict) and isinstance(config.get("headers"), dict)
        else config
        for name, config in servers.items()
    }
    return {**options, "mcp_servers": masked}


def session(worker: SessionWorker, last_message_id: str, turn_count: int) -> session_pb2.Session:
    record = worker.record
    return session_pb2.Session(
        session_id=worker.session_id,
        cwd=record.cwd,
        state=_STATES[worker.state],
        last_message_id=last_message_id,
        turn_count=turn_count,
        file_checkpointing=record.checkpointing,
        create_time=timestamp(record.create_time),
        update_time=timestamp(max(worker.update_time, record.update_time)),
        principal=record.principal,
        options=_struct(shown_options(record.options)),
        workspace_snapshots=record.workspace_snapshots,
        replica=worker.replica,
        forked_from=(
            session_pb2.ForkOrigin(
                session_id=record.forked_from.session_id, message_id=record.forked_from.message_id
            )
            if record.forked_from is not None
            else None
        ),
    )


def turn_event(session_id: str, event: TurnEvent, *, priced: bool = True) -> session_pb2.TurnEvent:
    """`priced`: a turn's cost is real (false for the offline model: its result's cost is 0)."""
    if isinstance(event, RewoundEvent):
        return session_pb2.TurnEvent(session_id=session_id, rewind=rewind_result(event.outcome))
    if isinstance(event, PromptEvent):
        return session_pb2.TurnEvent(
            session_id=session_id,
            message_id=event.message_id,
            parent_tool_use_id=event.parent_tool_use_id,
            user_prompt=session_pb2.UserPrompt(text=event.text),
        )
    if isinstance(event, AssistantEvent):
        return session_pb2.TurnEvent(
            session_id=session_id,
            message_id=event.message_id,
            parent_tool_use_id=event.parent_tool_use_id,
            assistant_message=session_pb2.AssistantMessage(
                api_message_id=event.api_message_id,
                text=event.text,
                model=event.model,
                tool_uses=[
                    session_pb2.ToolUse(id=c.id, name=c.name, input=_struct(c.input))
                    for c in event.tool_calls
                ],
            ),
        )
    if isinstance(event, ToolResultEvent):
        return session_pb2.TurnEvent(
            session_id=session_id,
            message_id=event.message_id,
            parent_tool_use_id=event.parent_tool_use_id,
            tool_result=session_pb2.ToolResult(
                tool_use_id=event.tool_use_id, content=event.content, is_error=event.is_error
            ),
        )
    assert isinstance(event, ResultEvent)
    return session_pb2.TurnEvent(
        session_id=session_id,
        result=session_pb2.TurnResult(
            subtype=event.subtype,
            is_error=event.is_error,
            num_turns=event.num_turns,
            duration_ms=event.duration_ms,
            total_cost_usd=event.total_cost_usd if priced else 0.0,
            result=event.result,
            stop_reason=event.stop_reason,
            interrupted=event.interrupted,
        ),
    )


def rewind_point(
    point: RewindPoint,
    checkpointing: bool,
    holds_pending: bool = False,
    snapshot: bool | None = None,
    files_pruned: bool = False,
) -> rewind_pb2.RewindPoint:
    """`holds_pending`: the session's live process ran its newest prompt, so it holds that prompt's
    checkpoint before the CLI has written it down. `snapshot`: None when no workspace snapshot was
    taken at the point, else whether snapshots can serve it; where they cannot (an incomplete
    snapshot), the CLI's checkpoints serve the point if they can, never half a snapshot.
    `files_pruned`: retention deleted what a files rewind to it needs (neither serves it)."""
    text = point.text if len(point.text) <= PREVIEW_CHARS else point.text[: PREVIEW_CHARS - 1] + "…"
    checkpoint = checkpointing and point.has_checkpoint and (holds_pending or not point.checkpoint_pending)
    return rewind_pb2.RewindPoint(
        message_id=point.message_id,
        resume_at_message_id=point.resume_at_message_id,
        compacted=point.compacted,
        text=text,
        index=point.index,
        create_time=timestamp(point.create_time),
        files_rewindable=not files_pruned and (bool(snapshot) or checkpoint),
        snapshot_available=not files_pruned and bool(snapshot),
        files_pruned=files_pruned,
    )


def mode(value: int) -> Mode:
    found: Mode | None = _MODES.get(value)  # type: ignore[call-overload]
    if found is None:
        raise InvalidArgument("mode", f"unknown RewindMode {value}")
    return found


_SCOPES = {
    rewind_pb2.REWIND_SCOPE_UNSPECIFIED: SINCE,
    rewind_pb2.REWIND_SCOPE_SINCE: SINCE,
    rewind_pb2.REWIND_SCOPE_TURN: TURN,
}
_EVENT_SCOPES = {SINCE: rewind_pb2.REWIND_SCOPE_SINCE, TURN: rewind_pb2.REWIND_SCOPE_TURN}


def scope(value: int) -> str:
    found: str | None = _SCOPES.get(value)  # type: ignore[call-overload]
    if found is None:
        raise InvalidArgument("scope", f"unknown RewindScope {value}")
    return found


def _refusal(value: Refusal | None) -> rewind_pb2.Refusal | None:
    if value is None:
        return None
    return rewind_pb2.Refusal(reason=value.reason, message=value.message, metadata=value.metadata)


_SOURCES = {
    "checkpoint": rewind_pb2.FILES_SOURCE_CHECKPOINT,
    "snapshot": rewind_pb2.FILES_SOURCE_SNAPSHOT,
}
_RESOLUTIONS = {
    "refused": rewind_pb2.CONFLICT_RESOLUTION_REFUSED,
    "skipped": rewind_pb2.CONFLICT_RESOLUTION_SKIPPED,
    "overwritten": rewind_pb2.CONFLICT_RESOLUTION_OVERWRITTEN,
}
_CHANGES = {
    "added": rewind_pb2.FILE_CHANGE_ADDED,
    "modified": rewind_pb2.FILE_CHANGE_MODIFIED,
    "deleted": rewind_pb2.FILE_CHANGE_DELETED,
}
_POLICIES = {
    rewind_pb2.CONFLICT_POLICY_UNSPECIFIED: "refuse",
    rewind_pb2.CONFLICT_POLICY_REFUSE: "refuse",
    rewind_pb2.CONFLICT_POLICY_SKIP: "skip",
    rewind_pb2.CONFLICT_POLICY_OVERWRITE: "overwrite",
}


def conflict_policy(value: int) -> str:
    found: str | None = _POLICIES.get(value)  # type: ignore[call-overload]
    if found is None:
        raise InvalidArgument("conflict_policy", f"unknown ConflictPolicy {value}")
    return found


def _files(half: FilesHalf) -> rewind_pb2.FilesRewindResult:
    return rewind_pb2.FilesRewindResult(
        requested=half.requested,
        can_rewind=half.can_rewind,
        files_changed=list(half.files_changed),
        insertions=half.insertions,
        deletions=half.deletions,
        skipped_links=half.skipped_links,
        refusal=_refusal(half.refusal),
        source=_SOURCES.get(half.source, rewind_pb2.FILES_SOURCE_UNSPECIFIED)
        if half.requested
        else rewind_pb2.FILES_SOURCE_UNSPECIFIED,
        conflicts=[
            rewind_pb2.FileConflict(
                path=path, resolution=_RESOLUTIONS.get(how, rewind_pb2.CONFLICT_RESOLUTION_UNSPECIFIED)
            )
            for path, how in half.conflicts
        ],
        diffs=[
            rewind_pb2.FileDiff(
                path=str(d["path"]),
                change=_CHANGES.get(str(d["change"]), rewind_pb2.FILE_CHANGE_UNSPECIFIED),
                unified_diff=str(d["unified_diff"]),
                binary=bool(d["binary"]),
                truncated=bool(d["truncated"]),
            )
            for d in half.diffs
        ],
        diffs_truncated=half.diffs_truncated,
    )


def _conversation(half: ConversationHalf) -> rewind_pb2.ConversationRewindResult:
    return rewind_pb2.ConversationRewindResult(
        requested=half.requested,
        can_rewind=half.can_rewind,
        rewound=half.rewound,
        messages_dropped=half.messages_dropped,
        refusal=_refusal(half.refusal),
    )


_EVENT_KINDS = {
    "REWOUND": rewind_pb2.REWIND_EVENT_KIND_REWOUND,
    "UNDONE": rewind_pb2.REWIND_EVENT_KIND_UNDONE,
    "SESSION_DELETED": rewind_pb2.REWIND_EVENT_KIND_SESSION_DELETED,
}
_EVENT_MODES = {
    Mode.FILES.value: rewind_pb2.REWIND_MODE_FILES,
    Mode.CONVERSATION.value: rewind_pb2.REWIND_MODE_CONVERSATION,
    Mode.BOTH.value: rewind_pb2.REWIND_MODE_BOTH,
}


def rewind_event(event: EventRecord) -> rewind_pb2.RewindEvent:
    """An event of the log as watchers see it (its data: rewind/outcome.py `event_data`)."""
    data = event.data
    told = from_event(data)
    return rewind_pb2.RewindEvent(
        cursor=event.cursor,
        kind=_EVENT_KINDS.get(event.kind, rewind_pb2.REWIND_EVENT_KIND_UNSPECIFIED),
        rewind_id=event.rewind_id,
        session_id=event.session_id,
        message_id=str(data.get("message_id", "")),
        mode=_EVENT_MODES.get(str(data.get("mode", "")), rewind_pb2.REWIND_MODE_UNSPECIFIED),
        files=_files(told.files) if told is not None else None,
        messages_dropped=told.conversation.messages_dropped if told is not None else 0,
        principal=event.principal,
        occur_time=timestamp(event.occur_time),
        last_message_id=told.last_message_id if told is not None else "",
        conversation_changed=told.conversation.rewound if told is not None else False,
        paths=[str(p) for p in data.get("paths", ())],
        # An event of a rewind (or undo) says its scope; a SESSION_DELETED has none.
        scope=(
            _EVENT_SCOPES.get(str(data.get("scope", SINCE)), rewind_pb2.REWIND_SCOPE_UNSPECIFIED)
            if told is not None
            else rewind_pb2.REWIND_SCOPE_UNSPECIFIED
        ),
    )


def rewind_event_json(event: EventRecord) -> dict[str, Any]:
    """The event a watcher gets, in the protobuf JSON mapping: a webhook's CloudEvent `data`."""
    return json_format.MessageToDict(rewind_event(event))


def rewind_result(outcome: RewindOutcome) -> rewind_pb2.RewindResult:
    return rewind_pb2.RewindResult(
        rewind_id=outcome.rewind_id,
        files=_files(outcome.files),
        conversation=_conversation(outcome.conversation),
        last_message_id=outcome.last_message_id,
        side_effects=[
            rewind_pb2.SideEffect(message_id=e.message_id, tool=e.tool, summary=e.summary)
            for e in outcome.side_effects
        ],
    )
