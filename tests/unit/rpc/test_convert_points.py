"""Rewind points as clients see them: when files can be rewound to one."""

from __future__ import annotations

from agent_rewind.rpc.convert import rewind_point
from agent_rewind.transcript.entries import RewindPoint


def _point(*, has_checkpoint: bool, pending: bool) -> RewindPoint:
    return RewindPoint(
        "m-1", "a-0", "say hi", 3, None, has_checkpoint=has_checkpoint, checkpoint_pending=pending
    )


def test_a_written_checkpoint_makes_the_point_files_rewindable() -> None:
    assert rewind_point(_point(has_checkpoint=True, pending=False), checkpointing=True).files_rewindable
    assert not rewind_point(_point(has_checkpoint=True, pending=False), checkpointing=False).files_rewindable
    assert not rewind_point(_point(has_checkpoint=False, pending=False), checkpointing=True).files_rewindable


def test_a_checkpoint_not_yet_written_counts_only_while_the_process_that_ran_the_prompt_lives() -> None:
    pending = _point(has_checkpoint=True, pending=True)
    assert rewind_point(pending, checkpointing=True, holds_pending=True).files_rewindable
    assert not rewind_point(pending, checkpointing=True, holds_pending=False).files_rewindable
