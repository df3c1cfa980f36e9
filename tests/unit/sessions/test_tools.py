"""The tools the CLI may offer a session: the file tools, and what allowed_tools names that the
catalogue knows and does not refuse; nothing else."""

from __future__ import annotations

from agent_rewind.sessions import tools


def test_a_session_that_names_nothing_gets_the_file_tools_only() -> None:
    assert set(tools.base_tools([])) == tools.FILE_TOOLS


def test_named_tools_join_the_file_tools_whatever_the_rule_says_of_their_input() -> None:
    base = tools.base_tools(["Bash(git status:*)", "WebFetch", "Agent"])
    assert {"Bash", "WebFetch", "Agent"} <= set(base)
    assert set(base) - tools.FILE_TOOLS == {"Bash", "WebFetch", "Agent"}


def test_a_refused_or_unknown_name_never_joins_the_base_set() -> None:
    base = set(tools.base_tools(["ScheduleWakeup", "SendMessage", "ListAgents", "BrandNewCliTool"]))
    assert base == tools.FILE_TOOLS


def test_every_refused_tool_is_named_by_its_entry() -> None:
    found = tools.refused_in(["Read", "ScheduleWakeup", "CronCreate(*)", 3, "Bash"])
    assert found == [(1, "ScheduleWakeup"), (2, "CronCreate")]
    assert tools.refused_in("ScheduleWakeup") == []


def test_what_the_cli_offers_beyond_the_base_set_is_unexpected() -> None:
    base = tools.base_tools(["Bash"])
    offered = [*base, "DeferredToolPlaceholder", "mcp__docs__search", "ListAgents", "mcp__other__x"]
    assert tools.unexpected(offered, base, ["docs"]) == ["ListAgents", "mcp__other__x"]
    assert tools.unexpected(base, base, []) == []
