"""The egress proxy: the only way out of the command sandbox, to the hosts the operator allows.

Commands in the sandbox have no network but their own loopback, where socat bridges
127.0.0.1:3128 to this proxy's Unix socket (sandbox/commands.py). It speaks HTTP proxying, both
forms clients use: `CONNECT host:port` (HTTPS and any TLS), and a request with an absolute URI
(plain HTTP). Each session's commands carry the session's credential (`Proxy-Authorization`,
from the proxy URL in their environment); the proxy lets a connection through only to a host the
session may reach (`--sandbox-allow-host`, narrowed by the session's own option), and tells the
service about each one it opened (a side effect no rewind undoes). Everything else is refused with
an HTTP status before any byte reaches another host: no credential (407), a host not allowed
(403), a host that cannot be reached (502).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import ipaddress
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

_MAX_HEAD = 16 * 1024
_CONNECT_TIMEOUT = 10.0
_HEAD_TIMEOUT = 30.0
# Connections one session's commands may hold open through the proxy at once.
MAX_CONNECTIONS_PER_SESSION = 64
_DEFAULT_PORTS = frozenset({80, 443})


class HostPatternError(ValueError):
    """A --sandbox-allow-host value that is not a host, host:port or *.domain[:port]."""


@dataclass(frozen=True)  # gremlin: pardon[equivalent] nothing assigns to or hashes one
class HostPattern:
    """`host`, `host:port` or `*.domain[:port]`; without a port, ports 80 and 443."""

    host: str
    port: int | None = None
    wildcard: bool = False  # gremlin: pardon[equivalent] every pattern is made by parse, which passes it

    @classmethod
    def parse(cls, text: str) -> HostPattern:
        raw = text.strip()
        if not raw or any(c.isspace() or c in "/@?#\\" for c in raw):
            raise HostPatternError(f"{text!r} is not a host, host:port or *.domain")
        port: int | None = None
        host = raw
        if raw.startswith("["):  # [v6]:port
            end = raw.find("]")
            if end < 0:
                raise HostPatternError(f"{text!r}: an IPv6 address goes in brackets")
            host, rest = raw[1:end], raw[end + 1 :]
            if rest:
                if not rest.startswith(":"):
                    raise HostPatternError(f"{text!r} is not a host, host:port or *.domain")
                port = _port(text, rest[1:])
        elif raw.count(":") == 1:
            host, _, p = raw.partition(":")
            port = _port(text, p)
        wildcard = host.startswith("*.")
        name = normalize_host(host[2:] if wildcard else host)
        if name is None or (wildcard and _is_ip(name)):
            raise HostPatternError(f"{text!r} is not a host, host:port or *.domain")
        return cls(name, port, wildcard)

    def matches(self, host: str, port: int) -> bool:
        if self.port is None and port not in _DEFAULT_PORTS:
            return False  # gremlin: pardon[equivalent] None is as false: callers use only its truth (any, if)
        if self.port is not None and port != self.port:
            return False  # gremlin: pardon[equivalent] None is as false: callers use only its truth (any, if)
        if self.wildcard:
            return host.endswith("." + self.host)
        return host == self.host

    def __str__(self) -> str:
        host = f"*.{self.host}" if self.wildcard else (f"[{self.host}]" if ":" in self.host else self.host)
        return f"{host}:{self.port}" if self.port is not None else host


def _port(text: str, value: str) -> int:
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise HostPatternError(f"{text!r}: {value!r} is not a port")
    return int(value)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False  # gremlin: pardon[equivalent] None is as false: its one caller uses only its truth
    return True


def normalize_host(host: str) -> str | None:
    """A host name as it is compared: lower case, no trailing dot; an IP address in its canonical
    form. None when it is neither, and for a name that is not ASCII (IDNA2003 and UTS 46 encode
    some letters differently: an international name is given in its xn-- form)."""
    host = host.strip().rstrip(".")
    if not host or not host.isascii():
        return None
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    ascii_host = host.lower()
    labels = ascii_host.split(".")
    if len(ascii_host) > 253 or not all(
        0 < len(label) <= 63 and all(c.isalnum() or c == "-" for c in label) for label in labels
    ):
        return None
    if labels[-1].isdigit():  # 127.1, 0x7f.1 and the like: numbers a resolver may take as IPs
        return None
    return ascii_host


def covers(patterns: Iterable[HostPattern], narrower: HostPattern) -> bool:
    """Whether every host and port `narrower` matches is matched by one of `patterns`."""
    ports = (narrower.port,) if narrower.port is not None else tuple(sorted(_DEFAULT_PORTS))
    for pattern in patterns:
        if pattern.port is not None and ports != (pattern.port,):
            continue
        if pattern.port is None and not set(ports) <= _DEFAULT_PORTS:
            continue
        if not narrower.wildcard and pattern.matches(narrower.host, ports[0]):
            return True
        if (
            narrower.wildcard
            and pattern.wildcard
            and (narrower.host == pattern.host or narrower.host.endswith("." + pattern.host))
        ):
            return True
    return False  # gremlin: pardon[equivalent] None is as false: callers use only its truth (if not covers)


def allowed(patterns: Iterable[HostPattern], host: str, port: int) -> bool:
    name = normalize_host(host)
    return name is not None and any(p.matches(name, port) for p in patterns)


Reached = Callable[[str, str, int], None]


class EgressProxy:
    """One per server, on a Unix socket; each session's commands authenticate as that session."""

    def __init__(
        self,
        socket_path: Path,
        patterns: Iterable[HostPattern],
        *,
        key: bytes | None = None,
        session_hosts: Callable[[str], tuple[HostPattern, ...] | None] | None = None,
        reached: Reached | None = None,
    ) -> None:
        self.socket_path = socket_path
        self.patterns = tuple(patterns)
        self._key = key or os.urandom(32)
        # A session's own, narrower lists (absent: the server's).
        self._narrowed: dict[str, tuple[HostPattern, ...]] = {}
        self._session_hosts = session_hosts or self._narrowed.get
        self._reached = reached
        self._server: asyncio.AbstractServer | None = None
        self._open: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def narrow(self, session_id: str, patterns: tuple[HostPattern, ...] | None) -> None:
        """The session's commands may reach only these of the server's hosts (None: all of them)."""
        if patterns is None:
            self._narrowed.pop(session_id, None)
        else:
            self._narrowed[session_id] = patterns

    def credential(self, session_id: str) -> str:
        return hmac.new(self._key, session_id.encode(), hashlib.sha256).hexdigest()[:32]

    def url(self, session_id: str) -> str:
        """The proxy URL a session's commands use (inside the sandbox)."""
        from agent_rewind.sandbox.commands import PROXY_PORT

        return f"http://{session_id}:{self.credential(session_id)}@127.0.0.1:{PROXY_PORT}"

    async def start(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.socket_path))
        os.chmod(self.socket_path, 0o600)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    def _session(self, head: dict[str, str]) -> str | None:
        value = head.get("proxy-authorization", "")
        scheme, _, token = value.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            user, _, password = base64.b64decode(token, validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
        if user and hmac.compare_digest(password, self.credential(user)):
            return user
        return None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        session: str | None = None
        try:
            request = await asyncio.wait_for(_read_head(reader), _HEAD_TIMEOUT)
            if request is None:
                return
            line, headers, raw = request
            session = self._session(headers)
            if session is None:
                await _answer(writer, 407, "a session's proxy credential is needed", auth=True)
                return
            target = _target(line)
            if target is None:
                await _answer(writer, 400, "not a proxy request")
                return
            method, raw_host, port, forward = target
            # The host checked is the host connected to: its canonical form.
            host = normalize_host(raw_host) or ""
            hosts = self._session_hosts(session)
            if (
                not host
                or not allowed(self.patterns, host, port)
                or (hosts is not None and not allowed(hosts, host, port))
            ):
                log.info("sandbox egress refused", session_id=session, host=raw_host[:256], port=port)
                await _answer(writer, 403, f"{raw_host[:256]}:{port} is not a host this session may reach")
                return
            if self._open.get(session, 0) >= MAX_CONNECTIONS_PER_SESSION:
                await _answer(writer, 429, "too many connections through the proxy")
                return
            self._open[session] = self._open.get(session, 0) + 1
            try:
                await self._relay(session, reader, writer, method, host, port, forward, raw)
            finally:
                self._open[session] -= 1
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()
            if task is not None:
                self._tasks.discard(task)

    async def _relay(
        self,
        session: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        method: str,
        host: str,
        port: int,
        forward: bytes,
        raw: list[bytes],
    ) -> None:
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(host, port), _CONNECT_TIMEOUT
            )
        except (OSError, TimeoutError) as err:
            await _answer(writer, 502, f"{host}:{port} could not be reached ({type(err).__name__})")
            return
        log.info("sandbox egress", session_id=session, host=host, port=port)
        if self._reached is not None:
            self._reached(session, host, port)
        try:
            if method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                await writer.drain()
            else:
                # The request as the origin expects it: origin-form, without the proxy's headers.
                head = [forward] + [
                    h
                    for h in raw
                    if not h.lower().startswith((b"proxy-authorization:", b"proxy-connection:"))
                ]
                up_writer.write(b"\r\n".join(head) + b"\r\n\r\n")
            pipes = {
                asyncio.create_task(_pipe(reader, up_writer)),
                asyncio.create_task(_pipe(up_reader, writer)),
            }
            try:
                # Both directions to their end, or either failing ends the other.
                await asyncio.wait(pipes, return_when=asyncio.FIRST_EXCEPTION)
            finally:
                for pipe in pipes:
                    pipe.cancel()
                await asyncio.gather(*pipes, return_exceptions=True)
        finally:
            with contextlib.suppress(Exception):
                up_writer.close()


