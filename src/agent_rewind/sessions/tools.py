"""Every tool the service knows, and the tools the CLI may offer a session: nothing else exists.

The CLI grows tools every week, and some run without asking `can_use_tool` (peer listing and
messaging, scheduled wakeups, subagents, skills). So the service never lets the CLI pick its
tool set: it names the base set itself (the SDK's `tools` option, the CLI's `--tools`), and a
tool outside it is "No such tool available" to the model, in subagents too. The base set is the
file tools (always; the policy confines them to the workspace) plus the tools of this catalogue
that the session's `allowed_tools` names. A name the catalogue does not know is passed to the
CLI as given (API.md) but never put in the base set, so a tool a newer CLI adds stays absent
until this catalogue knows it. The adapter checks what the CLI reports it offers against the
base set at every start and refuses to run a CLI that offers more.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Any


class Kind(Enum):
    # Read and edit files: always offered; the policy confines every call to the workspace.
    FILE = "file"
    # Run commands: inside the command sandbox (sandbox/), only when named.
    COMMAND = "command"
    # Start subagents, which have the session's tools and no more: only when named.
    AGENT = "agent"
    # Reach the network from the CLI itself: only when named; their calls are side effects.
    NETWORK = "network"
    # Talk to the model or the caller, touch nothing outside: only when named.
    INERT = "inert"
    # Never offered, named or not: they reach other sessions (peer listing and messaging),
    # start turns the service did not ask for (wakeups, cron), or move the agent out of its
    # workspace (worktrees). OPTION_NOT_ALLOWED at CreateSession.
    REFUSED = "refused"


# What Claude Code CLI 2.1.327 can offer (SDK-FACTS.md; 2.1.332 offers no other), and a few older
# names.
CATALOGUE: Mapping[str, Kind] = {
    "Read": Kind.FILE,
    "Write": Kind.FILE,
    "Edit": Kind.FILE,
    "MultiEdit": Kind.FILE,
    "NotebookEdit": Kind.FILE,
    "Glob": Kind.FILE,
    "Grep": Kind.FILE,
    "LS": Kind.FILE,
    "Bash": Kind.COMMAND,
    "Monitor": Kind.COMMAND,
    "BashOutput": Kind.COMMAND,
    "KillShell": Kind.COMMAND,
    "TaskStop": Kind.COMMAND,
    "Agent": Kind.AGENT,
    "Task": Kind.AGENT,
    "WebFetch": Kind.NETWORK,
    "WebSearch": Kind.NETWORK,
    "AskUserQuestion": Kind.INERT,
    "TodoWrite": Kind.INERT,
    "EnterPlanMode": Kind.INERT,
    "ExitPlanMode": Kind.INERT,
    "ToolSearch": Kind.INERT,
    "Skill": Kind.INERT,
    "ReportFindings": Kind.INERT,
    "Workflow": Kind.INERT,
    "ListAgents": Kind.REFUSED,
    "SendMessage": Kind.REFUSED,
    "ScheduleWakeup": Kind.REFUSED,
    "CronCreate": Kind.REFUSED,
    "CronDelete": Kind.REFUSED,
    "CronList": Kind.REFUSED,
    "EnterWorktree": Kind.REFUSED,
    "ExitWorktree": Kind.REFUSED,
}

# In the tool list the CLI sends the model whatever the base set, and never callable ("No such
# tool available"): the CLI's marker that keeps deferred tool loading on.
INERT_PLACEHOLDERS = frozenset({"DeferredToolPlaceholder"})

# Names the CLI reports one tool under: Agent is Task in its init message.
_ALIASES: Mapping[str, frozenset[str]] = {"Agent": frozenset({"Task"}), "Task": frozenset({"Agent"})}

FILE_TOOLS = frozenset(name for name, kind in CATALOGUE.items() if kind is Kind.FILE)
REFUSED = frozenset(name for name, kind in CATALOGUE.items() if kind is Kind.REFUSED)
MCP_PREFIX = "mcp__"
# What `allowed_tools` may name (beside MCP tools), in the catalogue's order: a name the policy
# does not know is a mistake (or a tool of a newer CLI nobody has reviewed), never offered.
NAMEABLE = tuple(name for name, kind in CATALOGUE.items() if kind is not Kind.REFUSED)


def tool_name(rule: str) -> str:
    """The tool a permission rule names: `Bash(git status:*)` is Bash."""
    return rule.split("(", 1)[0].strip()


def base_tools(allowed_tools: Iterable[str]) -> list[str]:
    """The tools the CLI offers a session (its `--tools`): the file tools, and every catalogued,
    not refused tool that `allowed_tools` names, in the catalogue's order."""
    named = {tool_name(rule) for rule in allowed_tools}
    return [
        name
        for name, kind in CATALOGUE.items()
        if kind is Kind.FILE or (name in named and kind is not Kind.REFUSED)
    ]


def unexpected(offered: Iterable[str], base: Iterable[str], mcp_servers: Iterable[str]) -> list[str]:
    """The tools the CLI offers beyond the base set and the session's own MCP servers' tools."""
    allowed = set(base) | INERT_PLACEHOLDERS
    allowed |= {alias for name in base for alias in _ALIASES.get(name, ())}
    prefixes = tuple(f"{MCP_PREFIX}{server}__" for server in mcp_servers)
    return sorted(t for t in offered if t not in allowed and not (prefixes and t.startswith(prefixes)))


def refused_in(allowed_tools: Any) -> list[tuple[int, str]]:
    """The entries of `allowed_tools` (index, tool) naming a tool no session may have."""
    if not isinstance(allowed_tools, list):
        return []
    return [
        (i, tool_name(rule))
        for i, rule in enumerate(allowed_tools)
        if isinstance(rule, str) and tool_name(rule) in REFUSED
    ]


def unknown_in(allowed_tools: list[str]) -> list[tuple[int, str]]:
    """The entries of `allowed_tools` (index, tool) naming no tool the catalogue knows, nor an
    MCP tool."""
    return [
        (i, tool_name(rule))
        for i, rule in enumerate(allowed_tools)
        if tool_name(rule) not in CATALOGUE and not tool_name(rule).startswith(MCP_PREFIX)
    ]
