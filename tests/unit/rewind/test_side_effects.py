"""rewind/side_effects.py: which dropped tool calls no rewind undoes, and how they are summed up."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_rewind.rewind.side_effects import SUMMARY_CHARS, SideEffect, of_egress, of_tool_call
from agent_rewind.sessions.tools import CATALOGUE, Kind


@pytest.mark.parametrize("tool", sorted(n for n, k in CATALOGUE.items() if k is not Kind.NETWORK))
def test_tools_a_rewind_restores_or_that_touch_nothing_are_not_side_effects(tool: str) -> None:
    assert of_tool_call("p", tool, {"command": "curl https://example.com"}) is None


def test_an_mcp_call_names_its_server_tool_and_argument_names_never_their_values() -> None:
    effect = of_tool_call("p", "mcp__mail__send", {"to": "a@b.c", "api_key": "sk-secret-1", "body": "hi"})
    assert effect == SideEffect("p", "mcp__mail__send", "called send on MCP server mail (to, api_key, body)")
    assert "sk-secret" not in effect.summary and "a@b.c" not in effect.summary


def test_a_web_fetch_shows_where_it_went_without_user_query_or_fragment() -> None:
    effect = of_tool_call(
        "p", "WebFetch", {"url": "https://bob:pw@api.example.com:8443/v1/x?token=t0k#f", "prompt": "p"}
    )
    assert effect is not None
    assert effect.summary == "fetched https://api.example.com:8443/v1/x"


@pytest.mark.parametrize("url", [None, "", "not a url", "https://[::1", 7])
def test_a_web_fetch_of_no_usable_url_still_counts(url: object) -> None:
    effect = of_tool_call("p", "WebFetch", {"url": url})
    assert effect is not None and effect.summary == "fetched a URL"


def test_a_web_search_quotes_its_query_cut_short() -> None:
    effect = of_tool_call("p", "WebSearch", {"query": "  rewind   " + "x" * 200})
    assert effect is not None
    assert effect.summary.startswith("searched the web for “rewind xxx")
    assert effect.summary.endswith("…”")


def test_a_tool_the_catalogue_does_not_know_counts_failing_closed() -> None:
    effect = of_tool_call("p", "TeleportFiles", {})
    assert effect is not None and "does not know" in effect.summary


def test_egress_counts_connections_and_brackets_v6_hosts() -> None:
    assert of_egress("p", "pypi.org", 443, 1).summary == "a command reached pypi.org:443 (once)"
    assert of_egress("p", "2001:db8::1", 80, 3).summary == "a command reached [2001:db8::1]:80 (3 times)"


@given(tool=st.text(max_size=300), value=st.text(max_size=500))
def test_any_call_has_a_bounded_summary(tool: str, value: str) -> None:
    for effect in (
        of_tool_call("p", tool, {value: value}),
        of_tool_call("p", "mcp__" + tool, {value: value}),
        of_tool_call("p", "WebFetch", {"url": value}),
        of_tool_call("p", "WebSearch", {"query": value}),
    ):
        assert effect is None or len(effect.summary) <= SUMMARY_CHARS
