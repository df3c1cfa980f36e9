"""Property tests: whatever a caller sends, or the agent gets written into a transcript, ends in a
clean error naming the field or a right answer, never an unexpected exception (INTERNAL).

`make test` runs a bounded number of examples per property; `make fuzz` at least 10,000.
"""

from __future__ import annotations

import contextlib
import json
import string
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import event, given
from hypothesis import strategies as st

from agent_rewind.errors import InvalidArgument, MessageNotFound, NotARewindPoint
from agent_rewind.rpc.requests import PageTokens, optional_uuid, page_size, prompt_text, uuid_field
from agent_rewind.sessions import commands
from agent_rewind.sessions.options import ALLOWED, OperatorOptions, validate
from agent_rewind.transcript.index import TranscriptIndex
from tests import hypothesis_profiles  # noqa: F401 - loads the profile

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=30,
)
TOKENS = PageTokens(b"k" * 32)


@given(st.text(max_size=600))
def test_any_page_token_is_a_position_or_invalid_argument(token: str) -> None:
    try:
        position = TOKENS.position(token, "sessions")
    except InvalidArgument as err:
        assert err.field == "page_token"
        return
    assert position is None and token == ""


@given(st.dictionaries(st.text(max_size=5), JSON, max_size=4), st.text(max_size=20))
def test_an_issued_token_round_trips_and_no_other_list_accepts_it(
    position: dict[str, Any], scope: str
) -> None:
    token = TOKENS.issue(scope, position)
    try:
        assert TOKENS.position(token, scope) == json.loads(json.dumps(position))
    except InvalidArgument:
        assert len(token) > 512  # only a position too large to carry
    try:
        TOKENS.position(token, scope + "x")
    except InvalidArgument as err:
        assert err.field == "page_token"
    else:
        raise AssertionError("a token was accepted for another list")


@given(st.text())
def test_any_id_is_a_canonical_uuid_or_invalid_argument(value: str) -> None:
    try:
        canonical = uuid_field("request_id", value)
    except InvalidArgument as err:
        # The value is cut: at most 64 characters, each at most 10 once escaped.
        assert err.field == "request_id" and len(err.message) < 64 * 10 + 100
        return
    assert canonical == uuid_field("session_id", canonical) and len(canonical) == 36
    assert optional_uuid("request_id", value) == canonical


@given(st.integers())
def test_any_page_size_is_clamped_or_invalid_argument(size: int) -> None:
    try:
        got = page_size(size, default=50)
    except InvalidArgument as err:
        assert size < 0 and err.field == "page_size"
        return
    assert 1 <= got <= 1000


@given(st.dictionaries(st.sampled_from(sorted(ALLOWED)) | st.text(max_size=15), JSON, max_size=6))
def test_any_options_are_checked_or_refused_naming_the_field(options: dict[str, Any]) -> None:
    try:
        checked = validate(options, OperatorOptions(mcp_hosts=frozenset({"mcp.example.com"})))
    except InvalidArgument as err:  # OptionNotAllowed is one
        assert err.field.startswith("options")
        return
    assert set(checked) <= set(ALLOWED) and None not in checked.values()
    json.dumps(checked)


@given(
    st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=2000)
    | st.just("\x00")
    | st.just("/cost x")
)
def test_any_prompt_text_is_accepted_or_invalid_argument_naming_text(text: str) -> None:
    try:
        prompt_text(text)
        commands.check_prompt(text)
    except InvalidArgument as err:
        assert err.field == "text"


LINES = st.one_of(
    st.binary(max_size=300),
    JSON.map(lambda v: json.dumps(v).encode()),
    st.builds(
        lambda kind, uid, parent, content: json.dumps(
            {
                "type": kind,
                "uuid": uid,
                "parentUuid": parent,
                "message": {"role": kind, "content": content},
                "promptSource": "sdk",
            }
        ).encode(),
        st.sampled_from(
            ["user", "assistant", "system", "attachment", "file-history-snapshot", "file-history-delta"]
        ),
        st.sampled_from(["a", "b", "c", "00000000-0000-0000-0000-000000000001", ""]),
        st.sampled_from(["a", "b", "c", None, "zzz"]),
        JSON,
    ),
    st.integers(1, 3000).map(lambda n: b"[" * n + b"]" * n),  # absurdly nested
    st.just(b'{"type":"user","uuid":"x","message":{"content":"' + b"x" * 100_000 + b'"}}'),  # huge
)
IDS = st.sampled_from(["a", "b", "c", "msg_1", "00000000-0000-0000-0000-000000000001", "", "not an id"])


