"""Typed domain errors. Each carries the ErrorInfo reason API.md names.

Domain code raises these; `agent_rewind.rpc.errors` is the one place that maps them
to gRPC status codes. Nothing else decides a status.
"""

from __future__ import annotations

from collections.abc import Mapping


class AgentRewindError(Exception):
    """A failure a client can act on. `reason` is the ErrorInfo reason (UPPER_SNAKE)."""

    reason = "INTERNAL"

    def __init__(self, message: str, *, metadata: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.metadata: dict[str, str] = dict(metadata or {})


class SessionNotFound(AgentRewindError):
    reason = "SESSION_NOT_FOUND"

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} not found", metadata={"session_id": session_id})


class MessageNotFound(AgentRewindError):
    reason = "MESSAGE_NOT_FOUND"

    def __init__(self, message_id: str) -> None:
        super().__init__(
            f"message {message_id!r} is not in the session's visible conversation",
            metadata={"message_id": message_id},
        )


class NotARewindPoint(AgentRewindError):
    reason = "NOT_A_REWIND_POINT"

    def __init__(self, message_id: str, what: str) -> None:
        super().__init__(
            f"message {message_id!r} is {what}, not a user prompt; only prompts are rewind points",
            metadata={"message_id": message_id, "kind": what},
        )


class InvalidArgument(AgentRewindError):
    """A malformed field. `field` is the request field's name, for google.rpc.BadRequest."""

    reason = "INVALID_ARGUMENT"

    def __init__(self, field: str, description: str) -> None:
        super().__init__(f"{field}: {description}", metadata={"field": field})
        self.field = field
        self.description = description


class TurnInFlight(AgentRewindError):
    reason = "TURN_IN_FLIGHT"

    def __init__(self, session_id: str) -> None:
        super().__init__(
            f"session {session_id!r} has a turn in flight; wait for its result or Interrupt it",
            metadata={"session_id": session_id},
        )


class NoConversationAnchor(AgentRewindError):
    reason = "NO_CONVERSATION_ANCHOR"

    def __init__(self, message_id: str) -> None:
        super().__init__(
            f"message {message_id!r} is the session's first prompt: there is no earlier message "
            "to resume the conversation at",
            metadata={"message_id": message_id},
        )


class FileCheckpointUnavailable(AgentRewindError):
    reason = "FILE_CHECKPOINT_UNAVAILABLE"

    def __init__(self, message_id: str, sdk_error: str) -> None:
        super().__init__(
            f"files cannot be rewound to {message_id!r}: {sdk_error}",
            metadata={"message_id": message_id, "sdk_error": sdk_error},
        )


class CheckpointingDisabled(AgentRewindError):
    reason = "CHECKPOINTING_DISABLED"

    def __init__(self, session_id: str) -> None:
        super().__init__(
            f"session {session_id!r} was created without file checkpointing; files cannot be rewound",
            metadata={"session_id": session_id},
        )


class RewindConflict(AgentRewindError):
    reason = "REWIND_CONFLICT"

    def __init__(self, expected: str, actual: str) -> None:
        super().__init__(
            f"expected_last_message_id {expected!r} is stale: the newest visible message is {actual!r}",
            metadata={"last_message_id": actual, "expected_last_message_id": expected},
        )


class RequestIdReused(AgentRewindError):
    reason = "REQUEST_ID_REUSED"

    def __init__(self, request_id: str) -> None:
        super().__init__(
            f"request_id {request_id!r} was used before with different arguments",
            metadata={"request_id": request_id},
        )


class WorkspaceOutsideRoot(AgentRewindError):
    reason = "WORKSPACE_OUTSIDE_ROOT"

    def __init__(self, cwd: str, roots: list[str], why: str = "") -> None:
        super().__init__(
            why or f"cwd {cwd!r} resolves outside the workspace roots {roots}",
            metadata={"cwd": cwd, "workspace_roots": ",".join(roots)},
        )


