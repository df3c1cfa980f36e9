"""What one session of the load must show: the soak's model (scripts/soak.py), grown by what the
load does beyond the soak: shell writes, a files rewind whose source the service names, undo,
fork and delete, and the last message.

The soak's `Model` keeps the visible prompts in order, the content of every file the turns wrote,
and every change to the files in order (turns and rewinds), so that a files rewind to a point can
be played on the model. The soak asserts only what a rewind from the CLI's checkpoints promises
(a file something other than a visible turn changed since the point is unknown until written
again); a rewind from the workspace snapshots (`FILES_SOURCE_SNAPSHOT`, docs/rewind.md) promises
more, and the load asserts that: every path changed from the point on, by whatever, goes back to
its content when the point was sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from scripts.soak import BOTH, CONVERSATION, FILES, UNKNOWN, Model, Point

__all__ = ["BOTH", "CONVERSATION", "FILES", "UNKNOWN", "Point", "SessionModel"]


@dataclass
class Undo:
    """What `UndoRewind` of the session's latest rewind puts back."""

    rewind_id: str
    points: list[Point]
    files: dict[str, str | None]
    last_message_id: str
    paths: set[str]  # the paths the rewind changed


@dataclass
class SessionModel(Model):
    principal: str = ""
    last_message_id: str = ""  # the newest visible message, as the service last answered it
    # Paths only shell commands write: the CLI's checkpoints do not track them.
    shell_paths: set[str] = field(default_factory=set)
    # Points a fork copied from its source: the fork holds no file history from before it began.
    inherited: set[int] = field(default_factory=set)  # ids of Point objects
    undo: Undo | None = None  # the latest rewind, while it can be undone
    deleted: bool = False
    forked_from: str = ""

    def turn(self, prompt_id: str, text: str, writes: dict[str, str], last_message_id: str) -> None:
        """A turn ran to its result, writing `writes` (path -> content without the final newline)."""
        self.prompt(prompt_id, text, writes)
        self.last_message_id = last_message_id
        self.undo = None  # a turn after a rewind ends its undo

    def files_targets(self) -> list[int]:
        """Indexes of the points a files rewind may target: every one the session's own turns
        made (a fork's copied points have no file history here)."""
        return [i for i, p in enumerate(self.points) if id(p) not in self.inherited]

    def rewound(self, index: int, mode: int, *, exact: bool, rewind_id: str, last_message_id: str) -> None:
        """A rewind to `points[index]` applied. `exact`: its files came from the workspace
        snapshots, which restore every path changed since; else from the CLI's checkpoints (the
        soak's rule, and shell writes unknown)."""
        point = self.points[index]
        saved = Undo(rewind_id, list(self.points), dict(self.files), self.last_message_id, set())
        if mode in (FILES, BOTH):
            visible = {id(p) for p in self.points[index:]}
            by_visible: set[str] = set()
            by_others: set[str] = set()
            for turn, paths in self.changes[point.sent :]:
                (by_visible if turn is not None and id(turn) in visible else by_others).update(paths)
            changed = by_visible | by_others
            for path in changed:
                before = point.files_before.get(path)
                if exact:
                    self.files[path] = before
                elif path in by_others or path in self.shell_paths or before == UNKNOWN:
                    self.files[path] = UNKNOWN
                else:
                    self.files[path] = before
            self.changes.append((None, changed))
            saved.paths = changed
        if mode in (CONVERSATION, BOTH):
            del self.points[index:]
        self.last_message_id = last_message_id
        self.undo = saved

    def undone(self, last_message_id: str) -> None:
        """`UndoRewind` of the latest rewind applied: the files and conversation as just before it."""
        assert self.undo is not None
        undo, self.undo = self.undo, None
        self.points = undo.points
        for path in undo.paths:
            self.files[path] = undo.files.get(path)
        self.changes.append((None, set(undo.paths)))
        self.last_message_id = last_message_id

    def uncertain(self, paths: set[str]) -> None:
        """A call that may or may not have applied failed: these paths are unknown until written."""
        for path in paths:
            self.files[path] = UNKNOWN
        self.changes.append((None, set(paths)))
        self.undo = None

    def fork(self, session_id: str, cwd: str, last_message_id: str) -> SessionModel:
        """The model of a fork of the whole session as it is now (ForkSession, empty message_id):
        the same visible prompts, under the same ids, and the workspace's files."""
        points = [Point(p.prompt_id, p.text, {}, (), 0) for p in self.points]
        return SessionModel(
            session_id=session_id,
            cwd=Path(cwd),
            points=points,
            files=dict(self.files),
            turns=self.turns,  # new files get names the source's files never had
            principal=self.principal,
            last_message_id=last_message_id,
            shell_paths=set(self.shell_paths),
            inherited={id(p) for p in points},
            forked_from=self.session_id,
        )
