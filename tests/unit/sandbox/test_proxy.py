"""The egress proxy lets a session's commands reach the allowed hosts and nothing else."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from agent_rewind.sandbox.proxy import (
    MAX_CONNECTIONS_PER_SESSION,
    EgressProxy,
    HostPattern,
    HostPatternError,
    _target,
    allowed,
    covers,
    normalize_host,
)

# --- host patterns ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "host", "port", "wildcard"),
    [
        ("pypi.org", "pypi.org", None, False),
        ("PyPI.org.", "pypi.org", None, False),
        ("pypi.org:8443", "pypi.org", 8443, False),
        ("*.example.com", "example.com", None, True),
        ("127.0.0.1:9000", "127.0.0.1", 9000, False),
        ("[::1]:9000", "::1", 9000, False),
        ("xn--bcher-kva.example", "xn--bcher-kva.example", None, False),
    ],
)
def test_a_pattern_is_read_in_its_canonical_form(
    text: str, host: str, port: int | None, wildcard: bool
) -> None:
    assert HostPattern.parse(text) == HostPattern(host, port, wildcard)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "http://pypi.org",
        "pypi.org/simple",
        "user@pypi.org",
        "pypi.org:0",
        "pypi.org:99999",
        "pypi.org:x",
        "*.127.0.0.1",
        "a b",
        "pypi.org\\@evil",
        "0x7f.1",
        "127.1",
        "[::1",
        "bücher.example",
    ],
)
def test_anything_else_is_refused(text: str) -> None:
    with pytest.raises(HostPatternError):
        HostPattern.parse(text)


def test_a_bare_host_allows_its_web_ports_only() -> None:
    patterns = [HostPattern.parse("pypi.org")]
    assert allowed(patterns, "pypi.org", 443) and allowed(patterns, "PYPI.ORG.", 80)
    assert not allowed(patterns, "pypi.org", 22)
    assert not allowed(patterns, "files.pypi.org", 443)
    assert not allowed(patterns, "pypi.org.evil.example", 443)


def test_a_wildcard_allows_subdomains_not_the_domain_or_look_alikes() -> None:
    patterns = [HostPattern.parse("*.example.com")]
    assert allowed(patterns, "api.example.com", 443) and allowed(patterns, "a.b.example.com", 443)
    assert not allowed(patterns, "example.com", 443)
    assert not allowed(patterns, "evilexample.com", 443)


def test_numbers_that_a_resolver_may_read_as_addresses_are_not_host_names() -> None:
    assert normalize_host("127.1") is None and normalize_host("2130706433") is None
    assert normalize_host("0177.0.0.1") is None
    assert not allowed([HostPattern.parse("localhost:9")], "127.0.0.1", 9)


def test_covers_is_true_only_for_a_narrower_list() -> None:
    server = [HostPattern.parse("*.example.com"), HostPattern.parse("pypi.org")]
    assert covers(server, HostPattern.parse("api.example.com"))
    assert covers(server, HostPattern.parse("*.api.example.com"))
    assert covers(server, HostPattern.parse("pypi.org:443"))
    assert not covers(server, HostPattern.parse("example.com"))
    assert not covers(server, HostPattern.parse("pypi.org:8080"))
    assert not covers(server, HostPattern.parse("*.org"))


# --- the proxy, with a real upstream and a real client over its socket ---------------------------


async def _upstream() -> tuple[asyncio.AbstractServer, int, list[bytes]]:
    seen: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], seen


@pytest.fixture
async def proxy_and_upstream(
    tmp_path: Path,
) -> AsyncIterator[tuple[EgressProxy, int, list[bytes], list[tuple[str, str, int]]]]:
    upstream, port, seen = await _upstream()
    reached: list[tuple[str, str, int]] = []
    proxy = EgressProxy(
        tmp_path / "p.sock",
        [HostPattern.parse(f"127.0.0.1:{port}")],
        reached=lambda s, h, p: reached.append((s, h, p)),
    )
    await proxy.start()
    try:
        yield proxy, port, seen, reached
    finally:
        await proxy.close()
        upstream.close()
        await upstream.wait_closed()


async def _ask(proxy: EgressProxy, request: str) -> str:
    reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
    writer.write(request.encode())
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return data.decode()


def _auth(proxy: EgressProxy, session: str) -> str:
    token = base64.b64encode(f"{session}:{proxy.credential(session)}".encode()).decode()
    return f"Proxy-Authorization: Basic {token}\r\n"


async def test_an_allowed_host_is_reached_with_the_request_in_origin_form(proxy_and_upstream) -> None:  # type: ignore[no-untyped-def]
    proxy, port, seen, reached = proxy_and_upstream
    answer = await _ask(
        proxy, f"GET http://127.0.0.1:{port}/a?b HTTP/1.1\r\nHost: x\r\n{_auth(proxy, 's1')}\r\n"
    )
    assert answer.startswith("HTTP/1.1 200") and answer.endswith("hello")
    assert seen[0].startswith(b"GET /a?b HTTP/1.1\r\n")
    assert b"proxy-authorization" not in seen[0].lower(), "the session's credential stays with the proxy"
    assert reached == [("s1", "127.0.0.1", port)]


async def test_connect_tunnels_to_an_allowed_host(proxy_and_upstream) -> None:  # type: ignore[no-untyped-def]
    proxy, port, _, _ = proxy_and_upstream
    reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
    writer.write(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n{_auth(proxy, 's1')}\r\n".encode())
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    writer.write(b"GET / HTTP/1.1\r\n\r\n")
    assert (await asyncio.wait_for(reader.read(), 10)).endswith(b"hello")
    writer.close()


@pytest.mark.parametrize(
    ("request_line", "status"),
    [
        ("CONNECT 127.0.0.1:{other} HTTP/1.1", "403"),  # another port of an allowed host
        ("CONNECT localhost:{port} HTTP/1.1", "403"),  # the same address by another name
        ("GET http://127.0.0.1:{port}\\@evil.example/ HTTP/1.1", "400"),  # userinfo: refused
        ("GET http://2130706433:{port}/ HTTP/1.1", "403"),  # a number a resolver reads as 127.0.0.1
        ("GET /relative HTTP/1.1", "400"),
        ("CONNECT 127.0.0.1 HTTP/1.1", "400"),
    ],
)
async def test_everything_else_is_refused_before_a_byte_leaves(  # type: ignore[no-untyped-def]
    proxy_and_upstream, request_line: str, status: str
) -> None:
    proxy, port, seen, reached = proxy_and_upstream
    line = request_line.format(port=port, other=port + 1)
    answer = await _ask(proxy, f"{line}\r\n{_auth(proxy, 's1')}\r\n")
    assert answer.startswith(f"HTTP/1.1 {status}"), answer
    assert seen == [] and reached == []


async def test_no_credential_or_another_session_s_is_407(proxy_and_upstream) -> None:  # type: ignore[no-untyped-def]
    proxy, port, seen, _ = proxy_and_upstream
    assert (await _ask(proxy, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n")).startswith("HTTP/1.1 407")
    forged = base64.b64encode(f"s2:{proxy.credential('s1')}".encode()).decode()
    answer = await _ask(
        proxy, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nProxy-Authorization: Basic {forged}\r\n\r\n"
    )
    assert answer.startswith("HTTP/1.1 407")
    assert seen == []


async def test_a_session_s_narrower_list_is_honoured(proxy_and_upstream) -> None:  # type: ignore[no-untyped-def]
    proxy, port, _, _ = proxy_and_upstream
    proxy.narrow("s1", (HostPattern.parse("pypi.org"),))
    assert (await _ask(proxy, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n{_auth(proxy, 's1')}\r\n")).startswith(
        "HTTP/1.1 403"
    )
    proxy.narrow("s1", None)
    reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
    writer.write(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n{_auth(proxy, 's1')}\r\n".encode())
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    writer.close()


async def test_an_unreachable_allowed_host_is_502(tmp_path: Path) -> None:
    proxy = EgressProxy(tmp_path / "p.sock", [HostPattern.parse("127.0.0.1:1")])
    await proxy.start()
    try:
        answer = await _ask(proxy, f"CONNECT 127.0.0.1:1 HTTP/1.1\r\n{_auth(proxy, 's')}\r\n")
        assert answer.startswith("HTTP/1.1 502")
    finally:
        await proxy.close()


# --- covers, as a property: whatever a narrower pattern lets through, the server's list does ----

_LABELS = st.sampled_from(["a", "b", "evil", "example", "evilexample", "xample", "com", "org"])


def _pattern(domain: str, wildcard: bool, port: int | None) -> HostPattern | None:
    try:
        return HostPattern.parse(("*." if wildcard else "") + domain + (f":{port}" if port else ""))
    except HostPatternError:
        return None


_PATTERNS = st.builds(
    _pattern,
    st.lists(_LABELS, min_size=1, max_size=3).map(".".join),
    st.booleans(),
    st.sampled_from([None, 80, 443, 8080]),
).filter(lambda p: p is not None)


@example(
    server=[HostPattern.parse("*.example.com")], narrower=HostPattern.parse("*.evilexample.com"), sub="a"
)
@example(server=[HostPattern.parse("*.example.com")], narrower=HostPattern.parse("evilexample.com"), sub="a")
@given(server=st.lists(_PATTERNS, min_size=1, max_size=3), narrower=_PATTERNS, sub=_LABELS)
def test_a_pattern_the_server_s_list_covers_lets_through_nothing_the_list_does_not(
    server: list[HostPattern], narrower: HostPattern, sub: str
) -> None:
    """The slip of issue 37: `*.evilexample.com` accepted as narrower than `*.example.com`."""
    if not covers(server, narrower):
        return
    host = f"{sub}.{narrower.host}" if narrower.wildcard else narrower.host
    for port in [narrower.port] if narrower.port is not None else [80, 443]:
        assert allowed([narrower], host, port)
        assert allowed(server, host, port), (server, narrower, host, port)


async def test_closed_connections_are_counted_off_so_a_session_never_runs_out(proxy_and_upstream) -> None:  # type: ignore[no-untyped-def]
    """The slip of issue 37: a closed connection never counted off, so after 64 a session's
    commands got 429 forever."""
    proxy, port, _, _ = proxy_and_upstream
    request = f"GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: x\r\n{_auth(proxy, 's1')}\r\n"
    for i in range(MAX_CONNECTIONS_PER_SESSION + 8):
        answer = await _ask(proxy, request)
        assert answer.startswith("HTTP/1.1 200"), (i, answer[:60])


# --- the edges, each on both sides (mutation testing found them untested, issue 37) -------------


@pytest.mark.parametrize(("port", "ok"), [("0", False), ("1", True), ("65535", True), ("65536", False)])
def test_a_pattern_s_port_is_1_to_65535(port: str, ok: bool) -> None:
    if ok:
        assert HostPattern.parse(f"pypi.org:{port}").port == int(port)
    else:
        with pytest.raises(HostPatternError):
            HostPattern.parse(f"pypi.org:{port}")


def test_a_host_name_is_at_most_253_characters_of_labels_of_1_to_63() -> None:
    label = "a" * 63
    assert normalize_host(f"{label}.example") == f"{label}.example"
    assert normalize_host(f"{label}a.example") is None
    assert normalize_host("a..example") is None
    longest = ".".join(["a" * 61] * 4) + ".ab"  # 4 * 62 + 2 = 250, then the TLD
    assert len(longest) <= 253 and normalize_host(longest) == longest
    assert normalize_host(longest + "cdef") is None  # 254
    assert normalize_host("under_score.example") is None and normalize_host("bücher.example") is None


@pytest.mark.parametrize(
    ("line", "target"),
    [
        ("CONNECT pypi.org:443 HTTP/1.1", ("CONNECT", "pypi.org", 443)),
        ("CONNECT pypi.org:65535 HTTP/1.1", ("CONNECT", "pypi.org", 65535)),
        ("CONNECT pypi.org:65536 HTTP/1.1", None),
        ("CONNECT pypi.org:0 HTTP/1.1", None),
        ("CONNECT pypi.org HTTP/1.1", None),  # a tunnel names its port
        ("CONNECT [::1]:443 HTTP/1.1", ("CONNECT", "::1", 443)),
        ("CONNECT ::1:443 HTTP/1.1", None),  # an IPv6 address without brackets
        ("GET http://pypi.org/simple HTTP/1.1", ("GET", "pypi.org", 80)),
        ("GET http://pypi.org:8080/ HTTP/1.1", ("GET", "pypi.org", 8080)),
        ("GET https://pypi.org/ HTTP/1.1", None),  # plain HTTP only; TLS goes through CONNECT
        ("GET /relative HTTP/1.1", None),
    ],
)
def test_a_request_line_names_its_target_or_is_refused(
    line: str, target: tuple[str, str, int] | None
) -> None:
    found = _target(line)
    assert (found[:3] if found is not None else None) == target


async def test_a_session_has_64_connections_at_once_and_the_next_is_429(tmp_path: Path) -> None:
    """Held open by an upstream that answers nothing until told: the 64th is let through, the
    65th refused, and one closing makes room again."""
    release = asyncio.Event()
    opened = 0

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal opened
        opened += 1
        await release.wait()
        writer.close()

    upstream = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = upstream.sockets[0].getsockname()[1]
    proxy = EgressProxy(tmp_path / "p.sock", [HostPattern.parse(f"127.0.0.1:{port}")])
    await proxy.start()
    tunnels = []
    try:
        request = f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n{_auth(proxy, 's1')}\r\n".encode()
        for _ in range(MAX_CONNECTIONS_PER_SESSION):
            reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
            writer.write(request)
            assert (await reader.readline()).startswith(b"HTTP/1.1 200")
            tunnels.append(writer)
        refused = await _ask(proxy, request.decode())
        assert refused.startswith("HTTP/1.1 429"), refused[:40]
        reader, writer = await asyncio.open_unix_connection(str(proxy.socket_path))
        writer.write(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n{_auth(proxy, 's2')}\r\n".encode())
        tunnels.append(writer)
        assert (await reader.readline()).startswith(b"HTTP/1.1 200"), "another session's count is its own"
    finally:
        release.set()
        for writer in tunnels:
            writer.close()
        await proxy.close()
        upstream.close()
        await upstream.wait_closed()


def test_a_host_name_of_exactly_253_characters_is_one() -> None:
    exact = ".".join(["a" * 62] * 4) + ".b"  # 4 * 63 - 1 + 2 = 253
    assert len(exact) == 253 and normalize_host(exact) == exact


@pytest.mark.parametrize(
    "text",
    [
        "pypi .org",
        "pypi.org/",
        "a@pypi.org",
        "pypi.org?",
        "pypi.org#x",
        "pypi\\org",
        # An IPv6 scope id is any text to the address parser: only the pattern's own check keeps
        # these characters out of one.
        "[fe80::1%x@evil.example]",
        "[fe80::1%a b]:443",
        "[fe80::1%a?b]",
        "[fe80::1%a#b]",
        "[fe80::1%a\\b]",
    ],
)
def test_a_pattern_with_a_character_a_url_would_read_otherwise_is_refused(text: str) -> None:
    with pytest.raises(HostPatternError):
        HostPattern.parse(text)


@pytest.mark.parametrize(
    "line",
    [
        "CONNECT [::1:443 HTTP/1.1",  # a bracket left open
        "CONNECT pypi.org:443 HTTP/1.1 extra",
        "CONNECT pypi.org:443",
        "CONNECT pypi.org:443 SPDY/3",
        "GET http://[::1/ HTTP/1.1",
        "GET http://:80/ HTTP/1.1",  # no host
        "CONNECT :443 HTTP/1.1",  # no host, a port
        "CONNECT []:443 HTTP/1.1",
        "GET http://user@pypi.org/ HTTP/1.1",  # userinfo: two parsers could read two hosts
        "GET http://pypi.org:x/ HTTP/1.1",
    ],
)
def test_a_malformed_request_line_names_no_target(line: str) -> None:
    assert _target(line) is None


async def test_a_request_without_the_session_s_credential_is_asked_for_one(proxy_and_upstream) -> None:  # type: ignore[no-untyped-def]
    proxy, port, _, _ = proxy_and_upstream
    answer = await _ask(proxy, f"GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: x\r\n\r\n")
    head = answer.split("\r\n\r\n")[0]
    assert (
        head.startswith("HTTP/1.1 407") and 'Proxy-Authenticate: Basic realm="agent-rewind sandbox"' in head
    )


async def test_a_head_past_its_bound_is_refused_before_anything_is_sent(proxy_and_upstream) -> None:  # type: ignore[no-untyped-def]
    proxy, port, seen, reached = proxy_and_upstream
    padding = "X-Pad: " + "p" * (16 * 1024) + "\r\n"
    answer = await _ask(proxy, f"GET http://127.0.0.1:{port}/ HTTP/1.1\r\n{_auth(proxy, 's1')}{padding}\r\n")
    assert not answer.startswith("HTTP/1.1 200") and seen == [] and reached == []


def test_a_session_s_proxy_url_carries_its_own_credential() -> None:
    proxy = EgressProxy(Path("/nonexistent/p.sock"), [])
    url = proxy.url("s1")
    assert url == f"http://s1:{proxy.credential('s1')}@127.0.0.1:3128"
    assert proxy.credential("s1") != proxy.credential("s2")


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("PyPI.org.", "pypi.org"),
        ("pypi.org:8443", "pypi.org:8443"),
        ("*.Example.com", "*.example.com"),
        ("*.example.com:8080", "*.example.com:8080"),
        ("127.0.0.1:9000", "127.0.0.1:9000"),
        ("[::1]:9000", "[::1]:9000"),
        ("[0:0::1]", "[::1]"),
    ],
)
def test_a_pattern_is_shown_in_its_canonical_form_which_reads_back_the_same(text: str, shown: str) -> None:
    """What the server logs as its allowed hosts at start, and what an operator may paste back."""
    pattern = HostPattern.parse(text)
    assert str(pattern) == shown
    assert HostPattern.parse(shown) == pattern


def test_a_bracket_left_open_is_named_in_the_refusal() -> None:
    with pytest.raises(HostPatternError, match="in brackets"):
        HostPattern.parse("[::1:443")


async def test_the_socket_s_directories_are_made_and_only_its_owner_may_connect(tmp_path: Path) -> None:
    """The proxy's socket may sit in a state directory that does not exist yet, two levels deep."""
    proxy = EgressProxy(tmp_path / "state" / "run" / "p.sock", [])
    await proxy.start()
    try:
        assert proxy.socket_path.is_socket()
        assert proxy.socket_path.stat().st_mode & 0o777 == 0o600
    finally:
        await proxy.close()
    assert not proxy.socket_path.exists()


