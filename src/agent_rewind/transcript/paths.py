"""Where the Claude Code CLI writes a session's transcript (SDK-FACTS.md)."""

from __future__ import annotations

from pathlib import Path

# The longest project directory name the CLI uses as it is; a longer one it cuts and suffixes
# with a hash of its own (not reproduced here), so the service refuses workspaces whose name
# would be longer (workspace_paths.py): a session's transcript directory is then known
# before its CLI starts, which its confinement needs (sandbox/cli.py).
PROJECT_NAME_MAX = 200


def project_name(cwd: str) -> str:
    """The CLI's name for a workspace's project directory: every character but an ASCII letter
    or digit as `-`, counted as JavaScript counts it (a character beyond U+FFFF is two)."""
    return "".join(c if c.isascii() and c.isalnum() else "--" if ord(c) > 0xFFFF else "-" for c in cwd)


def transcript_path(config_dir: Path, cwd: str, session_id: str) -> Path:
    """`$CLAUDE_CONFIG_DIR/projects/<project_name(cwd)>/<id>.jsonl`.

    The CLI shortens very long project paths its own way, so a file already written anywhere
    under projects/ wins over the computed name.
    """
    path = config_dir / "projects" / project_name(cwd) / f"{session_id}.jsonl"
    if exists(path):
        return path
    found = sorted((config_dir / "projects").glob(f"*/{session_id}.jsonl"))
    return found[0] if found else path


def exists(path: Path) -> bool:
    """Like Path.exists, but a name too long for the file system simply does not exist."""
    try:
        return path.exists()
    except OSError:
        return False


def project_dir(config_dir: Path, cwd: str, session_id: str) -> Path:
    """The directory the CLI keeps the session's transcript in: named after the workspace when
    the CLI uses that name as it is (no look-up), else wherever the transcript is found."""
    name = project_name(cwd)
    if len(name) <= PROJECT_NAME_MAX:
        return config_dir / "projects" / name
    return transcript_path(config_dir, cwd, session_id).parent