@given(st.lists(LINES, max_size=25), st.booleans(), st.lists(IDS, max_size=4))
def test_any_transcript_reads_without_an_unexpected_error(
    lines: list[bytes], truncated: bool, lookups: list[str]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.jsonl"
        data = b"\n".join(lines) + (b"" if truncated else b"\n")
        path.write_bytes(data)
        index = TranscriptIndex(path)
        index.refresh()
        view = index.view()
        for point in view.points:
            assert point.message_id and point.index >= 0
        for message_id in lookups:
            with contextlib.suppress(InvalidArgument, MessageNotFound, NotARewindPoint):
                view.resolve(message_id)
            with contextlib.suppress(MessageNotFound):
                index.view(message_id)
        with path.open("ab") as f:  # the CLI appends, a partial last line completed later
            f.write(b'{"type":"user"' + string.ascii_letters[:3].encode())
        index.refresh()
        index.view()


# --- URLs: the host checked is the host the CLI connects to ------------------------------------


class _WhatwgUrl:
    """Node's own `URL` (the WHATWG parser the CLI's runtime uses), one process for the module."""

    SCRIPT = (
        "const rl = require('readline').createInterface({input: process.stdin});"
        "rl.on('line', (line) => { let out;"
        " try { const u = new URL(JSON.parse(line));"
        "   out = {host: u.hostname, port: u.port, protocol: u.protocol, user: u.username + u.password}; }"
        " catch (e) { out = null; }"
        " process.stdout.write(JSON.stringify(out) + '\\n'); });"
    )

    def __init__(self) -> None:
        import subprocess

        self._node = subprocess.Popen(
            ["node", "-e", self.SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )

    def parse(self, url: str) -> dict[str, str] | None:
        assert self._node.stdin is not None and self._node.stdout is not None
        self._node.stdin.write(json.dumps(url) + "\n")
        self._node.stdin.flush()
        parsed: dict[str, str] | None = json.loads(self._node.stdout.readline())
        return parsed


_WHATWG: list[_WhatwgUrl] = []


def _whatwg() -> _WhatwgUrl:
    if not _WHATWG:
        _WHATWG.append(_WhatwgUrl())
    return _WHATWG[0]


def _connects_to(parsed: dict[str, str]) -> tuple[str, int]:
    host = parsed["host"].strip("[]").rstrip(".").lower()
    port = int(parsed["port"]) if parsed["port"] else {"http:": 80, "https:": 443}.get(parsed["protocol"], 0)
    return host, port


ALLOWED_HOST = "allowed.example"
_PIECES = st.sampled_from(
    [
        "allowed.example",
        "ALLOWED.example.",
        "127.0.0.1",
        "127.1",
        "0x7f.1",
        "2130706433",
        "0177.0.0.1",
        "[::1]",
        "[::ffff:127.0.0.1]",
        "localhost",
        "evil.example",
        "xn--bcher-kva.example",
        "bücher.example",
        "@",
        ":",
        "\\",
        "/",
        "?",
        "#",
        "%",
        "%2f",
        "%40",
        "%5c",
        "\t",
        "\n",
        " ",
        "\x00",
        ".",
        "..",
        "443",
        "8080",
        "9",
        "0",
        "65536",
        "080",
        "user",
        "user:pw@",
        "[",
        "]",
        "http:",
        "https:",
        "//",
        "ß",
        "\u3002",
    ]
)


_HOSTS = st.sampled_from(
    [
        "allowed.example",
        "ALLOWED.Example",
        "allowed.example.",
        "127.0.0.1",
        "127.1",
        "0x7f.0.0.1",
        "[::1]",
        "evil.example",
    ]
)


@st.composite
def _urls(draw: st.DrawFn) -> str:
    """URLs shaped like real ones (a scheme, a host, perhaps a port, a path), with hostile pieces
    put anywhere: the cases where parsers part ways; and a quarter of them made of pieces alone."""
    if draw(st.integers(0, 3)) == 0:
        scheme = draw(
            st.sampled_from(["http://", "https://", "HTTP://", "ftp://", "http:", "http:/", "http:\\\\"])
        )
        return scheme + "".join(draw(st.lists(_PIECES | st.text(max_size=4), max_size=7)))
    scheme = draw(st.sampled_from(["http://", "https://", "HTTPS://"]))
    port = draw(st.sampled_from(["", ":9", ":443", ":80", ":8080", ":09", ":", ":65536"]))
    path = draw(st.sampled_from(["", "/", "/mcp", "/a?b=c", "?q", "/%2e%2e/x", "/@x"]))
    text = scheme + draw(_HOSTS) + port + path
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(_PIECES) + text[at:]
    return text


@given(_urls())
def test_an_accepted_mcp_url_names_to_the_cli_the_very_host_that_was_allowed(text: str) -> None:
    """Node's URL is the oracle: what the CLI would connect to for the URL it is given."""
    from agent_rewind.errors import OptionNotAllowed
    from agent_rewind.sessions.urls import UrlRefused, check_url

    operator = OperatorOptions(mcp_hosts=frozenset({ALLOWED_HOST, "127.0.0.1:9"}))
    try:
        checked = validate({"mcp_servers": {"s": {"type": "http", "url": text}}}, operator)
    except (InvalidArgument, OptionNotAllowed) as err:
        assert err.field.startswith("options.mcp_servers.s")
        event("refused")
        return
    event("accepted")
    url = checked["mcp_servers"]["s"]["url"]
    passed_on = _whatwg().parse(url)
    assert passed_on is not None, f"{url!r} (from {text!r}) is not a URL to the CLI"
    assert passed_on["user"] == "", url
    host, port = _connects_to(passed_on)
    assert host == ALLOWED_HOST or (host, port) == ("127.0.0.1", 9), (text, url, passed_on)
    # What was given reads the same to the CLI too: nothing accepted that two parsers disagree on.
    given_text = _whatwg().parse(text)
    assert given_text is not None and _connects_to(given_text) == (host, port), (text, given_text)
    try:
        again = check_url(url)
    except UrlRefused as err:
        raise AssertionError(f"the canonical form {url!r} is refused: {err}") from None
    assert again.url == url, "canonical forms are fixed points"
