"""The floor of the events benchmark: the least a grpc.aio server in Python does to send one event
to every open stream (`python -m benchmarks.fanout_floor`).

It serves two methods of the real RewindService under their real names, so the benchmark's
watcher processes (`benchmarks/watcher.py`) and its timing code use it unchanged:

- `WatchRewindEvents`: a `caught_up` with the newest cursor, then each new event, as bytes made
  once for every stream (what the service does too: rpc/caches.py `EventMessages`);
- `Rewind`: appends an event (nothing durable, no CLI, no ledger), answers, and wakes every
  stream 2 ms later, as the service's hub does (events/hub.py `_WAKE_DELAY`).

Each stream waits on one shared asyncio.Event per event and writes the same bytes: no per-stream
filtering, cursor bookkeeping, metrics or error boundary. What the service's fan-out costs beyond
this is its own; what this costs is grpc.aio's (and the watchers' clients, on the same cores).
Prints `listening PORT` once it serves; ends on SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc

from agent_rewind.api.v1 import rewind_pb2, rewind_service_pb2

_WAKE_DELAY = 0.002
_SERVICE = "agent_rewind.v1.RewindService"


class _Log:
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.cursor = 0
        self.messages: dict[int, bytes] = {}
        self.next = asyncio.Event()

    def append(self) -> None:
        self.cursor += 1
        # As big as the service's event of the benchmark's files rewind of one file.
        event = rewind_pb2.RewindEvent(
            cursor=self.cursor,
            rewind_id=str(uuid.uuid4()),
            session_id=self.session_id,
            message_id=str(uuid.uuid4()),
            mode=rewind_pb2.REWIND_MODE_FILES,
            files=rewind_pb2.FilesRewindResult(
                can_rewind=True,
                files_changed=[f"/tmp/agent-rewind-bench/workspaces/{self.session_id}/a.txt"],
                insertions=1,
                deletions=1,
                requested=True,
                source=rewind_pb2.FILES_SOURCE_CHECKPOINT,
            ),
            principal="local",
            kind=rewind_pb2.REWIND_EVENT_KIND_REWOUND,
            last_message_id=str(uuid.uuid4()),
        )
        event.occur_time.GetCurrentTime()
        self.messages[self.cursor] = rewind_service_pb2.WatchRewindEventsResponse(
            event=event
        ).SerializeToString()
        asyncio.get_running_loop().call_later(_WAKE_DELAY, self._wake)

    def _wake(self) -> None:
        woken, self.next = self.next, asyncio.Event()
        woken.set()


async def _serve() -> None:
    log = _Log(str(uuid.uuid4()))

    async def watch(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        position = log.cursor
        yield rewind_service_pb2.WatchRewindEventsResponse(
            caught_up=rewind_pb2.CaughtUp(cursor=position)
        ).SerializeToString()
        while True:
            await log.next.wait()
            while position < log.cursor:
                position += 1
                yield log.messages[position]

    async def rewind(request: Any, context: grpc.aio.ServicerContext) -> bytes:
        log.append()
        return rewind_pb2.RewindResult().SerializeToString()

    server = grpc.aio.server()
    handlers = {
        "WatchRewindEvents": grpc.unary_stream_rpc_method_handler(watch),
        "Rewind": grpc.unary_unary_rpc_method_handler(rewind),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    sys.stdout.write(f"listening {port}\n")
    sys.stdout.flush()
    await stop.wait()
    await server.stop(0)


if __name__ == "__main__":
    asyncio.run(_serve())
