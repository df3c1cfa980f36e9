"""The CreateSession options a caller may set: an allowlist of keys, each with the shape its value
must have.

A caller (and, through the prompt, the model) must not be able to reach beyond the session's
workspace, run code at start-up, or point the CLI somewhere else with the service's credentials.
So only options that change what the agent says and how it uses the tools the service lets it
use are accepted; anything else (`settings`, `plugins`, `add_dirs`, `env`, a system prompt read
from a file, stdio MCP servers, `bypassPermissions`, ...) is OPTION_NOT_ALLOWED with a
BadRequest naming the key. `bypassPermissions` and stdio MCP servers exist only behind operator
flags (`OperatorOptions`). Every accepted value is checked for its type and shape here, at the
door, so nothing malformed reaches the SDK.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent_rewind.errors import InvalidArgument, OptionNotAllowed
from agent_rewind.sandbox.proxy import HostPattern, HostPatternError, covers
from agent_rewind.sessions import tools, urls

MAX_OPTIONS_BYTES = 64 * 1024
_MAX_TEXT = 32 * 1024
_MAX_NAME = 256
_MAX_LIST = 256
_PERMISSION_MODES = frozenset({"default", "acceptEdits", "plan", "dontAsk"})
_EFFORTS = frozenset({"low", "medium", "high", "xhigh", "max"})
_AGENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_HEADER_NAME = re.compile(r"^[A-Za-z0-9-]{1,128}$")


@dataclass(frozen=True)
class OperatorOptions:
    """What the operator lets callers do beyond the default (serve flags)."""

    allow_bypass_permissions: bool = False
    allow_stdio_mcp: bool = False
    # Hosts remote MCP servers may be on ("host" or "host:port"); empty: no remote MCP at all.
    mcp_hosts: frozenset[str] = field(default_factory=frozenset)
    # The hosts the command sandbox lets commands reach (--sandbox-allow-host); None: no sandbox.
    sandbox_hosts: tuple[str, ...] | None = ()


def _text(field: str, value: Any, *, limit: int = _MAX_TEXT, empty: bool = False) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(field, "must be a string")
    if not empty and not value.strip():
        raise InvalidArgument(field, "must not be empty")
    if len(value) > limit:
        raise InvalidArgument(field, f"must be at most {limit} characters")
    if "\x00" in value:
        raise InvalidArgument(field, "must not contain NUL characters")
    return value


def _names(field: str, value: Any) -> list[str]:
    if not isinstance(value, list):
        raise InvalidArgument(field, "must be a list of strings")
    if len(value) > _MAX_LIST:
        raise InvalidArgument(field, f"must hold at most {_MAX_LIST} entries")
    return [_text(f"{field}[{i}]", v, limit=_MAX_NAME) for i, v in enumerate(value)]


def _allowed_tools(field: str, value: Any) -> list[str]:
    names = _names(field, value)
    for i, tool in tools.refused_in(names):
        raise OptionNotAllowed(
            f"{field}[{i}]",
            f"{tool} reaches other sessions, starts turns of its own or leaves the workspace; "
            "no session of this service may have it",
        )
    for i, tool in tools.unknown_in(names):
        raise InvalidArgument(
            f"{field}[{i}]",
            f"no tool is named {tool!r}; a session may name {', '.join(tools.NAMEABLE)}, "
            f"or an MCP server's tool as {tools.MCP_PREFIX}SERVER__TOOL",
        )
    return names


def _integer(field: str, value: Any, *, low: int, high: int) -> int:
    # A protobuf Struct carries every number as a double.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(field, "must be an integer")
    if not math.isfinite(value) or int(value) != value or not low <= value <= high:
        raise InvalidArgument(field, f"must be an integer from {low} to {high}")
    return int(value)


def _number(field: str, value: Any, *, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidArgument(field, "must be a number")
    if not low < value <= high:
        raise InvalidArgument(field, f"must be above {low} and at most {high}")
    return float(value)


def _object(
    field: str, value: Any, allowed: set[str], required: frozenset[str] | set[str] = frozenset()
) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidArgument(field, "must be an object")
    for key in value:
        if key not in allowed:
            raise OptionNotAllowed(
                f"{field}.{key}", f"is not an option callers may set here; allowed: {sorted(allowed)}"
            )
    missing = required - value.keys()
    if missing:
        raise InvalidArgument(field, f"needs {sorted(missing)}")
    return value


def _system_prompt(field: str, value: Any) -> Any:
    if isinstance(value, str):
        return _text(field, value, empty=True)
    if isinstance(value, dict) and "type" in value and value["type"] != "preset":
        # {"type": "file", "path": ...} would read any file the service can read.
        raise OptionNotAllowed(f"{field}.type", "only the preset (with an appended text) or a string")
    prompt = _object(field, value, {"type", "preset", "append", "exclude_dynamic_sections"}, {"type"})
    if prompt.get("preset", "claude_code") != "claude_code":
        raise InvalidArgument(f"{field}.preset", "must be claude_code")
    out: dict[str, Any] = {"type": "preset", "preset": "claude_code"}
    if "append" in prompt:
        out["append"] = _text(f"{field}.append", prompt["append"], empty=True)
    if "exclude_dynamic_sections" in prompt:
        if not isinstance(prompt["exclude_dynamic_sections"], bool):
            raise InvalidArgument(f"{field}.exclude_dynamic_sections", "must be a boolean")
        out["exclude_dynamic_sections"] = prompt["exclude_dynamic_sections"]
    return out


def _thinking(field: str, value: Any) -> dict[str, Any]:
    thinking = _object(field, value, {"type", "budget_tokens", "display"}, {"type"})
    kind = thinking["type"]
    if kind not in ("adaptive", "enabled", "disabled"):
        raise InvalidArgument(f"{field}.type", "must be adaptive, enabled or disabled")
    out: dict[str, Any] = {"type": kind}
    if kind == "enabled":
        if "budget_tokens" not in thinking:
            raise InvalidArgument(f"{field}.budget_tokens", "is required when thinking is enabled")
        out["budget_tokens"] = _integer(
            f"{field}.budget_tokens", thinking["budget_tokens"], low=1, high=1 << 20
        )
    elif "budget_tokens" in thinking:
        raise InvalidArgument(f"{field}.budget_tokens", "only goes with type enabled")
    if "display" in thinking:
        if kind == "disabled" or thinking["display"] not in ("summarized", "omitted"):
            raise InvalidArgument(f"{field}.display", "must be summarized or omitted, with thinking on")
        out["display"] = thinking["display"]
    return out


def _agents(field: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or len(value) > 64:
        raise InvalidArgument(field, "must be an object of at most 64 subagent definitions")
    out: dict[str, Any] = {}
    for name, definition in value.items():
        where = f"{field}.{name}"
        if not isinstance(name, str) or not _AGENT_NAME.fullmatch(name):
            raise InvalidArgument(where, "a subagent name is letters, digits, '_', '.' or '-' (at most 64)")
        agent = _object(
            where,
            definition,
            {"description", "prompt", "tools", "disallowedTools", "model", "maxTurns", "effort"},
            {"description", "prompt"},
        )
        clean: dict[str, Any] = {
            "description": _text(f"{where}.description", agent["description"]),
            "prompt": _text(f"{where}.prompt", agent["prompt"]),
        }
        for key in ("tools", "disallowedTools"):
            if key in agent:
                clean[key] = _names(f"{where}.{key}", agent[key])
        if "model" in agent:
            clean["model"] = _text(f"{where}.model", agent["model"], limit=_MAX_NAME)
        if "maxTurns" in agent:
            clean["maxTurns"] = _integer(f"{where}.maxTurns", agent["maxTurns"], low=1, high=10_000)
        if "effort" in agent:
            clean["effort"] = _effort(f"{where}.effort", agent["effort"])
        out[name] = clean
    return out


def _mcp_servers(field: str, value: Any, operator: OperatorOptions) -> dict[str, Any]:
    if not isinstance(value, dict) or len(value) > 32:
        raise InvalidArgument(field, "must be an object of at most 32 MCP servers")
    out: dict[str, Any] = {}
    for name, config in value.items():
        where = f"{field}.{name}"
        if not isinstance(name, str) or not _AGENT_NAME.fullmatch(name):
            raise InvalidArgument(where, "a server name is letters, digits, '_', '.' or '-' (at most 64)")
        if not isinstance(config, dict):
            raise InvalidArgument(where, "must be an object")
        kind = config.get("type", "stdio")
        if kind in ("http", "sse"):
            server = _object(where, config, {"type", "url", "headers"}, {"type", "url"})
            try:
                checked = urls.check_url(_text(f"{where}.url", server["url"], limit=2048))
            except urls.UrlMalformed as err:
                raise InvalidArgument(f"{where}.url", str(err)) from None
            except urls.UrlRefused as err:  # one that URL parsers could read differently
                raise OptionNotAllowed(f"{where}.url", str(err)) from None
            host = checked.host
            shown = f"[{host}]" if ":" in host else host  # an IPv6 address, as a URL writes it
            hostport = f"{shown}:{checked.port}" if checked.explicit_port else shown
            allowed = {h.lower() for h in operator.mcp_hosts}
            if not allowed & {host, shown, f"{host}:{checked.port}", f"{shown}:{checked.port}"}:
                raise OptionNotAllowed(
                    f"{where}.url", f"the host {hostport!r} is not one the operator allows MCP servers on"
                )
            # The CLI gets what was checked, spelled canonically, never the text as given.
            url = checked.url
            clean: dict[str, Any] = {"type": kind, "url": url}
            if "headers" in server:
                headers = server["headers"]
                if not isinstance(headers, dict) or len(headers) > 32:
                    raise InvalidArgument(f"{where}.headers", "must be an object of at most 32 headers")
                clean["headers"] = {
                    _header(f"{where}.headers", k): _text(f"{where}.headers.{k}", v, limit=8192)
                    for k, v in headers.items()
                }
            out[name] = clean
        elif kind == "stdio":
            if not operator.allow_stdio_mcp:
                raise OptionNotAllowed(
                    where, "stdio MCP servers run a command on the host; the operator has not allowed them"
                )
            server = _object(where, config, {"type", "command", "args", "env"}, {"command"})
            clean = {"type": "stdio", "command": _text(f"{where}.command", server["command"], limit=4096)}
            if "args" in server:
                clean["args"] = _names(f"{where}.args", server["args"])
            if "env" in server:
                env = server["env"]
                if not isinstance(env, dict):
                    raise InvalidArgument(f"{where}.env", "must be an object of strings")
                clean["env"] = {str(k): _text(f"{where}.env.{k}", v, empty=True) for k, v in env.items()}
            out[name] = clean
        else:
            raise OptionNotAllowed(f"{where}.type", "must be http or sse (stdio needs the operator's flag)")
    return out


def _sandbox(field: str, value: Any, operator: OperatorOptions) -> dict[str, Any]:
    """`{"network": {"allowedDomains": [...]}}`: the hosts this session's commands may reach, each
    within what the operator allows. A session may narrow the server's list, never widen it."""
    if operator.sandbox_hosts is None:
        raise OptionNotAllowed(field, "this server runs without a command sandbox (--sandbox off)")
    network = _object(field, value, {"network"}, {"network"})["network"]
    domains = _object(f"{field}.network", network, {"allowedDomains"}, {"allowedDomains"})["allowedDomains"]
    names = _names(f"{field}.network.allowedDomains", domains)
    server = [HostPattern.parse(h) for h in operator.sandbox_hosts]
    for i, name in enumerate(names):
        where = f"{field}.network.allowedDomains[{i}]"
        try:
            pattern = HostPattern.parse(name)
        except HostPatternError as err:
            raise InvalidArgument(where, str(err)) from None
        if not covers(server, pattern):
            raise OptionNotAllowed(where, f"{name!r} is not within the hosts the operator allows")
    return {"network": {"allowedDomains": names}}


