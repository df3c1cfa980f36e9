"""The CreateSession options allowlist (sessions/options.py): every key callers may set, the shapes
its value must have, and every other key refused as OPTION_NOT_ALLOWED naming the field."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from claude_agent_sdk import ClaudeAgentOptions

from agent_rewind.errors import InvalidArgument, OptionNotAllowed
from agent_rewind.sessions.options import ALLOWED, MAX_OPTIONS_BYTES, OperatorOptions, validate

NO_FLAGS = OperatorOptions()
EVERYTHING = OperatorOptions(
    allow_bypass_permissions=True, allow_stdio_mcp=True, mcp_hosts=frozenset({"mcp.example.com"})
)


def refused(options: dict[str, Any], operator: OperatorOptions = NO_FLAGS) -> InvalidArgument:
    """The error `validate` raises; fails the test when it raises nothing or something else."""
    with pytest.raises(InvalidArgument) as caught:
        validate(options, operator)
    return caught.value


def not_allowed(options: dict[str, Any], operator: OperatorOptions = NO_FLAGS) -> OptionNotAllowed:
    err = refused(options, operator)
    assert isinstance(err, OptionNotAllowed), f"{type(err).__name__}: {err.message}"
    assert err.reason == "OPTION_NOT_ALLOWED"
    return err


def ill_shaped(options: dict[str, Any], operator: OperatorOptions = NO_FLAGS) -> InvalidArgument:
    err = refused(options, operator)
    assert not isinstance(err, OptionNotAllowed), err.message
    assert err.reason == "INVALID_ARGUMENT"
    return err


# The allowlist itself


def test_the_allowlist_is_exactly_the_options_that_stay_inside_the_workspace() -> None:
    assert set(ALLOWED) == {
        "model",
        "fallback_model",
        "system_prompt",
        "allowed_tools",
        "disallowed_tools",
        "max_turns",
        "max_budget_usd",
        "thinking",
        "max_thinking_tokens",
        "effort",
        "agents",
        "permission_mode",
        "mcp_servers",
        "sandbox",
    }


@pytest.mark.parametrize(
    "key",
    [
        "settings",
        "plugins",
        "add_dirs",
        "env",
        "hooks",
        "cwd",
        "setting_sources",
        "cli_path",
        "extra_args",
        "resume",
        "resume_session_at",
        "session_id",
        "fork_session",
        "continue_conversation",
        "enable_file_checkpointing",
        "can_use_tool",
        "permission_prompt_tool_name",
        "strict_mcp_config",
        "skills",
        "user",
        "tools",
        "temperature",  # not an SDK option at all
    ],
)
def test_a_key_not_allowed_is_option_not_allowed_naming_the_field(key: str) -> None:
    err = not_allowed({"model": "m", key: "x"})
    assert err.field == f"options.{key}"
    assert err.metadata == {"field": f"options.{key}"}


def test_every_sdk_option_outside_the_allowlist_is_refused() -> None:
    """A new SDK option is refused until someone decides it is safe, not passed through."""
    outside = sorted({f.name for f in dataclasses.fields(ClaudeAgentOptions)} - set(ALLOWED))
    assert outside, "the SDK has options the allowlist leaves out"
    for key in outside:
        assert not_allowed({key: None}).field == f"options.{key}", key


def test_a_key_not_allowed_is_refused_even_when_null() -> None:
    assert not_allowed({"env": None}).field == "options.env"


# Null values, normalization


def test_null_values_are_dropped() -> None:
    assert validate({"model": None, "max_turns": None, "thinking": None}, NO_FLAGS) == {}


@pytest.mark.parametrize("name", ["Nope", "bash", "Bash2(ls)", "ShellTool"])
def test_a_tool_name_the_policy_does_not_know_is_refused_naming_it(name: str) -> None:
    err = ill_shaped({"allowed_tools": ["Read", name]})
    assert err.field == "options.allowed_tools[1]"
    assert repr(name.split("(")[0]) in err.message and "Bash" in err.message


def test_catalogued_tools_rules_and_mcp_tools_may_be_named() -> None:
    names = ["Bash(git status:*)", "Agent", "Task", "WebFetch", "TodoWrite", "mcp__db__query"]
    assert validate({"allowed_tools": names}, NO_FLAGS)["allowed_tools"] == names


def test_null_allowed_tools_does_not_reach_the_sdk() -> None:
    checked = validate({"allowed_tools": None, "model": "m"}, NO_FLAGS)
    assert checked == {"model": "m"}
    assert "allowed_tools" not in checked


def test_accepted_values_are_returned_normalized_and_the_input_is_not_changed() -> None:
    options: dict[str, Any] = {
        "model": "claude-test",
        "max_turns": 5.0,  # a google.protobuf.Struct has only doubles
        "max_thinking_tokens": 2048.0,
        "allowed_tools": ["Read", "Bash"],
    }
    before = json.loads(json.dumps(options))
    checked = validate(options, NO_FLAGS)
    assert checked == {
        "model": "claude-test",
        "max_turns": 5,
        "max_thinking_tokens": 2048,
        "allowed_tools": ["Read", "Bash"],
    }
    assert type(checked["max_turns"]) is int
    assert type(checked["max_thinking_tokens"]) is int
    assert options == before


def test_the_size_bound() -> None:
    err = ill_shaped({"system_prompt": "x" * (MAX_OPTIONS_BYTES + 1)})
    assert err.field == "options"
    # Just under the bound (and under the text limit) passes.
    validate({"system_prompt": "x" * 1000}, NO_FLAGS)


def _options_of(size: int) -> dict[str, Any]:
    """Options (each value within its own limit) that are `size` bytes as JSON."""

    def options(pad: int) -> dict[str, Any]:
        agents = {
            name: {"description": "d", "prompt": "p" * (pad // 2 + pad % 2 * i)}
            for i, name in enumerate("ab")
        }
        return {"system_prompt": "x" * 20_000, "agents": agents}

    return options(size - len(json.dumps(options(0))))


def test_options_of_exactly_the_size_bound_pass_and_one_byte_more_does_not() -> None:
    assert len(json.dumps(_options_of(MAX_OPTIONS_BYTES))) == MAX_OPTIONS_BYTES
    validate(_options_of(MAX_OPTIONS_BYTES), NO_FLAGS)
    assert ill_shaped(_options_of(MAX_OPTIONS_BYTES + 1)).field == "options"


# Text options


@pytest.mark.parametrize("key", ["model", "fallback_model"])
def test_model_names(key: str) -> None:
    assert validate({key: "claude-sonnet-4-5"}, NO_FLAGS) == {key: "claude-sonnet-4-5"}
    assert validate({key: "m" * 256}, NO_FLAGS) == {key: "m" * 256}, "at most 256 characters"
    for bad in (7, "", "   ", "m" * 257, "a\x00b", ["m"]):
        assert ill_shaped({key: bad}).field == f"options.{key}", bad


def test_system_prompt_as_a_string() -> None:
    assert validate({"system_prompt": "be brief"}, NO_FLAGS) == {"system_prompt": "be brief"}
    assert validate({"system_prompt": ""}, NO_FLAGS) == {"system_prompt": ""}
    assert ill_shaped({"system_prompt": 12}).field == "options.system_prompt"
    assert ill_shaped({"system_prompt": "x\x00"}).field == "options.system_prompt"


def test_system_prompt_as_the_preset() -> None:
    checked = validate(
        {"system_prompt": {"type": "preset", "append": "be brief", "exclude_dynamic_sections": True}},
        NO_FLAGS,
    )
    assert checked == {
        "system_prompt": {
            "type": "preset",
            "preset": "claude_code",
            "append": "be brief",
            "exclude_dynamic_sections": True,
        }
    }
    assert ill_shaped({"system_prompt": {"type": "preset", "preset": "other"}}).field == (
        "options.system_prompt.preset"
    )
    assert validate({"system_prompt": {"type": "preset", "append": ""}}, NO_FLAGS) == {
        "system_prompt": {"type": "preset", "preset": "claude_code", "append": ""}
    }
    assert ill_shaped({"system_prompt": {"append": "x"}}).field == "options.system_prompt"
    assert ill_shaped({"system_prompt": {"type": "preset", "append": 3}}).field == (
        "options.system_prompt.append"
    )
    assert ill_shaped({"system_prompt": {"type": "preset", "exclude_dynamic_sections": "yes"}}).field == (
        "options.system_prompt.exclude_dynamic_sections"
    )


def test_system_prompt_read_from_a_file_is_not_allowed() -> None:
    err = not_allowed({"system_prompt": {"type": "file", "path": "/etc/shadow"}})
    assert err.field == "options.system_prompt.type"
    err = not_allowed({"system_prompt": {"type": "file"}})
    assert err.field == "options.system_prompt.type"


# Lists of tool names


@pytest.mark.parametrize("key", ["allowed_tools", "disallowed_tools"])
def test_tool_lists(key: str) -> None:
    assert validate({key: ["Read", "mcp__srv__tool"]}, NO_FLAGS) == {key: ["Read", "mcp__srv__tool"]}
    assert validate({key: []}, NO_FLAGS) == {key: []}
    assert ill_shaped({key: "Bash"}).field == f"options.{key}"
    assert ill_shaped({key: 5}).field == f"options.{key}"
    assert ill_shaped({key: {"Bash": True}}).field == f"options.{key}"
    assert ill_shaped({key: ["Bash", 3]}).field == f"options.{key}[1]"
    assert ill_shaped({key: ["Bash", ""]}).field == f"options.{key}[1]"
    assert validate({key: ["Read"] * 256}, NO_FLAGS) == {key: ["Read"] * 256}, "at most 256 entries"
    assert ill_shaped({key: ["x"] * 257}).field == f"options.{key}"


# Numbers


@pytest.mark.parametrize(("key", "high"), [("max_turns", 100_000), ("max_thinking_tokens", 1 << 20)])
def test_integer_options(key: str, high: int) -> None:
    assert validate({key: 1}, NO_FLAGS) == {key: 1}
    assert validate({key: float(high)}, NO_FLAGS) == {key: high}
    for bad in (0, -1, high + 1, 5.5, "5", True, [5], {"n": 5}, float("nan"), float("inf"), float("-inf")):
        assert ill_shaped({key: bad}).field == f"options.{key}", bad


def test_max_budget_usd() -> None:
    assert validate({"max_budget_usd": 2.5}, NO_FLAGS) == {"max_budget_usd": 2.5}
    assert validate({"max_budget_usd": 3}, NO_FLAGS) == {"max_budget_usd": 3.0}
    assert validate({"max_budget_usd": 1e6}, NO_FLAGS) == {"max_budget_usd": 1e6}, "at most 1e6"
    for bad in (0, -1.0, 1e6 + 1, "lots", True, float("nan"), float("inf")):
        assert ill_shaped({"max_budget_usd": bad}).field == "options.max_budget_usd", bad


# Thinking, effort


def test_thinking() -> None:
    assert validate({"thinking": {"type": "adaptive"}}, NO_FLAGS) == {"thinking": {"type": "adaptive"}}
    assert validate(
        {"thinking": {"type": "enabled", "budget_tokens": 1024.0, "display": "omitted"}}, NO_FLAGS
    ) == {"thinking": {"type": "enabled", "budget_tokens": 1024, "display": "omitted"}}
    assert validate({"thinking": {"type": "disabled"}}, NO_FLAGS) == {"thinking": {"type": "disabled"}}
    cases = [
        ({"type": "sometimes"}, "options.thinking.type"),
        ({"type": "enabled"}, "options.thinking.budget_tokens"),
        ({"type": "enabled", "budget_tokens": 0}, "options.thinking.budget_tokens"),
        ({"type": "enabled", "budget_tokens": 1.5}, "options.thinking.budget_tokens"),
        ({"type": "adaptive", "budget_tokens": 10}, "options.thinking.budget_tokens"),
        ({"type": "disabled", "display": "omitted"}, "options.thinking.display"),
        ({"type": "adaptive", "display": "verbose"}, "options.thinking.display"),
        ({}, "options.thinking"),
    ]
    for value, field in cases:
        assert ill_shaped({"thinking": value}).field == field, value
    assert ill_shaped({"thinking": "on"}).field == "options.thinking"
    assert not_allowed({"thinking": {"type": "adaptive", "extra": 1}}).field == "options.thinking.extra"


def test_effort() -> None:
    for level in ("low", "medium", "high", "xhigh", "max"):
        assert validate({"effort": level}, NO_FLAGS) == {"effort": level}
    assert ill_shaped({"effort": "extreme"}).field == "options.effort"
    assert ill_shaped({"effort": 3}).field == "options.effort"


# Subagents


def test_agents_with_every_allowed_field() -> None:
    definition = {
        "description": "reviews code",
        "prompt": "review it",
        "tools": ["Read", "Grep"],
        "disallowedTools": ["Bash"],
        "model": "sonnet",
        "maxTurns": 3.0,
        "effort": "high",
    }
    checked = validate({"agents": {"code-reviewer.v2": definition}}, NO_FLAGS)
    assert checked == {"agents": {"code-reviewer.v2": {**definition, "maxTurns": 3}}}


def test_a_session_may_define_64_subagents() -> None:
    agents = {f"a{i}": {"description": "d", "prompt": "p"} for i in range(64)}
    assert validate({"agents": agents}, NO_FLAGS) == {"agents": agents}


def test_agents_ill_shaped() -> None:
    good = {"description": "d", "prompt": "p"}
    cases = [
        ("not an object", "options.agents"),
        ({f"a{i}": good for i in range(65)}, "options.agents"),
        ({"bad name": good}, "options.agents.bad name"),
        ({"-x": good}, "options.agents.-x"),
        ({"r": "text"}, "options.agents.r"),
        ({"r": {"description": "d"}}, "options.agents.r"),
        ({"r": {**good, "description": ""}}, "options.agents.r.description"),
        ({"r": {**good, "tools": "Read"}}, "options.agents.r.tools"),
        ({"r": {**good, "maxTurns": 0}}, "options.agents.r.maxTurns"),
        ({"r": {**good, "effort": "extreme"}}, "options.agents.r.effort"),
    ]
    for value, field in cases:
        assert ill_shaped({"agents": value}).field == field, value


@pytest.mark.parametrize(
    "key", ["permissionMode", "mcpServers", "skills", "memory", "hooks", "initialPrompt"]
)
def test_a_subagent_field_not_allowed_is_option_not_allowed(key: str) -> None:
    err = not_allowed({"agents": {"r": {"description": "d", "prompt": "p", key: "bypassPermissions"}}})
    assert err.field == f"options.agents.r.{key}"


# Permission mode


def test_permission_modes() -> None:
    for mode in ("default", "acceptEdits", "plan", "dontAsk"):
        assert validate({"permission_mode": mode}, NO_FLAGS) == {"permission_mode": mode}
    assert ill_shaped({"permission_mode": "yolo"}).field == "options.permission_mode"


def test_bypass_permissions_needs_the_operator_flag() -> None:
    assert not_allowed({"permission_mode": "bypassPermissions"}).field == "options.permission_mode"
    allowed = OperatorOptions(allow_bypass_permissions=True)
    assert validate({"permission_mode": "bypassPermissions"}, allowed) == {
        "permission_mode": "bypassPermissions"
    }


# MCP servers


def test_no_mcp_servers() -> None:
    assert validate({"mcp_servers": {}}, NO_FLAGS) == {"mcp_servers": {}}
    assert ill_shaped({"mcp_servers": ["x"]}).field == "options.mcp_servers"
    assert ill_shaped({"mcp_servers": {"s": "http://x"}}).field == "options.mcp_servers.s"
    assert ill_shaped({"mcp_servers": {"bad name": {"type": "http"}}}).field == "options.mcp_servers.bad name"


def test_a_remote_mcp_server_on_an_allowed_host() -> None:
    config = {
        "type": "http",
        "url": "https://MCP.example.com/mcp",
        "headers": {"Authorization": "Bearer t", "X-Team": "a"},
    }
    checked = validate({"mcp_servers": {"docs": config}}, EVERYTHING)
    # What the CLI gets is the URL that was checked, spelled canonically.
    assert checked == {"mcp_servers": {"docs": {**config, "url": "https://mcp.example.com/mcp"}}}
    sse = {"type": "sse", "url": "http://mcp.example.com:8080/sse"}
    assert validate({"mcp_servers": {"events": sse}}, EVERYTHING) == {"mcp_servers": {"events": sse}}


def test_a_remote_mcp_server_on_a_host_the_operator_did_not_allow() -> None:
    config = {"type": "http", "url": "https://evil.example.net/mcp"}
    assert not_allowed({"mcp_servers": {"s": config}}, EVERYTHING).field == "options.mcp_servers.s.url"
    # No host allowed at all (the default): no remote MCP.
    ok_elsewhere = {"type": "http", "url": "https://mcp.example.com/mcp"}
    assert not_allowed({"mcp_servers": {"s": ok_elsewhere}}).field == "options.mcp_servers.s.url"
    # Credentials in the URL do not change which host it is.
    sneaky = {"type": "http", "url": "https://mcp.example.com@evil.example.net/mcp"}
    assert not_allowed({"mcp_servers": {"s": sneaky}}, EVERYTHING).field == "options.mcp_servers.s.url"


def test_an_allowed_host_with_a_port_allows_that_port_only() -> None:
    operator = OperatorOptions(mcp_hosts=frozenset({"mcp.example.com:8443"}))
    good = {"type": "http", "url": "https://mcp.example.com:8443/mcp"}
    assert validate({"mcp_servers": {"s": good}}, operator) == {"mcp_servers": {"s": good}}
    for url in ("https://mcp.example.com:9000/mcp", "https://mcp.example.com/mcp"):
        err = not_allowed({"mcp_servers": {"s": {"type": "http", "url": url}}}, operator)
        assert err.field == "options.mcp_servers.s.url", url


def test_a_remote_mcp_server_on_an_allowed_ipv6_address() -> None:
    """The operator names the address without brackets; the CLI gets it in them."""
    operator = OperatorOptions(mcp_hosts=frozenset({"::1"}))
    config = {"type": "http", "url": "http://[0:0::1]:9000/mcp"}
    assert validate({"mcp_servers": {"s": config}}, operator) == {
        "mcp_servers": {"s": {"type": "http", "url": "http://[::1]:9000/mcp"}}
    }
    other = {"type": "http", "url": "http://[::2]/mcp"}
    assert not_allowed({"mcp_servers": {"s": other}}, operator).field == "options.mcp_servers.s.url"


def test_an_ipv6_mcp_host_may_be_named_as_a_url_writes_it_with_its_port() -> None:
    """`--mcp-host [::1]:9000` allows that port of that address, and only that port."""
    operator = OperatorOptions(mcp_hosts=frozenset({"[::1]:9000"}))
    config = {"type": "http", "url": "http://[::1]:9000/mcp"}
    assert validate({"mcp_servers": {"s": config}}, operator) == {"mcp_servers": {"s": config}}
    other_port = {"type": "http", "url": "http://[::1]:9001/mcp"}
    refused = not_allowed({"mcp_servers": {"s": other_port}}, operator)
    assert "'[::1]:9001'" in refused.message


def test_at_most_32_mcp_servers_with_at_most_32_headers_each() -> None:
    headers = {f"X-H{i}": "v" for i in range(32)}
    servers = {
        f"s{i}": {"type": "http", "url": "https://mcp.example.com/", "headers": headers} for i in range(32)
    }
    assert validate({"mcp_servers": servers}, EVERYTHING) == {"mcp_servers": servers}
    more = {**servers, "s32": {"type": "http", "url": "https://mcp.example.com/"}}
    assert ill_shaped({"mcp_servers": more}, EVERYTHING).field == "options.mcp_servers"
    one = {"type": "http", "url": "https://mcp.example.com/", "headers": {**headers, "X-H32": "v"}}
    assert ill_shaped({"mcp_servers": {"s": one}}, EVERYTHING).field == "options.mcp_servers.s.headers"


def test_remote_mcp_servers_ill_shaped() -> None:
    cases = [
        ({"type": "http"}, "options.mcp_servers.s"),
        ({"type": "http", "url": "ftp://mcp.example.com/x"}, "options.mcp_servers.s.url"),
        ({"type": "http", "url": "not a url"}, "options.mcp_servers.s.url"),
        (
            {"type": "http", "url": "https://mcp.example.com/", "headers": "x"},
            "options.mcp_servers.s.headers",
        ),
        (
            {"type": "http", "url": "https://mcp.example.com/", "headers": {"Bad Header": "x"}},
            "options.mcp_servers.s.headers",
        ),
        (
            {"type": "http", "url": "https://mcp.example.com/", "headers": {"X-A": 3}},
            "options.mcp_servers.s.headers.X-A",
        ),
    ]
    for config, field in cases:
        assert ill_shaped({"mcp_servers": {"s": config}}, EVERYTHING).field == field, config
    extra = {"type": "http", "url": "https://mcp.example.com/", "command": "sh"}
    assert not_allowed({"mcp_servers": {"s": extra}}, EVERYTHING).field == "options.mcp_servers.s.command"
    other = {"type": "sdk", "name": "x"}
    assert not_allowed({"mcp_servers": {"s": other}}, EVERYTHING).field == "options.mcp_servers.s.type"


@pytest.mark.parametrize(
    "config", [{"command": "sh"}, {"type": "stdio", "command": "sh", "args": ["-c", "id"]}]
)
def test_stdio_mcp_servers_need_the_operator_flag(config: dict[str, Any]) -> None:
    assert not_allowed({"mcp_servers": {"local": config}}).field == "options.mcp_servers.local"
    # The remote-host allowance is not the stdio flag.
    hosts_only = OperatorOptions(mcp_hosts=frozenset({"mcp.example.com"}))
    assert not_allowed({"mcp_servers": {"local": config}}, hosts_only).field == "options.mcp_servers.local"


def test_stdio_mcp_servers_with_the_operator_flag() -> None:
    operator = OperatorOptions(allow_stdio_mcp=True)
    config = {"command": "/usr/bin/mcp", "args": ["--ro"], "env": {"TOKEN": ""}}
    assert validate({"mcp_servers": {"local": config}}, operator) == {
        "mcp_servers": {"local": {"type": "stdio", **config}}
    }
    assert ill_shaped({"mcp_servers": {"local": {"args": []}}}, operator).field == "options.mcp_servers.local"
    assert ill_shaped({"mcp_servers": {"local": {"command": "x", "env": ["A=1"]}}}, operator).field == (
        "options.mcp_servers.local.env"
    )
    assert not_allowed({"mcp_servers": {"local": {"command": "x", "cwd": "/"}}}, operator).field == (
        "options.mcp_servers.local.cwd"
    )


# Bugs


@pytest.mark.parametrize(
    "options",
    [
        {"permission_mode": ["default"]},
        {"effort": {"level": "high"}},
        {"agents": {"r": {"description": "d", "prompt": "p", "effort": ["high"]}}},
    ],
    ids=["permission_mode", "effort", "agent_effort"],
)
def test_an_unhashable_value_for_an_enumerated_option_is_invalid_argument(options: dict[str, Any]) -> None:
    ill_shaped(options)


@pytest.mark.parametrize("url", ["https://mcp.example.com:abc/mcp", "https://mcp.example.com:99999/mcp"])
def test_an_mcp_url_with_a_bad_port_is_invalid_argument(url: str) -> None:
    assert ill_shaped({"mcp_servers": {"s": {"type": "http", "url": url}}}, EVERYTHING).field == (
        "options.mcp_servers.s.url"
    )


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"agents": {"reviewer\n": {"description": "d", "prompt": "p"}}}, "options.agents.reviewer\n"),
        (
            {"mcp_servers": {"docs\n": {"type": "http", "url": "https://mcp.example.com/"}}},
            "options.mcp_servers.docs\n",
        ),
        (
            {
                "mcp_servers": {
                    "docs": {"type": "http", "url": "https://mcp.example.com/", "headers": {"X-A\n": "v"}}
                }
            },
            "options.mcp_servers.docs.headers",
        ),
    ],
    ids=["agent_name", "mcp_server_name", "header_name"],
)
def test_a_name_with_a_trailing_newline_is_refused(options: dict[str, Any], field: str) -> None:
    assert ill_shaped(options, EVERYTHING).field == field


def test_stored_options_no_longer_allowed_are_dropped_and_named() -> None:
    from agent_rewind.sessions.options import OperatorOptions, sanitize

    stored = {
        "model": "claude-test",
        "settings": '{"hooks": {}}',
        "add_dirs": ["/"],
        "permission_mode": "bypassPermissions",
        "allowed_tools": ["Bash"],
    }
    kept, dropped = sanitize(stored, OperatorOptions())
    assert kept == {"model": "claude-test", "allowed_tools": ["Bash"]}
    assert sorted(dropped) == ["add_dirs", "permission_mode", "settings"]
    kept, dropped = sanitize(stored, OperatorOptions(allow_bypass_permissions=True))
    assert kept["permission_mode"] == "bypassPermissions" and "permission_mode" not in dropped


# --- allowed_tools: tools no session may have --------------------------------------------------


@pytest.mark.parametrize(
    "tool", ["ListAgents", "SendMessage", "ScheduleWakeup", "CronCreate", "EnterWorktree"]
)
def test_a_tool_that_reaches_other_sessions_or_starts_turns_is_refused_by_name(tool: str) -> None:
    err = not_allowed({"allowed_tools": ["Read", f"{tool}(*)" if tool == "CronCreate" else tool]})
    assert err.field == "options.allowed_tools[1]"
    assert tool in err.message


# --- sandbox: a session narrows the hosts its commands may reach --------------------------------


def _hosts(*hosts: str) -> OperatorOptions:
    return OperatorOptions(sandbox_hosts=hosts)


def test_a_session_may_narrow_the_allowed_hosts() -> None:
    from agent_rewind.sessions.options import sandbox_hosts, validate

    options = {"sandbox": {"network": {"allowedDomains": ["api.example.com", "pypi.org:443"]}}}
    checked = validate(options, _hosts("*.example.com", "pypi.org"))
    assert checked == options
    assert [str(p) for p in sandbox_hosts(checked) or ()] == ["api.example.com", "pypi.org:443"]
    assert sandbox_hosts({"model": "m"}) is None, "no list of its own: the server's"


@pytest.mark.parametrize(
    ("server", "asked"),
    [
        (("pypi.org",), "evil.example"),
        (("pypi.org",), "*.pypi.org"),  # a wildcard is wider than one host
        (("pypi.org",), "pypi.org:22"),  # another port
        (("api.example.com:8443",), "api.example.com"),  # 80 and 443 are not 8443
        ((), "pypi.org"),  # the operator allows none
    ],
)
def test_a_session_may_never_widen_the_allowed_hosts(server: tuple[str, ...], asked: str) -> None:
    err = not_allowed({"sandbox": {"network": {"allowedDomains": [asked]}}}, _hosts(*server))
    assert err.field == "options.sandbox.network.allowedDomains[0]"


def test_the_sandbox_option_is_refused_without_a_sandbox() -> None:
    err = not_allowed({"sandbox": {"network": {"allowedDomains": []}}}, OperatorOptions(sandbox_hosts=None))
    assert err.field == "options.sandbox"


@pytest.mark.parametrize(
    "value",
    [
        {"enabled": False},  # the sandbox is the operator's, not the caller's
        {"network": {"allowedDomains": ["x"], "allowUnixSockets": ["/run/docker.sock"]}},
        {"network": {"allowedDomains": "pypi.org"}},
    ],
)
def test_nothing_else_of_the_sdk_s_sandbox_settings_is_accepted(value: dict[str, Any]) -> None:
    err = refused({"sandbox": value}, _hosts("pypi.org"))
    assert err.field.startswith("options.sandbox")
