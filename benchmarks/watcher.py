"""A process of WatchRewindEvents watchers for the events benchmark (`python -m benchmarks.watcher`).

`python -m benchmarks.watcher ADDRESS N`: opens N streams (no cursor: new events only) on one
channel, prints `ready` once every stream has caught up, then `got CURSOR` each time every stream
has received that event, and on `report` (a line on stdin) prints one JSON object: for each
cursor, the CLOCK_MONOTONIC times (the same clock in every process of the machine) at which each
stream received it; then exits. Nothing here computes a figure: the benchmark does.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import defaultdict

import grpc

from agent_rewind.api.v1 import rewind_service_pb2, rewind_service_pb2_grpc


async def _main(address: str, count: int) -> None:
    channel = grpc.aio.insecure_channel(address)
    stub = rewind_service_pb2_grpc.RewindServiceStub(channel)
    received: dict[int, list[float]] = defaultdict(list)
    caught_up = 0
    ready = asyncio.Event()

    def say(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    async def stream() -> None:
        nonlocal caught_up
        async for response in stub.WatchRewindEvents(rewind_service_pb2.WatchRewindEventsRequest()):
            if response.HasField("caught_up"):
                caught_up += 1
                if caught_up == count:
                    ready.set()
                continue
            at = time.monotonic()
            times = received[response.event.cursor]
            times.append(at)
            if len(times) == count:
                say(f"got {response.event.cursor}")

    streams = [asyncio.create_task(stream()) for _ in range(count)]
    await ready.wait()
    say("ready")
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.readline)  # "report"
    say(json.dumps({str(cursor): times for cursor, times in received.items()}))
    for task in streams:
        task.cancel()
    await asyncio.gather(*streams, return_exceptions=True)
    await channel.close()


async def _never_read(address: str, count: int) -> None:
    """`python -m benchmarks.watcher ADDRESS N replay`: N streams replaying from the oldest event
    (after_cursor 0) that never read a message; `ready` once all are connected, then waits. The
    streams' HTTP/2 windows stay at their initial size (no BDP probing): what the server sends
    beyond it waits in the server, which is what this measures."""
    channel = grpc.aio.insecure_channel(address, options=[("grpc.http2.bdp_probe", 0)])
    stub = rewind_service_pb2_grpc.RewindServiceStub(channel)
    request = rewind_service_pb2.WatchRewindEventsRequest(after_cursor=0)
    calls = [stub.WatchRewindEvents(request) for _ in range(count)]
    await asyncio.gather(*(call.wait_for_connection() for call in calls))
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    await channel.close()


if __name__ == "__main__":
    if sys.argv[3:] == ["replay"]:
        asyncio.run(_never_read(sys.argv[1], int(sys.argv[2])))
    else:
        asyncio.run(_main(sys.argv[1], int(sys.argv[2])))