def sandbox_hosts(options: Mapping[str, Any]) -> tuple[HostPattern, ...] | None:
    """The session's own list of hosts its commands may reach (checked options), or None."""
    sandbox = options.get("sandbox")
    if not isinstance(sandbox, dict):
        return None
    return tuple(HostPattern.parse(h) for h in sandbox["network"]["allowedDomains"])


def _header(field: str, name: Any) -> str:
    if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
        raise InvalidArgument(field, f"{name!r} is not a header name")
    return name


def _permission_mode(field: str, value: Any, operator: OperatorOptions) -> str:
    if value == "bypassPermissions":
        if operator.allow_bypass_permissions:
            return "bypassPermissions"
        raise OptionNotAllowed(
            field, "bypassPermissions skips the service's tool policy; the operator has not allowed it"
        )
    if not isinstance(value, str) or value not in _PERMISSION_MODES:
        raise InvalidArgument(field, f"must be one of {sorted(_PERMISSION_MODES)}")
    return str(value)


def _effort(field: str, value: Any) -> str:
    if not isinstance(value, str) or value not in _EFFORTS:
        raise InvalidArgument(field, f"must be one of {sorted(_EFFORTS)}")
    return str(value)


_Check = Callable[[str, Any, OperatorOptions], Any]

# key -> its check. A key not here is OPTION_NOT_ALLOWED.
ALLOWED: dict[str, _Check] = {
    "model": lambda f, v, o: _text(f, v, limit=_MAX_NAME),
    "fallback_model": lambda f, v, o: _text(f, v, limit=_MAX_NAME),
    "system_prompt": lambda f, v, o: _system_prompt(f, v),
    "allowed_tools": lambda f, v, o: _allowed_tools(f, v),
    "disallowed_tools": lambda f, v, o: _names(f, v),
    "max_turns": lambda f, v, o: _integer(f, v, low=1, high=100_000),
    "max_budget_usd": lambda f, v, o: _number(f, v, low=0.0, high=1e6),
    "thinking": lambda f, v, o: _thinking(f, v),
    "max_thinking_tokens": lambda f, v, o: _integer(f, v, low=1, high=1 << 20),
    "effort": lambda f, v, o: _effort(f, v),
    "agents": lambda f, v, o: _agents(f, v),
    "permission_mode": _permission_mode,
    "mcp_servers": _mcp_servers,
    "sandbox": _sandbox,
}


