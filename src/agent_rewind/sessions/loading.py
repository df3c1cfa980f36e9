"""Which stored sessions this replica serves: those it owns when it starts (`load`), and those it
takes over from a replica whose lease ran out (`adopt`).

A stored session is not trusted to still be what was checked when it was made (a restored
backup, an edited row, an older version, an operator opt-in since withdrawn): its workspace is
checked against the workspace roots again, and its options against the allowlist (`servable`).
Deletions a crash interrupted after their commit are finished first: nothing of a deleted
session is served, nor left on disk, once the server admits calls.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from agent_rewind import workspace_paths
from agent_rewind.sessions import options as session_options
from agent_rewind.store.ledger import Erasure, SessionRecord, Sessions

if TYPE_CHECKING:
    from agent_rewind.sessions.worker import SessionWorker

log = structlog.get_logger(__name__)


class Stored(Sessions, Erasure, Protocol):
    """What loading reads of the ledger: the sessions, and the tombstones of deleted ones."""


# Finishes a deleted session's erasure: (session id, what its tombstone says remains to erase).
Finish = Callable[[str, Mapping[str, Any]], Awaitable[None]]


def servable(
    record: SessionRecord, *, roots: Iterable[Path], operator: session_options.OperatorOptions
) -> SessionRecord | None:
    """The stored session as it may be served: None when its workspace lies outside every root
    now; its options without those the allowlist refuses now (they are not passed to the CLI)."""
    if not workspace_paths.stored_workspace_allowed(record.cwd, roots):
        log.error(
            "a stored session's workspace lies outside every workspace root; it is not served",
            session_id=record.session_id,
            cwd=record.cwd,
        )
        return None
    options, dropped = session_options.sanitize(record.options, operator)
    if dropped:
        log.warning(
            "stored options no longer allowed are not used",
            session_id=record.session_id,
            keys=dropped,
        )
        record = dataclasses.replace(record, options=options)
    return record


async def load(
    ledger: Stored,
    *,
    replica_id: str,
    embedded: bool,
    finish: Finish,
    register: Callable[[SessionRecord], object],
) -> None:
    """Registers every session this replica owns (none has a live process yet). Sessions that
    name no owner were made by the deployment's only server before replicas were recorded: the
    first replica to start claims them. On an `embedded` ledger, which one server uses, every
    session is this server's, whatever replica id made it."""
    claimed = await ledger.claim_sessions(replica_id, every=embedded)
    if claimed:
        log.info("sessions claimed by this replica", count=claimed, replica_id=replica_id)
    for tombstone in await ledger.unfinished_erasures():
        if tombstone.replica == replica_id:  # (another's is on its owner's disk)
            await finish(tombstone.session_id, tombstone.erasure or {})
    for record in await ledger.sessions():
        if record.replica == replica_id:  # (another's: calls for it are forwarded there)
            register(record)


async def adopt(
    ledger: Stored,
    session_ids: list[str],
    *,
    held: Callable[[str], bool],
    finish: Finish,
    register: Callable[[SessionRecord], SessionWorker | None],
) -> list[SessionWorker]:
    """Registers sessions this replica just took over (on storage every replica mounts), and
    finishes the erasures their replica left unfinished. Returns the new workers (the rewind
    engine finishes their interrupted rewinds). `held`: whether this replica holds a session."""
    adopted = []
    for session_id in session_ids:
        record = await ledger.session(session_id)
        if record is None:
            tombstone = await ledger.tombstone(session_id)
            if tombstone is not None and tombstone.erasure is not None:
                await finish(session_id, tombstone.erasure)
        elif not held(session_id) and (worker := register(record)):
            adopted.append(worker)
    return adopted