class AgentUnavailable(AgentRewindError):
    """The Claude Code process could not be started, or died. Retryable."""

    reason = "AGENT_UNAVAILABLE"

    def __init__(self, session_id: str, detail: str) -> None:
        super().__init__(
            f"the agent process of session {session_id!r} is unavailable: {detail}",
            metadata={"session_id": session_id},
        )


class ShuttingDown(AgentRewindError):
    """The server is draining; the caller should retry on another replica."""

    reason = "SHUTTING_DOWN"

    def __init__(self) -> None:
        super().__init__("the server is shutting down; retry against another replica")


class SessionAlreadyExists(AgentRewindError):
    """CreateSession with the id of an existing session (and no matching request_id)."""

    reason = "SESSION_ALREADY_EXISTS"

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} already exists", metadata={"session_id": session_id})


class NotServed(AgentRewindError):
    """An RPC of the contract this deployment does not serve yet (see GetCapabilities)."""

    reason = "UNIMPLEMENTED"

    def __init__(self, rpc: str) -> None:
        super().__init__(
            f"{rpc} is not served by this deployment; see GetCapabilities", metadata={"rpc": rpc}
        )


class PathOutsideWorkspace(InvalidArgument):
    """A rewind's `paths` entry that is absolute, leaves the workspace or leads through a link."""

    reason = "PATH_OUTSIDE_WORKSPACE"

    def __init__(self, path: str, why: str) -> None:
        super().__init__(
            "paths", f"{path!r} {why}; name a file or directory inside the workspace, relative to it"
        )


class OptionNotAllowed(InvalidArgument):
    """A CreateSession option the service does not let callers set (it could leave the workspace)."""

    reason = "OPTION_NOT_ALLOWED"


class WorkspaceInUse(AgentRewindError):
    reason = "WORKSPACE_IN_USE"

    def __init__(self, cwd: str, why: str) -> None:
        super().__init__(f"cwd {cwd!r} {why}", metadata={"cwd": cwd})


class LiveSessionsExhausted(AgentRewindError):
    """Every live-process slot holds a running turn. Retryable."""

    reason = "LIVE_SESSIONS_EXHAUSTED"

    def __init__(self, max_live: int) -> None:
        super().__init__(
            f"all {max_live} live Claude Code processes are running turns; retry when one ends",
            metadata={"max_live_sessions": str(max_live)},
        )


class ExternalChanges(AgentRewindError):
    reason = "EXTERNAL_CHANGES"

    def __init__(self, paths: list[str]) -> None:
        shown = ", ".join(paths[:5]) + (", ..." if len(paths) > 5 else "")
        super().__init__(
            f"{len(paths)} path(s) the rewind would restore were also changed outside the agent "
            f"({shown}); a DryRun lists them; set conflict_policy to CONFLICT_POLICY_SKIP or CONFLICT_POLICY_OVERWRITE to go on",
            metadata={"paths": str(len(paths))},
        )


class RevertConflict(AgentRewindError):
    """A revert of one turn would overwrite what changed the same lines (or the whole file) since."""

    reason = "REVERT_CONFLICT"

    def __init__(self, paths: list[str]) -> None:
        shown = ", ".join(paths[:5]) + (", ..." if len(paths) > 5 else "")
        super().__init__(
            f"{len(paths)} file(s) the turn changed were changed since in the same lines, or as a "
            f"whole ({shown}); a DryRun lists them; set conflict_policy to CONFLICT_POLICY_SKIP "
            "to leave them as they are or CONFLICT_POLICY_OVERWRITE to put them back as they were "
            "before the turn",
            metadata={"paths": str(len(paths))},
        )


class FilesPruned(AgentRewindError):
    """What a files rewind to the point needs was deleted by retention (storage/retention.py)."""

    reason = "FILES_PRUNED"

    def __init__(self, message_id: str) -> None:
        super().__init__(
            f"the point {message_id!r} is files_pruned: retention (--retain-file-points, "
            "--retain-file-days) deleted what a files rewind to it needs; a conversation rewind "
            "to it still works",
            metadata={"message_id": message_id},
        )


