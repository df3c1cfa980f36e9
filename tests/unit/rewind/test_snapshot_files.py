"""rewind/snapshot_files.py: a rewind's and an undo's files through the session's snapshots. The
workspace after a restore is recorded one way for both: from the trees, and when that cannot be
computed, by a new snapshot (a scan); either way the restore's after snapshot is complete, the end
of the service's interval, so the next rewind sees no outside edit.

Real turns of the worker with a fake CLI whose agent writes files, the server's real workspace
snapshots and a real SQLite ledger (tests/unit/rewind/fakes.py).
"""

from __future__ import annotations

import pytest

from agent_rewind.rewind.outcome import Mode
from agent_rewind.rewind.snapshot_files import capture_paths
from agent_rewind.snapshots import SnapshotStore
from agent_rewind.snapshots.taking import REWIND_AFTER, REWIND_BEFORE
from tests.unit.rewind.fakes import MakeSetup, Setup, within

TURNS = (
    ("zero", {"a.txt": "v0\n"}),
    ("one", {"a.txt": "v1\n", "b.txt": "bee\n"}),
    ("two", {"c.txt": "sea\n"}),
)


async def _rewound_and_undone(s: Setup) -> tuple[str, str]:
    ids = [await s.prompt(text, edits) for text, edits in TURNS]
    rewound = await within(s.engine.rewind(s.worker, s.request(ids[1], Mode.FILES)))
    assert (s.read("a.txt"), s.read("b.txt"), s.read("c.txt")) == ("v0\n", None, None)
    await within(s.engine.undo(s.worker, s.undo_request(rewound.rewind_id)))
    assert (s.read("a.txt"), s.read("b.txt"), s.read("c.txt")) == ("v1\n", "bee\n", "sea\n")
    [undo] = [r for r in await s.ledger.rewinds(s.sid) if r.kind == "undo"]
    return rewound.rewind_id, undo.rewind_id


@pytest.mark.parametrize("overlay", ["computed", "failing"])
async def test_a_rewind_and_its_undo_record_the_workspace_before_and_after_them(
    make_setup: MakeSetup, monkeypatch: pytest.MonkeyPatch, overlay: str
) -> None:
    if overlay == "failing":

        def fail(self: SnapshotStore, *args: object) -> str:
            raise OSError("the object store is unreadable")

        monkeypatch.setattr(SnapshotStore, "overlay", fail)
    s = await make_setup(snapshots=True, workspace_snapshots=True)
    rewind_id, undo_id = await _rewound_and_undone(s)
    records = await s.ledger.snapshots(s.sid)
    assert [(r.kind, r.ref) for r in records[-4:]] == [
        (REWIND_BEFORE, rewind_id),
        (REWIND_AFTER, rewind_id),
        (REWIND_BEFORE, undo_id),
        (REWIND_AFTER, undo_id),
    ]
    assert all(r.complete and r.tree for r in records[-4:])
    # Each after snapshot is the workspace as its restore left it: the undo's as the rewind found it.
    assert records[-2].tree == records[-3].tree and records[-1].tree == records[-4].tree
    # Each was the service's doing: a rewind to the first turn finds no outside edit.
    ids = [r.ref for r in records if r.kind == "turn_start"]
    again = await within(s.engine.dry_run(s.worker, s.request(ids[0], Mode.FILES)))
    assert again.files.source == "snapshot" and again.files.conflicts == ()


def test_the_paths_kept_for_an_undo_are_the_workspaces_own() -> None:
    assert capture_paths("/ws", ("/ws/b.txt", "a.txt", "/ws/d/e.txt", "/ws/a.txt")) == [
        "a.txt",
        "b.txt",
        "d/e.txt",
    ]
    assert capture_paths("/ws", ("/ws/a.txt", "/elsewhere/b.txt")) is None, "one outside: none kept"
