"""An event of the log as the CloudEvents 1.0 document a webhook receives (structured JSON mode).

`id` is the event's cursor (unique in the deployment, and the `webhook-id` of its delivery);
`type` says what happened (`agent_rewind.v1.rewound`, `.undone`, `.session_deleted`); `subject`
is the session's id; `time` when the event was committed; `data` the `RewindEvent` message in the
protobuf JSON mapping, exactly what a watcher gets (no text of any message), made by the function
`rpc/` passes in (`Encode`). Built and written by the `cloudevents` library.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cloudevents.core.bindings.http import to_structured_event
from cloudevents.core.v1.event import CloudEvent

from agent_rewind.store.ledger import EventRecord

SOURCE = "urn:agent-rewind"
TYPES = {
    "REWOUND": "agent_rewind.v1.rewound",
    "UNDONE": "agent_rewind.v1.undone",
    "SESSION_DELETED": "agent_rewind.v1.session_deleted",
}
CONTENT_TYPE = "application/cloudevents+json"

# An event's `data`: the RewindEvent message as JSON (rpc/convert.py `rewind_event_json`).
Encode = Callable[[EventRecord], dict[str, Any]]


@dataclass(frozen=True)
class Envelope:
    msg_id: str
    body: str  # the JSON document, as signed and sent
    content_type: str


def envelope(event: EventRecord, encode: Encode) -> Envelope:
    cloud_event = CloudEvent(
        {
            "specversion": "1.0",
            "id": str(event.cursor),
            "source": SOURCE,
            "type": TYPES.get(event.kind, "agent_rewind.v1." + event.kind.lower()),
            "subject": event.session_id,
            "time": event.occur_time,
            "datacontenttype": "application/json",
        },
        encode(event),
    )
    message = to_structured_event(cloud_event)
    content_type = next((v for k, v in message.headers.items() if k.lower() == "content-type"), CONTENT_TYPE)
    return Envelope(str(event.cursor), message.body.decode("utf-8"), content_type)