class UndoUnavailable(AgentRewindError):
    reason = "UNDO_UNAVAILABLE"

    def __init__(self, rewind_id: str, why: str) -> None:
        super().__init__(f"rewind {rewind_id!r} cannot be undone: {why}", metadata={"rewind_id": rewind_id})


class SnapshotUnavailable(AgentRewindError):
    reason = "SNAPSHOT_UNAVAILABLE"

    def __init__(self, message_id: str, state: str, detail: str = "") -> None:
        super().__init__(
            f"the point {message_id!r} has no complete workspace snapshot ({state})"
            + (f": {detail}" if detail else ""),
            metadata={"message_id": message_id, "snapshot_state": state},
        )


class ReplicaUnavailable(AgentRewindError):
    """The replica that owns the session is down. Retryable."""

    reason = "REPLICA_UNAVAILABLE"

    def __init__(self, replica: str, detail: str = "") -> None:
        super().__init__(
            f"replica {replica!r}, which owns the session, is unavailable"
            + (f": {detail}" if detail else ""),
            metadata={"replica": replica},
        )


class QuotaExceeded(AgentRewindError):
    """A per-principal limit. Retryable once the principal uses less."""

    reason = "QUOTA_EXCEEDED"

    def __init__(self, limit: str, maximum: int) -> None:
        super().__init__(
            f"the limit {limit!r} of {maximum} for this principal is reached",
            metadata={"limit": limit, "max": str(maximum)},
        )


class StorageQuotaExceeded(QuotaExceeded):
    """A session, or a principal's sessions together, hold as much as their storage limit or more:
    no new turn or fork until a rewind, an undo or a deletion frees some."""

    def __init__(self, limit: str, used: int, maximum: int) -> None:
        whose = "the session holds" if limit == "session_storage" else "the principal's sessions hold"
        AgentRewindError.__init__(
            self,
            f"{whose} {used} bytes, at or over the limit {limit!r} of {maximum} bytes; rewind, undo "
            "or delete to free some (those are never refused for storage)",
            metadata={"limit": limit, "used_bytes": str(used), "max_bytes": str(maximum)},
        )


class PermissionDenied(AgentRewindError):
    reason = "PERMISSION_DENIED"

    def __init__(self, permission: str) -> None:
        super().__init__(
            f"this call needs the permission {permission!r}, which the caller lacks",
            metadata={"permission": permission},
        )


class Unauthenticated(AgentRewindError):
    reason = "UNAUTHENTICATED"

    def __init__(self, detail: str = "missing or bad credentials") -> None:
        super().__init__(detail)


class CursorExpired(AgentRewindError):
    reason = "CURSOR_EXPIRED"

    def __init__(self, after: int, oldest: int) -> None:
        super().__init__(
            f"after_cursor {after} is older than the oldest retained event ({oldest}); "
            "resync from ListRewindPoints and watch from there",
            metadata={"oldest_cursor": str(oldest)},
        )


class SubscriberTooSlow(AgentRewindError):
    reason = "SUBSCRIBER_TOO_SLOW"

    def __init__(self, last_cursor: int) -> None:
        super().__init__(
            f"the watcher fell too far behind; watch again with after_cursor={last_cursor}",
            metadata={"last_cursor": str(last_cursor)},
        )


class StorageUnavailable(AgentRewindError):
    """The ledger could not be written (disk full, database locked). Retryable."""

    reason = "STORAGE_UNAVAILABLE"

    def __init__(self, detail: str) -> None:
        super().__init__(f"the service could not write its ledger: {detail}; retry")


class FilesUnavailable(StorageUnavailable):
    """The workspace's files could not be written (disk full, a path the restore must not
    follow): the same reason, and a message that says it was the files, not the ledger."""

    def __init__(self, detail: str) -> None:
        AgentRewindError.__init__(self, f"the service could not write the workspace's files: {detail}; retry")


