"""rewind/side_effects.py: which dropped tool calls no rewind undoes, and how they are summed up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_rewind.rewind.side_effects import (
    MAX_SIDE_EFFECTS,
    SUMMARY_CHARS,
    Egress,
    SideEffect,
    collect,
    of_egress,
    of_tool_call,
)
from agent_rewind.sessions.tools import CATALOGUE, Kind
from agent_rewind.testing.fake_agent import append, prompt_entry, reply_entry
from agent_rewind.transcript.index import TranscriptIndex


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


def test_an_mcp_call_lists_at_most_eight_argument_names() -> None:
    eight = of_tool_call("p", "mcp__s__t", {f"a{i}": i for i in range(8)})
    nine = of_tool_call("p", "mcp__s__t", {f"a{i}": i for i in range(9)})
    assert eight is not None and eight.summary.endswith("a6, a7)")
    assert nine is not None and nine.summary.endswith("a6, a7, …)")


@pytest.mark.parametrize("url", ["https:///no-host", "//host.example/no-scheme", "http://"])
def test_a_url_without_a_scheme_or_a_host_is_just_a_url(url: str) -> None:
    effect = of_tool_call("p", "WebFetch", {"url": url})
    assert effect is not None and effect.summary == "fetched a URL"


def test_a_web_search_of_nothing_says_so() -> None:
    effect = of_tool_call("p", "WebSearch", {"query": "   "})
    assert effect is not None and effect.summary == "searched the web for something"


def test_a_query_and_a_summary_are_cut_only_past_their_bounds() -> None:
    exact = of_tool_call("p", "WebSearch", {"query": "q" * 80})
    longer = of_tool_call("p", "WebSearch", {"query": "q" * 81})
    assert exact is not None and exact.summary == f"searched the web for “{'q' * 80}”"
    assert longer is not None and longer.summary == f"searched the web for “{'q' * 79}…”"
    host = "h" * (SUMMARY_CHARS - len("a command reached :1"))
    assert of_egress("p", host, 1).summary == f"a command reached {host}:1"  # exactly the bound
    cut = of_egress("p", host + "h", 1).summary
    assert len(cut) == SUMMARY_CHARS and cut.endswith("…")


def test_a_web_search_quotes_its_query_cut_short() -> None:
    effect = of_tool_call("p", "WebSearch", {"query": "  rewind   " + "x" * 200})
    assert effect is not None
    assert effect.summary.startswith("searched the web for “rewind xxx")
    assert effect.summary.endswith("…”")


def test_a_tool_the_catalogue_does_not_know_counts_failing_closed() -> None:
    effect = of_tool_call("p", "TeleportFiles", {})
    assert effect is not None and "does not know" in effect.summary


def test_egress_names_the_host_and_port_and_brackets_v6_hosts() -> None:
    assert of_egress("p", "pypi.org", 443).summary == "a command reached pypi.org:443"
    assert of_egress("p", "2001:db8::1", 80).summary == "a command reached [2001:db8::1]:80"


@given(tool=st.text(max_size=300), value=st.text(max_size=500))
def test_any_call_has_a_bounded_summary(tool: str, value: str) -> None:
    for effect in (
        of_tool_call("p", tool, {value: value}),
        of_tool_call("p", "mcp__" + tool, {value: value}),
        of_tool_call("p", "WebFetch", {"url": value}),
        of_tool_call("p", "WebSearch", {"query": value}),
    ):
        assert effect is None or len(effect.summary) <= SUMMARY_CHARS


# --- collect: the calls of the turns a rewind takes back, from the transcript -----------------


def _call(uid: str, parent: str, *calls: tuple[str, str, dict[str, object]]) -> dict[str, object]:
    entry = reply_entry(uid, parent, "")
    entry["message"]["content"] = [  # type: ignore[index]
        {"type": "tool_use", "id": call_id, "name": name, "input": args} for call_id, name, args in calls
    ]
    return entry


def _uid(n: int) -> str:
    return f"{n:08x}-0000-4000-8000-000000000000"


def test_collect_lists_the_calls_from_the_point_on_turn_by_turn_with_subagents_and_egress(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.jsonl"
    p0, p1, p2 = _uid(1), _uid(10), _uid(20)
    append(
        path,
        prompt_entry(p0, None, "first"),
        _call(_uid(2), p0, ("t0", "mcp__mail__send", {"to": "x"})),  # before the point: kept
        prompt_entry(p1, _uid(2), "second"),
        _call(
            _uid(11), p1, ("t1", "Write", {"file_path": "a"}), ("t2", "WebFetch", {"url": "https://h/p?k=s"})
        ),
        _call(_uid(12), _uid(11), ("t3", "Agent", {"prompt": "go"})),
        prompt_entry(p2, _uid(12), "third"),
        _call(_uid(21), p2, ("t4", "mcp__db__drop", {"table": "t"})),
    )
    agents = path.with_suffix("") / "subagents"
    agents.mkdir(parents=True)
    (agents / "agent-a1.meta.json").write_text(json.dumps({"toolUseId": "t3"}))
    append(agents / "agent-a1.jsonl", _call(_uid(30), _uid(12), ("t5", "WebSearch", {"query": "q"})))
    index = TranscriptIndex(path)
    index.refresh()
    view = index.view()
    point = view.resolve(p1)

    effects = collect(view, point, [Egress(p1, "pypi.org", 443), Egress(p2, "example.com", 80)])

    assert [(e.message_id, e.tool) for e in effects] == [
        (p1, "WebFetch"),
        (p1, "WebSearch"),  # the subagent the turn started
        (p1, "Bash"),
        (p2, "mcp__db__drop"),
        (p2, "Bash"),
    ]
    assert effects[0].summary == "fetched https://h/p"
    # From the last turn: only its own; from the first: the first turn's call too.
    assert [e.tool for e in collect(view, view.resolve(p2))] == ["mcp__db__drop"]
    assert [e.tool for e in collect(view, view.resolve(p0))][:1] == ["mcp__mail__send"]


def test_collect_reads_no_line_of_a_turn_without_side_effects(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    append(
        path, prompt_entry(_uid(1), None, "one"), _call(_uid(2), _uid(1), ("t", "Write", {"file_path": "a"}))
    )
    index = TranscriptIndex(path)
    index.refresh()
    view = index.view()
    # The line now names an MCP tool (same length, same offsets): reading it would list a call.
    path.write_bytes(path.read_bytes().replace(b'"name": "Write"', b'"name": "mcp__"'))
    assert b"mcp__" in path.read_bytes()
    assert collect(view, view.resolve(_uid(1))) == ()


def test_a_result_lists_at_most_the_bound(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    append(path, prompt_entry(_uid(1), None, "many"))
    parent = _uid(1)
    for i in range(MAX_SIDE_EFFECTS + 5):
        append(path, _call(_uid(100 + i), parent, (f"t{i}", "WebSearch", {"query": str(i)})))
        parent = _uid(100 + i)
    index = TranscriptIndex(path)
    index.refresh()
    view = index.view()
    effects = collect(view, view.resolve(_uid(1)))
    assert len(effects) == MAX_SIDE_EFFECTS
    assert effects[0].summary == "searched the web for “0”"
