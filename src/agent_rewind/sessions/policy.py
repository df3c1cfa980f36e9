"""Which tool calls a session's agent may make: the service's tool policy, in domain terms.

Nobody sits at a terminal to approve tools, so the session's options decide, and the workspace
bounds every file tool:

- a file tool (Read, Write, Edit, MultiEdit, NotebookEdit, Glob, Grep, LS) may touch paths that
  resolve inside the workspace (after `..`, `~` and every symlink) and nothing else, whether or not
  `allowed_tools` names it: the adapter asks this policy both when the CLI asks permission and in
  a PreToolUse hook, which the CLI runs for allowed tools too;
- any other tool runs only when the session's `allowed_tools` names it (the CLI lets those
  through without asking); everything else is refused.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_rewind.sessions.tools import FILE_TOOLS

__all__ = ["FILE_TOOLS", "Decision", "ToolPolicy"]

_PATH_KEYS = ("file_path", "notebook_path", "path")
_GLOB_CHARS = frozenset("*?[{")


@dataclass(frozen=True)
class Decision:
    allow: bool
    message: str = ""


ALLOW = Decision(True)


_BRACES = re.compile(r"\{([^{}]*)\}")


def _glob_stays_inside(pattern: str) -> bool:
    """No `..` (`**/..` climbs out whatever the pattern starts from), and no brace alternative
    that is absolute or starts at home (`{/etc,src}/*`)."""
    if ".." in re.split(r"[/{},]", pattern):
        return False
    for group in _BRACES.findall(pattern):
        if any(alt.strip().startswith(("/", "~")) for alt in group.split(",")):
            return False
    return pattern.count("{") == len(_BRACES.findall(pattern))  # nested braces: refuse


class ToolPolicy:
    def __init__(self, workspace: Path, allowed_tools: Iterable[str]) -> None:
        self.workspace = workspace.resolve()
        self.allowed = frozenset(allowed_tools)

    def permission(self, tool_name: str, tool_input: Mapping[str, Any]) -> Decision:
        """Asked when the CLI wants permission for a tool call (tools not in allowed_tools)."""
        if tool_name in FILE_TOOLS:
            return self.confinement(tool_name, tool_input)
        if tool_name in self.allowed:
            return ALLOW
        return Decision(
            False, f"{tool_name} is not in this session's allowed_tools; create the session with it to use it"
        )

    def confinement(self, tool_name: str, tool_input: Mapping[str, Any]) -> Decision:
        """Asked before every tool call (a PreToolUse hook): file tools stay in the workspace."""
        if tool_name not in FILE_TOOLS:
            return ALLOW
        pattern = tool_input.get("pattern")
        if tool_name == "Glob" and isinstance(pattern, str) and not _glob_stays_inside(pattern):
            return Decision(
                False, "Glob patterns with '..', or an absolute or home brace alternative, are not allowed"
            )
        for target in self._targets(tool_name, tool_input):
            if not self._inside(target):
                return Decision(False, f"{tool_name} outside the session's workspace is not allowed")
        return ALLOW

    def _targets(self, tool_name: str, tool_input: Mapping[str, Any]) -> list[str]:
        paths = [str(tool_input[k]) for k in _PATH_KEYS if isinstance(tool_input.get(k), str)]
        pattern = tool_input.get("pattern")
        if tool_name == "Glob" and isinstance(pattern, str):
            # The pattern's fixed leading part is a directory the glob starts from.
            fixed = []
            for part in pattern.split("/"):
                if _GLOB_CHARS & set(part):
                    break
                fixed.append(part)
            start = "/".join(fixed)
            if start or pattern.startswith("/"):
                paths.append(start or "/")
        return paths or ["."]

    def _inside(self, path: str) -> bool:
        if "\x00" in path:
            return False
        expanded = os.path.expanduser(path) if path.startswith("~") else path
        candidate = Path(expanded) if os.path.isabs(expanded) else self.workspace / expanded
        try:
            resolved = candidate.resolve()
        except (OSError, RuntimeError):  # a symlink loop, a name too long
            return False
        return resolved == self.workspace or resolved.is_relative_to(self.workspace)
