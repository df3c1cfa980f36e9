"""Edges of reading a live transcript: lazily written snapshots, paths the file system refuses."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from agent_rewind.transcript import TranscriptIndex


def _prompt(uid: str, parent: str | None, text: str) -> dict[str, Any]:
    return {
        "type": "user",
        "uuid": uid,
        "parentUuid": parent,
        "isSidechain": False,
        "promptSource": "sdk",
        "timestamp": "2026-11-29T10:00:00.000Z",
        "message": {"role": "user", "content": text},
    }


def _reply(uid: str, parent: str) -> dict[str, Any]:
    return {
        "type": "assistant",
        "uuid": uid,
        "parentUuid": parent,
        "isSidechain": False,
        "timestamp": "2026-11-29T10:00:01.000Z",
        "message": {"id": f"msg_{uid[:8]}", "role": "assistant", "content": [{"type": "text", "text": "ok"}]},
    }


def _snapshot(message_id: str) -> dict[str, Any]:
    return {
        "type": "file-history-snapshot",
        "messageId": message_id,
        "snapshot": {},
        "isSnapshotUpdate": False,
    }


def _append(path: Path, *entries: dict[str, Any]) -> None:
    with path.open("a") as f:
        for entry in entries:
            f.write(json.dumps(entry) + "\n")


def test_the_newest_prompt_counts_as_checkpointed_before_its_snapshot_is_written(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    p0, r0, p1, r1 = (str(uuid.uuid4()) for _ in range(4))
    _append(
        path, _prompt(p0, None, "one"), _snapshot(p0), _reply(r0, p0), _prompt(p1, r0, "two"), _reply(r1, p1)
    )
    index = TranscriptIndex(path)
    index.refresh()
    view = index.view()
    assert [p.has_checkpoint for p in view.points] == [True, True]

    _append(path, _snapshot(p1))
    index.refresh()
    assert [p.has_checkpoint for p in index.view().points] == [True, True]
    # A view handed out before the snapshot arrived agrees too.
    assert [p.has_checkpoint for p in view.points] == [True, True]


def test_an_older_prompt_without_a_snapshot_has_no_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    p0, r0, p1, r1 = (str(uuid.uuid4()) for _ in range(4))
    _append(
        path, _prompt(p0, None, "one"), _reply(r0, p0), _prompt(p1, r0, "two"), _snapshot(p1), _reply(r1, p1)
    )
    index = TranscriptIndex(path)
    index.refresh()
    assert [p.has_checkpoint for p in index.view().points] == [False, True]


def test_a_path_too_long_for_the_file_system_reads_as_an_empty_transcript(tmp_path: Path) -> None:
    index = TranscriptIndex(tmp_path / ("x" * 300) / "s.jsonl")
    index.refresh()
    assert index.size == 0 and len(index.view().points) == 0
