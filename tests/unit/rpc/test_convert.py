"""Paging tokens (AIP-158): opaque, versioned offsets, refused when not issued by the service."""

from __future__ import annotations

import base64
import json

import pytest

from agent_rewind.errors import InvalidArgument
from agent_rewind.rpc.convert import next_page_token, page_bounds


def _token(data: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode()


def _raw_token(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode()


def test_first_page_uses_the_default_size() -> None:
    assert page_bounds(0, "", default=50) == (0, 50)


def test_page_size_is_taken_when_given() -> None:
    assert page_bounds(7, "", default=50) == (0, 7)


def test_page_size_is_capped_at_1000() -> None:
    assert page_bounds(5000, "", default=50) == (0, 1000)
    assert page_bounds(1000, "", default=50) == (0, 1000)


def test_negative_page_size_is_refused() -> None:
    with pytest.raises(InvalidArgument) as caught:
        page_bounds(-1, "", default=50)
    assert caught.value.field == "page_size"


def test_tokens_round_trip_through_every_page() -> None:
    total, size = 25, 10
    offsets, token = [], ""
    while True:
        offset, got = page_bounds(size, token, default=50)
        assert got == size
        offsets.append(offset)
        token = next_page_token(offset, got, total)
        if not token:
            break
    assert offsets == [0, 10, 20]


def test_last_page_has_no_next_token() -> None:
    assert next_page_token(20, 10, 25) == ""
    assert next_page_token(0, 10, 10) == ""
    assert next_page_token(0, 10, 0) == ""


def test_token_is_opaque_url_safe_text() -> None:
    token = next_page_token(0, 10, 25)
    assert token
    assert "10" not in token  # not a bare offset
    assert all(c.isalnum() or c in "-_=" for c in token)


@pytest.mark.parametrize(
    "token",
    [
        "garbage!",
        "not-base64-at-all",
        _raw_token("not json"),
        _raw_token("[1, 2]"),
        _raw_token('"o"'),
        _raw_token("1"),
        _token({"v": 2, "o": 10}),
        _token({"o": 10}),
        _token({"v": 1}),
        _token({"v": 1, "o": -5}),
        _token({"v": 1, "o": "ten"}),
        _token({"v": 1, "o": None}),
    ],
)
def test_a_token_the_service_did_not_issue_is_refused(token: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        page_bounds(10, token, default=50)
    assert caught.value.field == "page_token"


def test_a_token_with_an_infinite_offset_is_refused_as_invalid_argument() -> None:
    # json.loads reads 1e999 as inf, and int(inf) raises OverflowError, which page_bounds does not
    # catch: the caller would get INTERNAL instead of INVALID_ARGUMENT for a garbage token.
    token = _raw_token('{"v": 1, "o": 1e999}')
    with pytest.raises(InvalidArgument) as caught:
        page_bounds(10, token, default=50)
    assert caught.value.field == "page_token"