async def _read_head(reader: asyncio.StreamReader) -> tuple[str, dict[str, str], list[bytes]] | None:
    try:
        data = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        return None
    if len(data) > _MAX_HEAD:
        return None
    lines = data[:-4].split(b"\r\n")
    try:
        line = lines[0].decode("ascii")
    except UnicodeDecodeError:
        return None
    headers: dict[str, str] = {}
    for raw in lines[1:]:
        name, sep, value = raw.decode("latin-1").partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return line, headers, lines[1:]


def _target(line: str) -> tuple[str, str, int, bytes] | None:
    """(method, host, port, the request line to send on) of a proxy request line."""
    parts = line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        return None
    method, uri, version = parts
    if method == "CONNECT":
        host, port = _split_hostport(uri)
        return (method, host, port, b"") if host and port else None
    if not uri.lower().startswith("http://"):
        return None
    rest = uri[len("http://") :]
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        return None  # userinfo in a proxied URL: two parsers could disagree on the host
    host, port = _split_hostport(authority, default=80)
    if not host or not port:
        return None
    return method, host, port, f"{method} /{path if slash else ''} {version}".encode("latin-1")


def _split_hostport(authority: str, default: int | None = None) -> tuple[str, int]:
    """("host", port) of `host:port`, `[v6]:port` or (with a default port) `host`; ("", 0) else."""
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            return "", 0
        host, rest = authority[1:end], authority[end + 1 :]
    elif authority.count(":") == 1:
        host, _, port = authority.partition(":")
        rest = ":" + port
    elif ":" in authority:
        return "", 0  # an IPv6 address without brackets
    else:
        host, rest = authority, ""
    if not rest:
        return (host, default) if default else ("", 0)
    port = rest[1:]
    if rest[0] == ":" and port.isdigit() and 0 < int(port) < 65536:
        return host, int(port)
    return "", 0


async def _answer(writer: asyncio.StreamWriter, status: int, text: str, *, auth: bool = False) -> None:
    reasons = {400: "Bad Request", 403: "Forbidden", 407: "Proxy Authentication Required"}
    reasons |= {429: "Too Many Requests", 502: "Bad Gateway"}
    body = (text + "\n").encode()
    head = [f"HTTP/1.1 {status} {reasons.get(status, 'Error')}", f"Content-Length: {len(body)}"]
    head += ["Content-Type: text/plain; charset=utf-8", "Connection: close"]
    if auth:
        head.append('Proxy-Authenticate: Basic realm="agent-rewind sandbox"')
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    with contextlib.suppress(ConnectionError):
        await writer.drain()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copies one direction to its end, then half-closes the other side; raises on a failure."""
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    if writer.can_write_eof():
        writer.write_eof()
