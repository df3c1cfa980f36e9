"""Which URLs are sent events, and whose events each is sent (`--webhook-url`, `--webhook-principal`).

Every URL is sent every event (an admin subscription) unless `--webhook-principal
PRINCIPAL=URL` names the principal it is for: it is then sent only the events of sessions that
principal may read, as a `WatchRewindEvents` of that principal would be (its own sessions, or all
of them for an admin; nothing if it lacks `events.read` or is not in the access file, which is
looked up again for every event, so a revocation takes effect without a restart). Checked at
start: a URL is http or https with a host, named once; a principal names a configured URL.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from agent_rewind.access import AccessFile, Permission, Principal
from agent_rewind.store.ledger import EventRecord


class SubscriptionError(ValueError):
    """A --webhook-url or --webhook-principal the service cannot use; the message says why."""


@dataclass(frozen=True)  # gremlin: pardon[equivalent] nothing assigns to or hashes one
class Subscription:
    url: str
    principal: str | None = None  # None: every event

    @property
    def shown(self) -> str:
        """The URL as logs and metrics show it: no user, password, query or fragment (which may
        hold a token)."""
        return shown(self.url)


def shown(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def subscriptions(urls: Sequence[str], principals: Sequence[str] = ()) -> list[Subscription]:
    seen: set[str] = set()
    for url in urls:
        parts = urlsplit(url)
        try:
            parts.port  # noqa: B018 - raises for a port that is not a number
        except ValueError:
            raise SubscriptionError(f"--webhook-url {shown(url)!r}: its port is not a number") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SubscriptionError(
                f"--webhook-url {shown(url)!r}: needs an http:// or https:// URL with a host"
            )
        if url in seen:
            raise SubscriptionError(f"--webhook-url {shown(url)!r} is given twice")
        seen.add(url)
    chosen: dict[str, str] = {}
    for given in principals:
        name, sep, url = given.partition("=")
        if not sep or not name.strip() or not url:
            raise SubscriptionError(f"--webhook-principal {shown(given)!r}: write PRINCIPAL=URL")
        if url not in seen:
            raise SubscriptionError(
                f"--webhook-principal {name}={shown(url)}: that URL is not a --webhook-url"
            )
        if url in chosen:
            raise SubscriptionError(f"--webhook-principal: {shown(url)} is given a principal twice")
        chosen[url] = name
    return [Subscription(url, chosen.get(url)) for url in urls]


Visible = Callable[[EventRecord], bool]


def visibility(subscription: Subscription, access: AccessFile | None) -> Visible:
    """Whether an event is the subscription's to receive (the rule of WatchRewindEvents)."""
    name = subscription.principal
    if name is None:
        return lambda event: True

    def principal() -> Principal | None:
        if access is None:  # no authentication: principals are names only, as sessions record them
            return Principal(name, frozenset({Permission.EVENTS_READ}))
        return access.named(name)

    def visible(event: EventRecord) -> bool:
        found = principal()
        if found is None or not (found.admin or Permission.EVENTS_READ in found.permissions):
            return False
        return found.owns(str(event.data.get("owner", event.principal)))

    return visible
