"""The Standard Webhooks headers of one delivery attempt, by `standardwebhooks` itself.

`webhook-id` is the CloudEvent's id (the event's cursor); `webhook-timestamp` the attempt's time
(each retry is signed anew, so a receiver's tolerance of a few minutes holds however long the
retries took); `webhook-signature` one `v1,` signature per key, separated by spaces.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from math import floor

from standardwebhooks import Webhook


class Signer:
    def __init__(self, keys: Sequence[str]) -> None:
        if not keys:
            raise ValueError("no key to sign with")
        self._keys = [Webhook(key) for key in keys]

    def headers(self, msg_id: str, body: str, at: datetime | None = None) -> dict[str, str]:
        stamp = (at or datetime.now(UTC)).astimezone(UTC)
        return {
            "webhook-id": msg_id,
            "webhook-timestamp": str(floor(stamp.timestamp())),
            "webhook-signature": " ".join(key.sign(msg_id, stamp, body) for key in self._keys),
        }
