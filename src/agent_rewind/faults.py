"""Test-only fault injection: the server SIGKILLs itself at a named step.

Crash tests (and `make soak`) start a real server with `AGENT_REWIND_FAULT=<step>` (or
`<step>@<n>` for the n-th time the step is reached) and check what a restart makes of the state
the crash left. With `AGENT_REWIND_FAULT_SCOPE=group` the whole process group dies, the CLI
processes with the server, as when a pod is killed for memory or a node is lost.

Without the variable every `point()` is a dictionary lookup that finds nothing. The steps are
listed here, so a test can walk every one of them and a typo fails loudly.
"""

from __future__ import annotations

import os
import signal
import sys

STEPS: dict[str, str] = {
    # A rewind, in order.
    "rewind.planned": "both halves validated; nothing recorded or applied yet",
    "rewind.intent_recorded": "the intent is in the ledger; the files are not restored yet",
    "rewind.files_restored": "the CLI restored the files; the ledger does not say so yet",
    "rewind.files_recorded": "the ledger says the files are restored; the rewind is not complete",
    "rewind.completed": "the rewind and its cut are in the ledger; the live process is not cut yet",
    # An undo, in order.
    "undo.intent_recorded": "the undo's intent is in the ledger; nothing is put back yet",
    "undo.files_restored": "the files are put back; the undo is not complete",
    "undo.completed": "the undo and its cut are in the ledger; the live process is not let go yet",
    # A DeleteSession, in order.
    "delete.recorded": "the tombstone and its event are in the ledger; no file is erased yet",
    "delete.erased": "every file is erased; the tombstone does not say so yet",
    # A turn, in order.
    "turn.accepted": "the prompt is accepted and its request id recorded; no CLI process asked yet",
    "turn.prompt_sent": "the prompt was written to the CLI",
    "turn.prompt_recorded": "the CLI wrote the prompt to the transcript and echoed it",
    "turn.result": "the CLI answered the turn's result; the service has not recorded the turn",
    "turn.recorded": "the turn is recorded; its stream has not ended",
    # A retention pass (storage/retention.py), in order.
    "retention.marked": "the points are marked files_pruned in the ledger; nothing is deleted yet",
    "retention.pruned": "the snapshot records are pruned; their objects and the backups are not deleted yet",
    "retention.collected": "the snapshot repository is collected; the backups are not deleted yet",
    # The points index (sessions/points.py), whenever it is written from the transcript.
    "points.recording": "the transcript was read for the points index; the ledger does not hold it yet",
}

_ENV = "AGENT_REWIND_FAULT"
_SCOPE_ENV = "AGENT_REWIND_FAULT_SCOPE"


def _parse(value: str) -> tuple[str, int] | None:
    if not value:
        return None
    step, _, nth = value.partition("@")
    if step not in STEPS:
        raise ValueError(f"{_ENV}={value!r}: unknown step; steps are {sorted(STEPS)}")
    return step, int(nth) if nth else 1


_armed = _parse(os.environ.get(_ENV, ""))
_hits: dict[str, int] = {}


def point(step: str) -> None:
    """Marks a step; dies here with SIGKILL when the environment armed this step (and hit)."""
    if step not in STEPS:
        raise ValueError(f"unknown fault step {step!r}")
    if _armed is None or _armed[0] != step:
        return
    _hits[step] = _hits.get(step, 0) + 1
    if _hits[step] < _armed[1]:
        return
    print(f"agent-rewind: fault injected at {step}: SIGKILL", file=sys.stderr, flush=True)
    if os.environ.get(_SCOPE_ENV) == "group":
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