def validate(options: Mapping[str, Any], operator: OperatorOptions) -> dict[str, Any]:
    """The options, checked key by key and normalized (integers as int); raises naming the field.

    A null value means the option is not set and is dropped.
    """
    import json

    if len(json.dumps(options, default=str)) > MAX_OPTIONS_BYTES:
        raise InvalidArgument("options", f"must be at most {MAX_OPTIONS_BYTES} bytes as JSON")
    out: dict[str, Any] = {}
    for key, value in options.items():
        field_name = f"options.{key}"
        check = ALLOWED.get(key)
        if check is None:
            raise OptionNotAllowed(
                field_name, f"is not an option callers may set; allowed: {', '.join(sorted(ALLOWED))}"
            )
        if value is None:
            continue
        out[key] = check(field_name, value, operator)
    return out


def sanitize(options: Mapping[str, Any], operator: OperatorOptions) -> tuple[dict[str, Any], list[str]]:
    """Stored options, each re-checked: those no longer allowed (an older version stored them, or
    the operator withdrew an opt-in) are dropped. Returns the options kept and the keys dropped."""
    kept: dict[str, Any] = {}
    dropped: list[str] = []
    for key, value in options.items():
        try:
            kept.update(validate({key: value}, operator))
        except InvalidArgument:
            dropped.append(key)
    return kept, dropped
