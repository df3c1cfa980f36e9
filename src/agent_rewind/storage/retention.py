"""Retention of what files rewinds need (`--retain-file-points`, `--retain-file-days`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Retention:
    """The newest `points` of each session keep what a files rewind to them needs (0: all), and
    so does every point younger than `days` days (0: no age bound)."""

    points: int = 0
    days: float = 0.0

    @property
    def on(self) -> bool:
        return self.points > 0 or self.days > 0