async def test_a_credential_that_is_not_strict_base64_is_refused(proxy_and_upstream) -> None:  # type: ignore[no-untyped-def]
    """A token with a character outside base64's alphabet is not read by skipping it: what the
    proxy takes as the session is what the client sent, byte for byte."""
    proxy, port, seen, reached = proxy_and_upstream
    token = base64.b64encode(f"s1:{proxy.credential('s1')}".encode()).decode()
    for bad in (token[:8] + "*" + token[8:], token[:8] + "\n" + token[8:]):
        answer = await _ask(
            proxy, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nProxy-Authorization: Basic {bad}\r\n\r\n"
        )
        assert answer.startswith("HTTP/1.1 407"), answer[:40]
    assert seen == [] and reached == []


async def test_only_a_missing_credential_is_answered_with_a_request_for_one(proxy_and_upstream) -> None:  # type: ignore[no-untyped-def]
    """403, 400 and 502 ask for no credential: a client that has one would only send it again."""
    proxy, port, _, _ = proxy_and_upstream
    for line in (f"CONNECT 127.0.0.1:{port + 1} HTTP/1.1", "GET /relative HTTP/1.1"):
        answer = await _ask(proxy, f"{line}\r\n{_auth(proxy, 's1')}\r\n")
        assert answer.startswith(("HTTP/1.1 403", "HTTP/1.1 400")), answer[:40]
        assert "proxy-authenticate" not in answer.lower()


async def test_a_head_of_exactly_its_bound_is_read_and_one_byte_more_is_not(proxy_and_upstream) -> None:  # type: ignore[no-untyped-def]
    proxy, port, seen, _ = proxy_and_upstream
    start = f"GET http://127.0.0.1:{port}/ HTTP/1.1\r\n{_auth(proxy, 's1')}X-Pad: "
    pad = 16 * 1024 - len(start) - len("\r\n\r\n")
    exact = start + "p" * pad + "\r\n\r\n"
    assert len(exact) == 16 * 1024
    assert (await _ask(proxy, exact)).startswith("HTTP/1.1 200")
    over = start + "p" * (pad + 1) + "\r\n\r\n"
    assert not (await _ask(proxy, over)).startswith("HTTP/1.1 200")
    assert len(seen) == 1
