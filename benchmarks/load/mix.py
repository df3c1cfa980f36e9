"""The mix of calls each session's loop makes (issue 41), and the prompts it sends.

Each step of a loop draws one operation by weight. A prompt is a script for the scripted model
(docs/scripted-model.md) of one to three tool calls: a new file written (one call), a shared file
read and overwritten (two), a file read and edited (two), a shell command writing a file (one).
What each call writes is unique to its turn, so the session's model knows every file's content.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from benchmarks.load.model import BOTH, CONVERSATION, FILES, UNKNOWN, SessionModel

# (operation, weight in percent): the mix. A Rewind is of each mode in turn at random.
MIX: tuple[tuple[str, int], ...] = (
    ("Prompt", 40),
    ("ListRewindPoints", 25),
    ("DryRun", 10),
    ("Rewind", 10),
    ("UndoRewind", 5),
    ("GetSession", 5),
    ("ForkOrDelete", 5),
)
MODES = (FILES, CONVERSATION, BOTH)
MODE_NAMES = {FILES: "files", CONVERSATION: "conversation", BOTH: "both"}
SHARED = ("a.txt", "b.txt")  # files turns read and overwrite
SHELL = "sh.txt"  # the file the shell commands write
PAGE = 50  # ListRewindPoints page size, as a client's first page


def choose(rng: random.Random) -> str:
    return rng.choices([op for op, _ in MIX], weights=[w for _, w in MIX])[0]


@dataclass(frozen=True)
class Script:
    text: str
    writes: dict[str, str]  # path -> content, without the final newline the model adds
    shell: frozenset[str]  # the paths a shell command wrote
    tool_calls: int


def script(model: SessionModel, rng: random.Random) -> Script:
    """A prompt of one to three tool calls whose effect on the files the model knows."""
    model.turns += 1
    n = model.turns
    budget = rng.choice((1, 2, 3))
    calls = 0
    lines: list[str] = []
    writes: dict[str, str] = {}
    shell: set[str] = set()
    while calls < budget:
        kinds = ["new", "shell"] + (["overwrite", "edit"] if budget - calls >= 2 else [])
        kind = rng.choice(kinds)
        current = {**model.files, **writes}
        editable = [
            p
            for p, content in current.items()
            if content not in (None, UNKNOWN) and p != SHELL and p not in model.shell_paths
        ]
        if kind == "edit" and not editable:
            kind = "overwrite"
        if kind == "new":
            path = f"t{n}-{len(lines)}.txt"
            writes[path] = f"n{n}"
            lines.append(f"write {path} n{n}")
            calls += 1
        elif kind == "shell":
            writes[SHELL] = f"x{n}"
            shell.add(SHELL)
            lines.append(f"bash echo x{n} > {SHELL}")
            calls += 1
        elif kind == "overwrite":
            # Claude Code writes over a file only once the conversation has read it.
            path = rng.choice(SHARED)
            writes[path] = f"v{n}-{len(lines)}"
            lines.append(f"read {path}\nwrite {path} {writes[path]}")
            calls += 2
        else:
            path = rng.choice(sorted(editable))
            old = current[path]
            assert old is not None
            writes[path] = f"e{n}-{len(lines)}"
            lines.append(f"edit {path} {old} => {writes[path]}")
            calls += 2
    return Script("\n".join(lines), writes, frozenset(shell), calls)


def target(model: SessionModel, mode: int, rng: random.Random) -> int | None:
    """A point to rewind to in `mode` (None: the session has none yet), most often a recent one,
    as a user takes back the last turn or two: k turns back with chance 2^-k."""
    if mode == FILES:
        candidates = model.files_targets()
    elif mode == CONVERSATION:
        candidates = list(range(1, len(model.points)))  # the first prompt has nothing to resume at
    else:
        candidates = [i for i in model.files_targets() if i >= 1]
    if not candidates:
        return None
    back = 0
    while back < len(candidates) - 1 and rng.random() < 0.5:
        back += 1
    return candidates[len(candidates) - 1 - back]
