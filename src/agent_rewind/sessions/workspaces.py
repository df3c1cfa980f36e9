"""Where session workspaces may be: below a workspace root, never a root itself.

A workspace's path is checked when a session is created (`SessionRegistry.resolve_workspace`)
and again whenever a stored session is loaded: the ledger is not trusted to still hold what was
checked (a restored backup, an edited row), so a session whose stored workspace now lies outside
every root is not served at all.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def stored_workspace_allowed(cwd: str, roots: Iterable[Path]) -> bool:
    """Whether a stored workspace path is absolute, normal (no `.` or `..`, no doubled slash)
    and strictly below one of `roots` (which are resolved). Lexical: no link is followed."""
    if not cwd or "\x00" in cwd or not os.path.isabs(cwd) or os.path.normpath(cwd) != cwd:
        return False
    path = Path(cwd)
    return any(path != root and path.is_relative_to(root) for root in roots)


def intact(cwd: str) -> bool:
    """Whether the workspace is still a directory at its own path, with no symbolic link on the
    way to it (an agent that replaced it, or a parent, with a link would have a files rewind
    write wherever that link leads)."""
    try:
        return os.path.realpath(cwd) == cwd and Path(cwd).is_dir()
    except (OSError, ValueError):
        return False
