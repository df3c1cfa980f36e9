"""Side effects: what the turns a rewind drops did outside everything a rewind restores.

A rewind puts back the workspace's files and the conversation. It cannot call back an e-mail an
MCP tool sent, a page a web fetch read (and whatever the server behind it did on that request), or
a request a command made to a host the sandbox lets it reach. Before a client applies a rewind it
should be able to say so (API.md, "Rewind breadth": `RewindResult.side_effects`), so DryRun and
Rewind list them, one per tool call (or per host a turn's commands reached), oldest first.

What counts is decided by the tool catalogue (`sessions/tools.py`), failing closed: network tools,
MCP tools, and any tool the catalogue does not know are side effects; file tools (restored by the
rewind), commands (their network reach is reported by the egress proxy, not guessed from their
text), subagents (their own calls are listed) and inert tools are not.

A summary is short and never holds a credential or a value the caller passed a tool: a URL
without its user, query or fragment; a search's query cut short; for an MCP tool, the names of
its arguments only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from agent_rewind.sessions.tools import CATALOGUE, MCP_PREFIX, Kind
from agent_rewind.transcript.entries import RewindPoint
from agent_rewind.transcript.records import Entry
from agent_rewind.transcript.tool_calls import calls_at, subagent_calls
from agent_rewind.transcript.view import ConversationView

SUMMARY_CHARS = 120
# A result lists at most this many (oldest first): enough to warn, bounded in size.
MAX_SIDE_EFFECTS = 1000
_AGENT_TOOLS = frozenset(name for name, kind in CATALOGUE.items() if kind is Kind.AGENT)
_QUERY_CHARS = 80
_ARGUMENTS = 8  # an MCP call's argument names listed at most


@dataclass(frozen=True, slots=True)
class SideEffect:
    """One thing a dropped turn did that no rewind undoes."""

    message_id: str  # the prompt that opened the turn (its rewind point id)
    tool: str  # the tool's name as the model called it; "Bash" for a command's network reach
    summary: str


@dataclass(frozen=True, slots=True)
class Egress:
    """A host a turn's commands reached through the sandbox's egress proxy."""

    message_id: str  # the turn's prompt
    host: str
    port: int


def to_read(view: ConversationView, point: RewindPoint) -> list[tuple[str, Entry]]:
    """The entries from `point` on whose lines `collect` must read (with their turn's prompt):
    those calling a side-effecting tool or a subagent. Most turns have none."""
    return [
        (prompt, entry)
        for prompt, entry in view.tool_calls_from(point)
        if any(tool in _AGENT_TOOLS or counts(tool) for tool in entry.tools)
    ]


def collect(
    view: ConversationView,
    point: RewindPoint,
    egress: Iterable[Egress] = (),
    wanted: list[tuple[str, Entry]] | None = None,
) -> tuple[SideEffect, ...]:
    """The side effects of the turns from `point` to the end of `view`, turn by turn, oldest
    first: their tool calls (a subagent's where the turn started it), then the hosts their
    commands reached. Blocking when `wanted` (`to_read`'s answer) is not empty: it reads those
    lines from the transcript."""
    if wanted is None:
        wanted = to_read(view, point)
    by_turn: dict[str, list[SideEffect]] = {}
    if wanted:
        turn_of = {entry.offset: prompt for prompt, entry in wanted}
        calls = list(calls_at(view.transcript, [entry.offset for _, entry in wanted]))
        spawns = [c.call_id for _, c in calls if c.name in _AGENT_TOOLS]
        spawned = subagent_calls(view.transcript, spawns) if spawns else {}
        for offset, call in calls:
            prompt = turn_of[offset]
            made = spawned.get(call.call_id, []) if call.name in _AGENT_TOOLS else [call]
            for one in made:
                if one.name not in _AGENT_TOOLS and (effect := of_tool_call(prompt, one.name, one.input)):
                    by_turn.setdefault(prompt, []).append(effect)
    for reach in egress:
        by_turn.setdefault(reach.message_id, []).append(of_egress(reach.message_id, reach.host, reach.port))
    order = [p.message_id for p in view.points[point.index :]]
    effects = [effect for prompt in order for effect in by_turn.get(prompt, ())]
    return tuple(effects[:MAX_SIDE_EFFECTS])


def counts(tool: str) -> bool:
    """Whether a call of `tool` is a side effect, whatever its input."""
    return of_tool_call("", tool, None) is not None


def of_tool_call(message_id: str, tool: str, tool_input: Any) -> SideEffect | None:
    """The side effect of one tool call, or None when a rewind restores (or it never had) one."""
    fields: Mapping[str, Any] = tool_input if isinstance(tool_input, Mapping) else {}
    if tool.startswith(MCP_PREFIX):
        server, _, name = tool[len(MCP_PREFIX) :].partition("__")
        names = [str(key) for key in fields][:_ARGUMENTS]
        more = ", …" if len(fields) > _ARGUMENTS else ""
        summary = f"called {name or tool} on MCP server {server or '?'} ({', '.join(names)}{more})"
    elif tool == "WebFetch":
        summary = f"fetched {_url(fields.get('url'))}"
    elif tool == "WebSearch":
        summary = f"searched the web for {_quoted(fields.get('query'))}"
    elif tool not in CATALOGUE:
        summary = f"called {tool}, a tool this service does not know"
    elif CATALOGUE[tool] is Kind.NETWORK:
        summary = f"reached the network ({tool})"
    else:
        return None
    return SideEffect(message_id, tool, _cut(summary))


def of_egress(message_id: str, host: str, port: int) -> SideEffect:
    """A host the turn's commands reached through the sandbox's egress proxy."""
    target = f"[{host}]" if ":" in host else host
    return SideEffect(message_id, "Bash", _cut(f"a command reached {target}:{port}"))


def _url(value: Any) -> str:
    """scheme://host[:port]/path of a URL: its user, password, query and fragment left out."""
    if not isinstance(value, str) or not value:
        return "a URL"
    try:
        parts = urlsplit(value.strip())
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "a URL"
    if not parts.scheme or not host:
        return "a URL"
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _quoted(value: Any) -> str:
    text = " ".join(value.split()) if isinstance(value, str) else ""
    if not text:
        return "something"
    if len(text) > _QUERY_CHARS:
        text = text[: _QUERY_CHARS - 1] + "…"
    return f"“{text}”"


def _cut(text: str) -> str:
    return text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 1] + "…"