# What to do next, by reason: docs/errors.md's "what to do" column is this table (`make docs`
# writes it there), and the CLI says it under a refusal. Markdown: `code`, [page](link) under docs/.
NEXT_STEPS: dict[str, str] = {
    "SESSION_NOT_FOUND": "check the id; `ListSessions`",
    "MESSAGE_NOT_FOUND": "`ListRewindPoints` again",
    "NOT_A_REWIND_POINT": "pick a prompt from `ListRewindPoints`",
    "INVALID_ARGUMENT": "correct the field it names, and send the request again",
    "TURN_IN_FLIGHT": "wait for the result, `Interrupt`, or `CloseSession` with `force`",
    "NO_CONVERSATION_ANCHOR": "rewind its files only (files mode), or start a new session",
    "FILE_CHECKPOINT_UNAVAILABLE": (
        "rewind the conversation only (conversation mode), or the files to a point with a workspace snapshot"
    ),
    "CHECKPOINTING_DISABLED": "rewind the conversation only (conversation mode)",
    "REWIND_CONFLICT": "re-read, decide again, retry",
    "REQUEST_ID_REUSED": "a new `request_id`",
    "PERMISSION_DENIED": "ask for the permission",
    "UNAUTHENTICATED": "authenticate",
    "WORKSPACE_OUTSIDE_ROOT": (
        "a path under `--workspace-root`; put the workspace back as the directory it was"
    ),
    "AGENT_UNAVAILABLE": (
        "retry: the next call resumes the session in a new process; the unknown-tools case needs the "
        "operator (move the SDK pin back, or teach `sessions/tools.py` the tool)"
    ),
    "CURSOR_EXPIRED": (
        "rebuild what you mirror from `ListSessions`/`ListRewindPoints`, then watch with "
        "`after_cursor` = `oldest_cursor` - 1 ([events.md](events.md))"
    ),
    "SUBSCRIBER_TOO_SLOW": (
        "watch again with your stored cursor (or `last_cursor`, everything up to which was sent)"
    ),
    "SESSION_ALREADY_EXISTS": "`GetSession`, or pass the same `request_id` to retry safely",
    "SHUTTING_DOWN": (
        "retry against another replica, or after the restart; a watcher reconnects with its cursor"
    ),
    "UNIMPLEMENTED": "feature-detect first",
    "OPTION_NOT_ALLOWED": "drop the option, or ask the operator",
    "PATH_OUTSIDE_WORKSPACE": "name files and directories relative to the workspace, inside it",
    "WORKSPACE_IN_USE": "another directory, or none (a fresh one)",
    "LIVE_SESSIONS_EXHAUSTED": "retry with backoff",
    "EXTERNAL_CHANGES": "`DryRun` lists them; retry with `conflict_policy` skip or overwrite",
    "REVERT_CONFLICT": (
        "`DryRun` lists them as conflicts; retry with `conflict_policy` skip (leave them) or "
        "overwrite (put them back as before the turn)"
    ),
    "FILES_PRUNED": (
        "a conversation rewind to it (still works), or a files rewind to a point that is not "
        "`files_pruned` ([rewind.md](rewind.md#retention))"
    ),
    "UNDO_UNAVAILABLE": "nothing to undo; rewind again instead",
    "SNAPSHOT_UNAVAILABLE": (
        "a point with `snapshot_available`; a conversation rewind; for a fork, the whole session "
        "(empty `message_id`)"
    ),
    "REPLICA_UNAVAILABLE": (
        "retry with backoff, with the same `request_id` for calls that change something; a replica "
        "that comes back serves its sessions again, and with shared storage another replica takes "
        "them over after about a lease ([scaling.md](scaling.md))"
    ),
    "QUOTA_EXCEEDED": (
        "retry once the principal uses less; for storage, rewind, undo or delete to free some (never "
        "refused for storage); for the reserve, free space on that volume"
    ),
    "STORAGE_UNAVAILABLE": "retry with backoff; free the disk",
    "INTERNAL": "report it",
}
