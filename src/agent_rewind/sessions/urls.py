"""URLs the service checks before another program uses them: read the way that program reads them.

A remote MCP server's URL is checked against `--mcp-host` here and connected to by the CLI,
whose parser is the WHATWG URL standard's (Node's and Bun's `URL`). Python's `urlsplit` reads some
URLs otherwise: `http://127.0.0.1:9\\@allowed.example/` is `allowed.example` to it and
`127.0.0.1` to the CLI (a backslash ends the authority there). So this module accepts only URLs
that no two reasonable parsers can read differently, and passes on the canonical form of what it
checked, never the text it was given:

- printable ASCII only (no space, tab or newline, which WHATWG drops; no backslash, which it takes
  for a slash); `http` or `https`; no userinfo (`@` before the path), no `%` in the authority, no
  fragment;
- a host name in ASCII (an international name in its `xn--` form: IDNA2003 and UTS 46 disagree on
  some letters), or an IP address in its canonical form (numbers a resolver or WHATWG reads as an
  address, `127.1`, `0x7f.1`, `2130706433`, are refused as names);
- a port of 1 to 65535, or none.

tests/unit/test_hostile_input.py checks, with Node's own `URL`, that every URL accepted here names
to WHATWG the very host and port that were checked.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from agent_rewind.sandbox.proxy import normalize_host

_DEFAULT_PORTS = {"http": 80, "https": 443}
# What a path and query may hold: RFC 3986's unreserved, sub-delims, ':', '@', '/', '?' and
# percent-escapes; nothing WHATWG would rewrite or read as something else.
_PATH = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@/?%]*")
_PORT = re.compile(r"[0-9]{1,5}")


class UrlRefused(ValueError):
    """A URL this service does not pass on: one that URL parsers could read differently."""


class UrlMalformed(UrlRefused):
    """Not an http(s) URL at all (no host, a port that is not one)."""


@dataclass(frozen=True)
class CheckedUrl:
    scheme: str
    # Canonical: lower case, no trailing dot; an IPv6 address without brackets.
    host: str
    # The port connected to (the scheme's default when the URL names none).
    port: int
    explicit_port: bool
    # The URL to pass on: what was checked, spelled canonically.
    url: str


def check_url(text: str) -> CheckedUrl:
    """The canonical form of an http(s) URL, or UrlRefused."""
    if not text or len(text) > 2048:
        raise UrlMalformed("must be an http(s) URL of at most 2048 characters")
    scheme, sep, rest = text.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in _DEFAULT_PORTS:
        raise UrlMalformed("must be an http or https URL")
    if not all(" " < c <= "~" for c in text):
        raise UrlRefused("must be printable ASCII without spaces (an international host in its xn-- form)")
    if "\\" in text:
        raise UrlRefused("must not contain a backslash (URL parsers disagree on what it means)")
    if "#" in text:
        raise UrlRefused("must not have a fragment")
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    if "@" in authority:
        raise UrlRefused("must not carry a user name or password (userinfo)")
    if "%" in authority:
        raise UrlRefused("must not percent-encode its host or port")
    host_text, port_text = _split(authority)
    host = normalize_host(host_text)
    if host is None or (":" in host and not authority.startswith("[")):
        raise UrlMalformed(f"{host_text!r} is not a host name or IP address")
    if port_text is not None and (not _PORT.fullmatch(port_text) or not 0 < int(port_text) < 65536):
        raise UrlMalformed(f"{port_text!r} is not a port number (1 to 65535)")
    if not _PATH.fullmatch(tail) or (tail and tail[0] not in "/?"):
        raise UrlRefused("has characters in its path or query that URL parsers would rewrite")
    if re.search(r"%(?![0-9A-Fa-f]{2})", tail):
        raise UrlRefused("has a '%' that is not a percent-escape")
    default = _DEFAULT_PORTS[scheme]
    port = int(port_text) if port_text is not None else default
    shown = f"[{host}]" if _is_v6(host) else host
    url = f"{scheme}://{shown}{'' if port == default else f':{port}'}{tail if tail.startswith('/') else '/' + tail}"
    return CheckedUrl(scheme, host, port, port_text is not None, url)


def _split(authority: str) -> tuple[str, str | None]:
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            raise UrlMalformed("an IPv6 address goes in brackets")
        host, rest = authority[1:end], authority[end + 1 :]
        if rest and not rest.startswith(":"):
            raise UrlMalformed("has something after its IPv6 address that is not a port")
        return host, rest[1:] if rest else None
    host, sep, port = authority.partition(":")
    if ":" in port:
        raise UrlMalformed("an IPv6 address goes in brackets")
    return host, port if sep else None


def _is_v6(host: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address)
    except ValueError:
        return False
