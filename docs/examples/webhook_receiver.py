"""Receive agent-rewind's webhooks, verify each with the Standard Webhooks library, handle each
event once: docs/events.md#webhooks.

    WEBHOOK_SECRETS="whsec_..." PORT=8080 python docs/examples/webhook_receiver.py

WEBHOOK_SECRETS holds the key(s) this receiver trusts, separated by spaces (during a rotation,
the old and the new: the service signs with every key of its file, so either verifies).
Delivery is at least once: an event may come again (a retry after a lost answer, a restart),
so it is handled once by its `id`, the event's cursor (keep the ids you handled durably, as
you would a watcher's cursor). Answer 2xx only once the event is safely handled; anything else,
or no answer within the service's --webhook-timeout, and it is sent again later.
"""

from __future__ import annotations

import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Lock
from typing import Any

from standardwebhooks import Webhook, WebhookVerificationError

VERIFIERS = [Webhook(key) for key in os.environ["WEBHOOK_SECRETS"].split()]
handled: set[str] = set()
handled_lock = Lock()


def verify(body: bytes, headers: dict[str, str]) -> dict[str, Any]:
    """The CloudEvent, if one of our keys signed it (and its timestamp is recent)."""
    for verifier in VERIFIERS:
        try:
            event: dict[str, Any] = verifier.verify(body, headers)
            return event
        except WebhookVerificationError:
            continue
    raise WebhookVerificationError("no key of ours signed it")


def handle(event: dict[str, Any]) -> None:
    data = event["data"]  # the RewindEvent, as a watcher gets it (protobuf JSON)
    kind = event["type"].removeprefix("agent_rewind.v1.")
    print(f"{kind} id={event['id']} session={event['subject']} rewind={data.get('rewindId', '')}", flush=True)


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        try:
            event = verify(body, {k.lower(): v for k, v in self.headers.items()})
        except WebhookVerificationError:
            self.send_response(401)  # not ours, tampered with, or too old: never handled
            self.end_headers()
            return
        with handled_lock:
            if event["id"] not in handled:  # at least once: a repeat is answered, not handled
                handle(event)
                handled.add(event["id"])
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        pass


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", int(os.environ.get("PORT", "8080"))), Receiver)
    print(json.dumps({"listening": server.server_address[1]}), flush=True)
    server.serve_forever()
