"""Transcripts recorded from the real Claude Code CLI (scripts/record_transcripts.py), laid out as
the CLI lays them out, in a temporary directory."""

from __future__ import annotations

import gzip
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent_rewind.transcript import TranscriptIndex

DATA = Path(__file__).parent / "data"
FIXTURES = sorted(p.name for p in DATA.iterdir() if (p / "expected.json").exists())


@dataclass
class Recorded:
    """One recorded session: its transcript (maybe cut short), the truth, and an index over it."""

    name: str
    expected: dict[str, Any]
    path: Path
    index: TranscriptIndex

    @property
    def turns(self) -> list[dict[str, Any]]:
        turns: list[dict[str, Any]] = self.expected["turns"]
        return turns

    def turn(self, prompt: str) -> dict[str, Any]:
        return next(t for t in self.turns if t["prompt"] == prompt)

    def full_transcript(self) -> bytes:
        return gzip.decompress((DATA / self.name / self.expected["transcript"]).read_bytes())


def lay_out(name: str, target: Path, size: int | None = None) -> Recorded:
    """Copy a fixture to `target`, the main transcript cut to its first `size` bytes if given."""
    source = DATA / name
    expected = json.loads((source / "expected.json").read_text())
    for path in source.rglob("*"):
        if path.is_dir() or path.name == "expected.json":
            continue
        dest = target / path.relative_to(source)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".gz":
            dest.with_suffix("").write_bytes(gzip.decompress(path.read_bytes()))
        else:
            shutil.copyfile(path, dest)
    transcript = target / f"{expected['session_id']}.jsonl"
    if size is not None:
        transcript.write_bytes(transcript.read_bytes()[:size])
    index = TranscriptIndex(transcript)
    index.refresh()
    return Recorded(name, expected, transcript, index)


@pytest.fixture
def recorded(tmp_path: Path) -> Callable[..., Recorded]:
    """`recorded(name, size=None)`: a fixture session laid out in its own temporary directory."""
    count = 0

    def make(name: str, size: int | None = None) -> Recorded:
        nonlocal count
        count += 1
        return lay_out(name, tmp_path / f"{name}-{count}", size)

    return make
