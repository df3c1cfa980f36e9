"""Where the Claude Code CLI writes a session's transcript (SDK-FACTS.md)."""

from __future__ import annotations

from pathlib import Path


def transcript_path(config_dir: Path, cwd: str, session_id: str) -> Path:
    """`$CLAUDE_CONFIG_DIR/projects/<cwd, every non-alphanumeric ASCII char as ->/<id>.jsonl`.

    The CLI shortens very long project paths its own way, so a file already written anywhere
    under projects/ wins over the computed name.
    """
    sanitized = "".join(c if c.isascii() and c.isalnum() else "-" for c in cwd)
    path = config_dir / "projects" / sanitized / f"{session_id}.jsonl"
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
