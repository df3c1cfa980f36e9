"""Where session workspaces may be: below a workspace root, never a root itself, never over
another session's, and (with authentication on) below the caller's own directory.

A workspace's path is resolved and checked when a session is created (`resolve`), and again
whenever a stored session is loaded (`stored_workspace_allowed`): the ledger is not trusted to
still hold what was checked (a restored backup, an edited row), so a session whose stored
workspace now lies outside every root is not served at all.

What one principal may learn of another's workspaces: nothing. With authentication on, each
principal's workspaces lie under a directory of its own in each root (`<root>/<principal>/`):
a relative `cwd` resolves there, an absolute one must lie there (admins may use any path under a
root). Two principals naming the same `cwd` get two workspaces, so WORKSPACE_IN_USE never tells
one of the other's.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from pathlib import Path

from agent_rewind.errors import InvalidArgument, WorkspaceInUse, WorkspaceOutsideRoot
from agent_rewind.transcript.paths import PROJECT_NAME_MAX, project_name

_MAX_PATH = 4096
_MAX_NAME = 255  # bytes of one path component (NAME_MAX)
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def principal_dir(name: str) -> str:
    """The directory a principal's workspaces lie under in each root: its name when that is a
    plain file name, else a digest of it (a name with `/`, `..` or anything else a path would
    read otherwise)."""
    if _PLAIN_NAME.fullmatch(name) and name not in (".", ".."):
        return name
    return "p-" + hashlib.sha256(name.encode()).hexdigest()[:24]


def resolve(
    cwd: str,
    session_id: str,
    *,
    roots: tuple[Path, ...],
    taken: Iterable[Path],
    home: str | None = None,
) -> Path:
    """The absolute workspace for `cwd`: inside a root (inside `home` there, when given), not a
    root, and apart from every workspace in `taken`. Empty `cwd`: a fresh one named after the
    session. Nothing is created."""
    if "\x00" in cwd:
        raise InvalidArgument("cwd", "must not contain NUL characters")
    if len(cwd.encode(errors="surrogateescape")) > _MAX_PATH:
        raise InvalidArgument("cwd", f"must be at most {_MAX_PATH} bytes")
    long = [part for part in Path(cwd).parts if len(part.encode(errors="surrogateescape")) > _MAX_NAME]
    if long:
        raise InvalidArgument("cwd", f"has a component longer than {_MAX_NAME} bytes")
    bases = tuple(root / home for root in roots) if home is not None else roots
    # resolve() follows symlinks and `..`, so neither can lead out of a root.
    try:
        if not cwd:
            path = bases[0] / session_id
        else:
            # `~user` of a user the server's host does not know cannot be expanded.
            given = Path(cwd).expanduser()
            path = given if given.is_absolute() else bases[0] / given
        resolved = path.resolve()
        exists, is_dir = resolved.exists(), resolved.is_dir()
    except (OSError, RuntimeError, ValueError) as err:
        raise InvalidArgument("cwd", f"cannot be resolved: {err}") from None
    if not any(resolved.is_relative_to(r) for r in roots):
        raise WorkspaceOutsideRoot(cwd or str(path), [str(r) for r in roots])
    if home is not None and not any(resolved.is_relative_to(b) for b in bases):
        raise WorkspaceOutsideRoot(
            cwd or str(path),
            [str(b) for b in bases],
            f"cwd {cwd!r} resolves outside the caller's own workspace directories {[str(b) for b in bases]}",
        )
    if len(project_name(str(resolved))) > PROJECT_NAME_MAX:
        raise InvalidArgument(
            "cwd",
            f"resolves to a path of {len(str(resolved))} characters; a workspace's path may have at most "
            f"{PROJECT_NAME_MAX} (the CLI names the session's transcript directory after it)",
        )
    if resolved in roots or resolved in bases:
        raise WorkspaceInUse(str(resolved), "is a workspace root; a session's workspace lies below one")
    check_apart(resolved, taken)
    if exists and not is_dir:
        raise InvalidArgument("cwd", f"{resolved} exists and is not a directory")
    return resolved


def check_apart(resolved: Path, taken: Iterable[Path]) -> None:
    """WORKSPACE_IN_USE if `resolved` is, contains or lies inside one of `taken`."""
    for theirs in taken:
        if resolved == theirs:
            raise WorkspaceInUse(str(resolved), "is another session's workspace")
        if theirs.is_relative_to(resolved):
            raise WorkspaceInUse(str(resolved), "contains another session's workspace")
        if resolved.is_relative_to(theirs):
            raise WorkspaceInUse(str(resolved), "lies inside another session's workspace")


def make(path: Path) -> None:
    """Creates the workspace directory (and its parents); a name the file system refuses is
    INVALID_ARGUMENT, not an unexpected error."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InvalidArgument("cwd", f"cannot be created: {err.strerror}") from None


def require_fresh(path: Path) -> None:
    """A fork's workspace must be new or an empty directory: the fork writes into it, and what is
    there (a link, a hard link to a file elsewhere) would lead its writes elsewhere."""
    try:
        if path.is_symlink():
            raise InvalidArgument("cwd", "a fork's workspace must be a new or empty directory, not a link")
        if not path.exists():
            return
        with os.scandir(path) as entries:
            if next(entries, None) is not None:
                raise InvalidArgument(
                    "cwd", f"a fork's workspace must be a new or empty directory; {path} holds files"
                )
    except OSError as err:
        raise InvalidArgument("cwd", f"cannot be used: {err.strerror}") from None


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
