"""Webhook delivery: every event of the durable log POSTed to each configured URL, at least once,
in cursor order per URL, as a CloudEvents 1.0 JSON document signed as Standard Webhooks says
(API.md, "Events to webhooks").

- `subscriptions.py`: the URLs, the principal each one's events are filtered by, checked at start.
- `secrets.py`: the secret file (one `whsec_` key a line; every key signs, so keys can rotate).
- `envelope.py`: an event as a CloudEvent (structured JSON); `signing.py`: its headers.
- `backoff.py`: how long a failed attempt waits before the next.
- `delivery.py`: one URL's loop: its lease in the ledger, its cursor, its attempts.
- `recent.py`: the events published here lately, so each is read and encoded once for every URL.
- `cursors.py`: every URL's cursor moves, written together (one transaction for many).
- `service.py`: every URL's loop, started and stopped together, woken when an event is published.

A layer above `store/` (it reads the event log and keeps its cursors through the ledger's
`EventLog` and `WebhookCursors` parts); it knows no protobuf: the event's JSON body is made by
the function `rpc/` hands it.
"""

from agent_rewind.webhooks.secrets import SecretFileError, read_secret_file
from agent_rewind.webhooks.service import Webhooks
from agent_rewind.webhooks.subscriptions import Subscription, SubscriptionError, subscriptions

__all__ = [
    "SecretFileError",
    "Subscription",
    "SubscriptionError",
    "Webhooks",
    "read_secret_file",
    "subscriptions",
]
