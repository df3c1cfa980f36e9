"""Edges of reading a live transcript: lazily written snapshots, paths the file system refuses."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from agent_rewind.testing.fake_agent import append, prompt_entry, reply_entry
from agent_rewind.transcript import TranscriptIndex


def _snapshot(message_id: str) -> dict[str, Any]:
    return {
        "type": "file-history-snapshot",
        "messageId": message_id,
        "snapshot": {},
        "isSnapshotUpdate": False,
    }


def test_the_newest_prompt_counts_as_checkpointed_before_its_snapshot_is_written(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    p0, r0, p1, r1 = (str(uuid.uuid4()) for _ in range(4))
    append(
        path,
        prompt_entry(p0, None, "one"),
        _snapshot(p0),
        reply_entry(r0, p0, "ok"),
        prompt_entry(p1, r0, "two"),
        reply_entry(r1, p1, "ok"),
    )
    index = TranscriptIndex(path)
    index.refresh()
    view = index.view()
    assert [p.has_checkpoint for p in view.points] == [True, True]

    append(path, _snapshot(p1))
    index.refresh()
    assert [p.has_checkpoint for p in index.view().points] == [True, True]
    # A view handed out before the snapshot arrived agrees too.
    assert [p.has_checkpoint for p in view.points] == [True, True]


def test_an_older_prompt_without_a_snapshot_has_no_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    p0, r0, p1, r1 = (str(uuid.uuid4()) for _ in range(4))
    append(
        path,
        prompt_entry(p0, None, "one"),
        reply_entry(r0, p0, "ok"),
        prompt_entry(p1, r0, "two"),
        _snapshot(p1),
        reply_entry(r1, p1, "ok"),
    )
    index = TranscriptIndex(path)
    index.refresh()
    assert [p.has_checkpoint for p in index.view().points] == [False, True]


def test_a_path_too_long_for_the_file_system_reads_as_an_empty_transcript(tmp_path: Path) -> None:
    index = TranscriptIndex(tmp_path / ("x" * 300) / "s.jsonl")
    index.refresh()
    assert index.size == 0 and len(index.view().points) == 0
