"""Request checks shared by every servicer: required fields, UUIDs, page sizes and page tokens."""

from __future__ import annotations

import base64
import json

import pytest

from agent_rewind.errors import InvalidArgument
from agent_rewind.rpc.requests import (
    MAX_PROMPT_CHARS,
    PageTokens,
    optional_uuid,
    page_size,
    prompt_text,
    required,
    uuid_field,
)

KEY = b"k" * 32


def _refused(tokens: PageTokens, token: str, scope: str = "sessions") -> InvalidArgument:
    with pytest.raises(InvalidArgument) as caught:
        tokens.position(token, scope)
    assert caught.value.field == "page_token"
    return caught.value


def test_page_size_defaults_caps_and_refuses_negatives() -> None:
    assert page_size(0, default=50) == 50
    assert page_size(7, default=50) == 7
    assert page_size(5000, default=50) == 1000
    with pytest.raises(InvalidArgument) as caught:
        page_size(-1, default=50)
    assert caught.value.field == "page_size"


def test_required_and_uuid_fields_name_the_field() -> None:
    assert required("session_id", "x") == "x"
    with pytest.raises(InvalidArgument) as caught:
        required("session_id", "")
    assert caught.value.field == "session_id"
    assert uuid_field("request_id", "6F9619FF-8B86-D011-B42D-00C04FC964FF") == (
        "6f9619ff-8b86-d011-b42d-00c04fc964ff"
    )
    assert optional_uuid("request_id", "") is None
    with pytest.raises(InvalidArgument) as caught:
        uuid_field("request_id", "not-a-uuid" * 100)
    assert caught.value.field == "request_id" and len(caught.value.message) < 200


def test_a_token_carries_its_position_back() -> None:
    tokens = PageTokens(KEY)
    token = tokens.issue("points:s1", {"i": 100})
    assert tokens.position(token, "points:s1") == {"i": 100}
    assert tokens.position("", "points:s1") is None


def test_a_token_is_opaque_url_safe_text() -> None:
    token = PageTokens(KEY).issue(
        "sessions", {"t": "2026-11-30T10:00:00.000000+00:00", "s": "session-abcdef"}
    )
    assert all(c.isalnum() or c in "-_." for c in token)
    # (Markers long enough that the token's random bytes cannot spell them by chance.)
    assert "session-abcdef" not in token and "2026-11-30" not in token


def test_a_token_of_another_list_is_refused() -> None:
    tokens = PageTokens(KEY)
    _refused(tokens, tokens.issue("points:s1", {"i": 100}), scope="points:s2")
    _refused(tokens, tokens.issue("points:s1", {"i": 100}), scope="sessions")


def test_a_token_signed_with_another_key_is_refused() -> None:
    _refused(PageTokens(KEY), PageTokens(b"x" * 32).issue("sessions", {"i": 1}))


def test_any_change_to_a_token_is_refused() -> None:
    tokens = PageTokens(KEY)
    token = tokens.issue("sessions", {"t": "2026-11-30T10:00:00.000000+00:00", "s": "abc"})
    for i in range(len(token)):
        for replacement in "AZ_-.0":
            if token[i] != replacement:
                changed = token[:i] + replacement + token[i + 1 :]
                try:
                    got = tokens.position(changed, "sessions")
                except InvalidArgument:
                    continue
                # Base64 padding bits can absorb a change that decodes to the same bytes.
                assert got == tokens.position(token, "sessions"), changed


def _forged(data: str) -> str:
    body = base64.urlsafe_b64encode(data.encode()).decode().rstrip("=")
    return f"{body}.{'A' * 22}"


@pytest.mark.parametrize(
    "token",
    [
        "garbage!",
        "no-dot-at-all",
        "a.b.c",
        _forged(json.dumps({"o": True})),
        _forged("[" * 100_000 + "]" * 100_000),  # the old decoder recursed on this: INTERNAL
        _forged('{"i": 1e999}'),
        "x" * 10_000,
        "\u00e9\u00e9.\u00e9",
    ],
)
def test_tokens_the_service_did_not_issue_are_refused_without_being_parsed(token: str) -> None:
    _refused(PageTokens(KEY), token)


def test_a_short_key_is_refused() -> None:
    with pytest.raises(ValueError):
        PageTokens(b"short")


# Prompt text


def test_a_prompt_is_returned_as_given() -> None:
    assert prompt_text("  fix the bug\n") == "  fix the bug\n"
    assert prompt_text("x" * MAX_PROMPT_CHARS) == "x" * MAX_PROMPT_CHARS


@pytest.mark.parametrize(
    "text",
    ["", "   ", "\n\t", "x" * (MAX_PROMPT_CHARS + 1), "before\x00after"],
    ids=["empty", "blank", "whitespace", "too-long", "nul"],
)
def test_a_prompt_that_is_empty_too_long_or_has_a_nul_is_refused_naming_text(text: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        prompt_text(text)
    assert caught.value.field == "text"
