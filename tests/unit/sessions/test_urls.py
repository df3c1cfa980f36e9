"""The URLs the service checks before the CLI uses them (sessions/urls.py): accepted only when no
two URL parsers can read them differently, and passed on in the canonical form of what was
checked. tests/unit/test_hostile_input.py checks the accepted ones against Node's own `URL`."""

from __future__ import annotations

import dataclasses

import pytest

from agent_rewind.sessions.urls import CheckedUrl, UrlMalformed, UrlRefused, check_url


def refused(text: str) -> UrlRefused:
    """A URL refused because parsers could read it differently (not a malformed one)."""
    with pytest.raises(UrlRefused) as caught:
        check_url(text)
    assert not isinstance(caught.value, UrlMalformed), (text, caught.value)
    return caught.value


def malformed(text: str) -> UrlMalformed:
    with pytest.raises(UrlMalformed) as caught:
        check_url(text)
    return caught.value


def test_a_url_is_checked_into_its_scheme_host_port_and_canonical_form() -> None:
    assert check_url("HTTPS://MCP.Example.com./mcp?x=1") == CheckedUrl(
        "https", "mcp.example.com", 443, False, "https://mcp.example.com/mcp?x=1"
    )
    assert check_url("http://mcp.example.com:8080/sse") == CheckedUrl(
        "http", "mcp.example.com", 8080, True, "http://mcp.example.com:8080/sse"
    )


def test_the_schemes_default_port_is_left_out_of_the_canonical_form() -> None:
    checked = check_url("http://mcp.example.com:80/x")
    assert (checked.port, checked.explicit_port, checked.url) == (80, True, "http://mcp.example.com/x")
    assert check_url("https://mcp.example.com:80/x").url == "https://mcp.example.com:80/x"


def test_a_url_without_a_path_gets_the_root_path() -> None:
    assert check_url("http://mcp.example.com").url == "http://mcp.example.com/"
    assert check_url("http://mcp.example.com?q=1").url == "http://mcp.example.com/?q=1"


def test_an_ipv6_address_goes_in_brackets_with_or_without_a_port() -> None:
    assert check_url("http://[::1]/mcp") == CheckedUrl("http", "::1", 80, False, "http://[::1]/mcp")
    assert check_url("http://[0:0::1]:9/").url == "http://[::1]:9/"
    assert check_url("http://127.0.0.1:9/").url == "http://127.0.0.1:9/", "an IPv4 address has none"
    for text in ("http://[::1/", "http://[::1"):
        assert "brackets" in str(malformed(text)), text
    assert "not a port" in str(malformed("http://[::1]x/"))
    assert "brackets" in str(malformed("http://::1/"))


def test_a_url_of_at_most_2048_characters_is_accepted() -> None:
    head = "http://mcp.example.com/"
    assert len(check_url(head + "a" * (2048 - len(head))).url) == 2048
    malformed(head + "a" * (2049 - len(head)))
    malformed("")


@pytest.mark.parametrize("text", ["mcp.example.com/mcp", "ftp://mcp.example.com/", "http:/mcp.example.com/"])
def test_anything_but_an_http_or_https_url_is_malformed(text: str) -> None:
    malformed(text)


@pytest.mark.parametrize(
    "text", ["http:///mcp", "http://?q", "http:///@x", "http:///%41", "http://127.1/", "http://a_b.example/"]
)
def test_a_url_without_a_host_name_or_ip_address_is_malformed(text: str) -> None:
    assert "not a host name" in str(malformed(text))


@pytest.mark.parametrize(("port", "ok"), [("0", False), ("1", True), ("65535", True), ("65536", False)])
def test_a_port_is_1_to_65535(port: str, ok: bool) -> None:
    text = f"http://mcp.example.com:{port}/"
    if ok:
        assert check_url(text).port == int(port)
    else:
        assert "not a port number" in str(malformed(text))


@pytest.mark.parametrize("port", ["", "abc", "+80", "123456"])
def test_a_port_that_is_not_a_number_is_malformed(port: str) -> None:
    assert "not a port number" in str(malformed(f"http://mcp.example.com:{port}/"))


def test_printable_ascii_is_accepted_up_to_the_tilde() -> None:
    assert check_url("http://mcp.example.com/~team/!x").url == "http://mcp.example.com/~team/!x"


@pytest.mark.parametrize(
    "text",
    [
        "http://mcp example.com/",
        "http://mcp.example.com/a b",
        "http://mcp.example.com/\x7f",
        "http://bücher.example/",
        "http://mcp.example.com/\t",
    ],
)
def test_spaces_controls_and_non_ascii_are_refused(text: str) -> None:
    assert "printable ASCII" in str(refused(text))


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("http://127.0.0.1:9\\@mcp.example.com/", "backslash"),
        ("http://mcp.example.com/#top", "fragment"),
        ("http://user@mcp.example.com/", "userinfo"),
        ("http://mcp%2eexample.com/", "percent-encode"),
        ("http://mcp.example.com/a<b", "path or query"),
        ("http://mcp.example.com/a|b", "path or query"),
        ("http://mcp.example.com/%zz", "percent-escape"),
        ("http://mcp.example.com/%4", "percent-escape"),
    ],
)
def test_what_url_parsers_read_differently_is_refused(text: str, why: str) -> None:
    assert why in str(refused(text))


def test_percent_escapes_in_the_path_and_query_are_kept() -> None:
    assert check_url("http://mcp.example.com/a%2Fb?q=%41").url == "http://mcp.example.com/a%2Fb?q=%41"


def test_what_was_checked_cannot_be_changed_afterwards() -> None:
    """The host allowed and the URL passed on stay the ones checked."""
    checked = check_url("https://mcp.example.com/mcp")
    with pytest.raises(dataclasses.FrozenInstanceError):
        checked.host = "evil.example"  # type: ignore[misc]
    assert checked.host == "mcp.example.com"
