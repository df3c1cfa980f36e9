"""Making paths of a workspace what a snapshot tree holds, all or nothing.

`SnapshotStore.restore` checks the paths and reads the two trees; this module writes the files and,
when a write fails, puts back every path it touched as the rollback tree holds it.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent_rewind.snapshots.errors import RestoreError, SnapshotError
from agent_rewind.snapshots.files import MODE_EXECUTABLE, MODE_FILE, MODE_SYMLINK, Entry, Workspace
from agent_rewind.snapshots.objects import Objects

_RESTORABLE = (MODE_FILE, MODE_EXECUTABLE, MODE_SYMLINK)


def restore_paths(
    workspace: Workspace,
    blobs: Objects,
    targets: Sequence[str],
    *,
    want: dict[str, Entry],
    before: dict[str, Entry],
) -> None:
    """Makes each of `targets` hold what `want` holds there (nothing, when absent). Refuses before
    anything is touched when a path holds neither that nor what `before` (the rollback) holds; on
    a failure puts every touched path back as `before` holds it. RestoreError says which."""
    now = {p: workspace.entry(p) for p in targets}
    differs = [p for p in targets if now[p] not in (before.get(p), want.get(p))]
    if differs:
        raise RestoreError(
            f"{len(differs)} path(s) hold neither the rollback snapshot's content nor the "
            f"restored one; nothing was changed: {_listing(differs)}",
            path=differs[0],
            rolled_back=True,
        )
    # Paths an interrupted restore already wrote are rolled back with the rest.
    touched = [p for p in targets if now[p] == want.get(p) != before.get(p)]
    todo = [p for p in targets if now[p] == before.get(p) != want.get(p)]
    try:
        _apply(workspace, blobs, want, todo, touched)
    except Exception as err:
        path = touched[-1] if touched else ""
        failed = _roll_back(workspace, blobs, before, touched)
        if failed:
            raise RestoreError(
                f"restoring {path!r} failed ({err}); the rollback failed too for {_listing(failed)}",
                path=path,
                rolled_back=False,
            ) from err
        raise RestoreError(
            f"restoring {path!r} failed ({err}); the {len(touched)} path(s) touched were put back",
            path=path,
            rolled_back=True,
        ) from err
    finally:
        workspace.sync()


def _apply(
    workspace: Workspace, blobs: Objects, entries: dict[str, Entry], paths: Sequence[str], touched: list[str]
) -> None:
    """Removals first, deepest first (a directory may be in the way of a file), then writes."""
    for path in sorted((p for p in paths if p not in entries), key=lambda p: (-p.count("/"), p)):
        touched.append(path)
        workspace.remove(path)
    for path in sorted(p for p in paths if p in entries):
        touched.append(path)
        entry = entries[path]
        if entry.mode not in _RESTORABLE:
            raise SnapshotError(f"{path!r} has mode {entry.mode}, which a restore cannot write")
        workspace.write(path, entry.mode, [blobs.read(entry.oid, b"blob")])


def _roll_back(
    workspace: Workspace, blobs: Objects, before: dict[str, Entry], touched: list[str]
) -> list[str]:
    """Puts every touched path back as `before` holds it, going on past failures; returns the
    paths it could not."""
    failed: list[str] = []
    for path in sorted(touched, key=lambda p: (p in before, -p.count("/") if p not in before else 0, p)):
        try:
            if path in before:
                workspace.write(path, before[path].mode, [blobs.read(before[path].oid, b"blob")])
            else:
                workspace.remove(path)
        except Exception:
            failed.append(path)
    return failed


def _listing(paths: Sequence[str], shown: int = 5) -> str:
    return ", ".join(paths[:shown]) + (f" and {len(paths) - shown} more" if len(paths) > shown else "")
