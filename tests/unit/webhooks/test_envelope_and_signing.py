"""The CloudEvent a receiver gets (read back by the `cloudevents` library's own parser), its
Standard Webhooks headers (verified by `standardwebhooks` itself, with each key of a rotation),
the backoff between attempts, and how URLs and their principals are read."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cloudevents.core.bindings.http import HTTPMessage, from_structured_event
from standardwebhooks import Webhook, WebhookVerificationError

from agent_rewind.access import Permission, Principal
from agent_rewind.rpc.convert import rewind_event_json
from agent_rewind.store.ledger import EventRecord
from agent_rewind.webhooks import backoff
from agent_rewind.webhooks.envelope import envelope
from agent_rewind.webhooks.secrets import new_key
from agent_rewind.webhooks.signing import Signer
from agent_rewind.webhooks.subscriptions import (
    Subscription,
    SubscriptionError,
    shown,
    subscriptions,
    visibility,
)

SID = "0b7f3c1e-5a8d-4d6e-9f10-2a3b4c5d6e7f"
WHEN = datetime(2026, 5, 1, 12, 0, 3, 250000, tzinfo=UTC)


def _event(kind: str = "REWOUND", cursor: int = 42, **data: Any) -> EventRecord:
    values = {"message_id": "9d6b1d0e-0000-4000-8000-000000000001", "mode": "both", "owner": "alice", **data}
    return EventRecord(cursor, kind, SID, "r-1" if kind != "SESSION_DELETED" else "", "alice", WHEN, values)


@pytest.mark.parametrize(
    ("kind", "type_"),
    [
        ("REWOUND", "agent_rewind.v1.rewound"),
        ("UNDONE", "agent_rewind.v1.undone"),
        ("SESSION_DELETED", "agent_rewind.v1.session_deleted"),
    ],
)
def test_an_event_is_a_structured_cloudevent_the_library_reads_back(kind: str, type_: str) -> None:
    sealed = envelope(_event(kind), rewind_event_json)
    assert sealed.content_type.startswith("application/cloudevents+json")
    parsed = from_structured_event(HTTPMessage({"content-type": sealed.content_type}, sealed.body.encode()))
    assert parsed.get_specversion() == "1.0"
    assert (parsed.get_id(), parsed.get_type(), parsed.get_subject()) == ("42", type_, SID)
    assert parsed.get_time() == WHEN
    assert parsed.get_datacontenttype() == "application/json"
    data = parsed.get_data()
    assert isinstance(data, dict)
    # The watcher's RewindEvent in the protobuf JSON mapping (int64 as a string, enums by name).
    assert (data["cursor"], data["sessionId"], data["principal"]) == ("42", SID, "alice")
    assert data["occurTime"] == "2026-05-01T12:00:03.250Z"
    assert sealed.msg_id == "42" and json.loads(sealed.body)["id"] == "42"


def test_the_document_carries_no_more_than_a_watcher_gets() -> None:
    # What the event record holds beyond the RewindEvent's fields (its owner, say) stays out.
    body = json.loads(envelope(_event(secret_note="never sent"), rewind_event_json).body)
    assert "never sent" not in json.dumps(body)
    assert set(body) == {"specversion", "id", "source", "type", "subject", "time", "datacontenttype", "data"}


def test_every_key_signs_so_a_receiver_with_either_key_of_a_rotation_verifies() -> None:
    old, new, stranger = new_key(), new_key(), new_key()
    body = envelope(_event(), rewind_event_json).body
    headers = Signer([old, new]).headers("42", body)
    assert headers["webhook-id"] == "42"
    assert len(headers["webhook-signature"].split(" ")) == 2
    for key in (old, new):
        assert Webhook(key).verify(body, headers)["id"] == "42"
    with pytest.raises(WebhookVerificationError):
        Webhook(stranger).verify(body, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(old).verify(body.replace("42", "43"), headers)


def test_the_timestamp_is_the_attempts_and_an_old_one_is_refused() -> None:
    key = new_key()
    body = envelope(_event(), rewind_event_json).body
    stale = Signer([key]).headers("42", body, at=datetime.now(UTC) - timedelta(minutes=10))
    with pytest.raises(WebhookVerificationError):
        Webhook(key).verify(body, stale)
    fresh = Signer([key]).headers("42", body)
    assert abs(int(fresh["webhook-timestamp"]) - datetime.now(UTC).timestamp()) < 5


def test_backoff_grows_exponentially_with_jitter_up_to_its_cap() -> None:
    rng = random.Random(7)
    for retry in range(1, 12):
        ceiling = min(60.0, 0.5 * 2 ** (retry - 1))
        waits = [backoff.delay(retry, rng=rng) for _ in range(200)]
        assert all(ceiling / 2 <= w <= ceiling for w in waits)
        assert len({round(w, 6) for w in waits}) > 150, "jittered, not in step"
    assert backoff.delay(1000, rng=rng) <= 60.0
    with pytest.raises(ValueError):
        backoff.delay(0)


def test_urls_and_principals_are_checked_and_paired() -> None:
    a, b = "https://hooks.example/a?token=s3cret", "http://127.0.0.1:8080/b"
    subs = subscriptions([a, b], ["billing=" + a])
    assert subs == [Subscription(a, "billing"), Subscription(b, None)]
    assert shown(a) == "https://hooks.example/a" and shown("https://u:pw@h:1/p#f") == "https://h:1/p"
    for urls, principals in [
        (["ftp://x/"], []),
        (["http:///nohost"], []),
        ([a, a], []),
        ([a], ["billing=http://elsewhere/"]),
        ([a], ["=" + a]),
        ([a], ["billing"]),
        ([a], ["x=" + a, "y=" + a]),
    ]:
        with pytest.raises(SubscriptionError) as refused:
            subscriptions(urls, principals)
        assert "s3cret" not in str(refused.value), "a URL's query is never shown"


def test_a_principals_url_gets_only_the_events_it_may_read() -> None:
    class Access:
        def __init__(self) -> None:
            self.known = {
                "alice": Principal("alice", frozenset({Permission.EVENTS_READ})),
                "ops": Principal("ops", frozenset({Permission.ADMIN})),
                "mute": Principal("mute", frozenset({Permission.SESSIONS_READ})),
            }

        def named(self, name: str) -> Principal | None:
            return self.known.get(name)

    access: Any = Access()
    alices, bobs = _event(owner="alice"), _event(owner="bob")

    def seen(principal: str | None) -> list[bool]:
        visible = visibility(Subscription("http://h/", principal), access)
        return [visible(alices), visible(bobs)]

    assert seen(None) == [True, True]
    assert seen("alice") == [True, False]
    assert seen("ops") == [True, True]
    assert seen("mute") == [False, False], "no events.read: nothing"
    # Not even its own sessions' events (the slip of issue 37 checked ownership alone).
    access.known["mute"] = Principal("mute", frozenset({Permission.SESSIONS_READ, Permission.REWIND}))
    assert visibility(Subscription("http://h/", "mute"), access)(_event(owner="mute")) is False
    assert visibility(Subscription("http://h/", "alice"), access)(_event(owner="alice")) is True
    assert seen("gone") == [False, False], "not in the access file: nothing"
    del access.known["alice"]
    assert seen("alice") == [False, False], "a revocation holds without a restart"
    # Without an access file, principals are the names sessions record.
    assert [visibility(Subscription("http://h/", "alice"), None)(e) for e in (alices, bobs)] == [True, False]
