"""Follow every rewind this principal may see, and never miss one: docs/events.md.

    python docs/examples/watch_events.py [ADDRESS] [CURSOR_FILE]

The cursor is stored after each event is handled, so a restart of this program (or of the
server) resumes right after the last event handled: at least once, never a gap. Handling must
therefore be idempotent: an event handled just before a crash, its cursor not yet stored, comes
again.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from agent_rewind.api.v1 import rewind_pb2, rewind_service_pb2, rewind_service_pb2_grpc


def handle(event: rewind_pb2.RewindEvent) -> None:
    kind = rewind_pb2.RewindEventKind.Name(event.kind).removeprefix("REWIND_EVENT_KIND_")
    print(f"{kind} cursor={event.cursor} session={event.session_id} rewind={event.rewind_id}", flush=True)


def resync() -> None:
    """Events were dropped before we saw them: rebuild whatever you mirror from the sessions
    themselves (ListSessions, ListRewindPoints), then follow on."""
    print("RESYNC", flush=True)


def store(cursor_file: Path, cursor: int) -> None:
    """Atomically: a crash mid-write must not leave an empty file (that would skip events)."""
    partial = cursor_file.with_name(cursor_file.name + ".tmp")
    partial.write_text(str(cursor))
    os.replace(partial, cursor_file)


def error_reason(err: grpc.RpcError) -> tuple[str, dict[str, str]]:
    status = rpc_status.from_call(err)
    for detail in status.details if status else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info.reason, dict(info.metadata)
    return "", {}


def follow(address: str, cursor_file: Path) -> None:
    stub = rewind_service_pb2_grpc.RewindServiceStub(grpc.insecure_channel(address))
    backoff = 0.5
    while True:
        stored = cursor_file.read_text().strip() if cursor_file.exists() else ""
        request = rewind_service_pb2.WatchRewindEventsRequest()
        if stored:
            request.after_cursor = int(stored)  # exclusive: events after the last one handled
        try:
            for response in stub.WatchRewindEvents(request):
                if response.HasField("caught_up"):
                    if not stored:  # a first start follows from here on
                        store(cursor_file, response.caught_up.cursor)
                    print(f"CAUGHT_UP cursor={response.caught_up.cursor}", flush=True)
                    backoff = 0.5
                    continue
                handle(response.event)
                store(cursor_file, response.event.cursor)  # after handling it
        except grpc.RpcError as err:
            reason, metadata = error_reason(err)
            if reason == "CURSOR_EXPIRED":
                resync()
                store(cursor_file, int(metadata["oldest_cursor"]) - 1)
                continue
            if reason not in ("SHUTTING_DOWN", "SUBSCRIBER_TOO_SLOW") and err.code() not in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
            ):
                raise  # PERMISSION_DENIED, SESSION_NOT_FOUND, ...: retrying will not help
            time.sleep(backoff)  # the server is restarting, or another replica takes over
            backoff = min(backoff * 2, 30.0)


if __name__ == "__main__":
    follow(
        sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051",
        Path(sys.argv[2] if len(sys.argv) > 2 else "last-cursor"),
    )
