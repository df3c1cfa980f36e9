"""A real webhook receiver for tests: aiohttp on loopback, verifying every delivery's signature
with `standardwebhooks`, and answering each attempt as the test's plan says (at once, 500, or
never: it hangs until the sender gives up)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from standardwebhooks import Webhook, WebhookVerificationError

# What to do with the n-th attempt (from 1) of the delivery with webhook-id `msg_id`.
# "ok", "fail" (HTTP 500), "redirect" (HTTP 307), "hang" (no answer), "take-and-hang" (kept as
# delivered, no answer), or "status NNN" (that status; kept as delivered when it is a 2xx).
Plan = Callable[[str, int], str]


def always_ok(msg_id: str, attempt: int) -> str:
    return "ok"


@dataclass
class Delivery:
    """An attempt the receiver answered with 2xx: the event as it got it."""

    msg_id: str
    document: dict[str, Any]
    headers: dict[str, str]
    received_at: float  # the loop's clock


@dataclass
class Receiver:
    keys: Sequence[str]
    plan: Plan = always_ok
    accepted: list[Delivery] = field(default_factory=list)
    attempts: list[tuple[str, str]] = field(default_factory=list)  # (msg_id, what was answered)
    bad_signatures: int = 0
    hanging: asyncio.Event = field(default_factory=asyncio.Event)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    _runner: web.AppRunner | None = None
    _release: asyncio.Event = field(default_factory=asyncio.Event)
    url: str = ""

    async def start(self, path: str = "/hook") -> str:
        app = web.Application()
        app.router.add_post(path, self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}{path}"
        return self.url

    async def stop(self) -> None:
        self._release.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.text()
        headers = {k.lower(): v for k, v in request.headers.items()}
        try:
            for key in self.keys:  # every key of a rotation verifies it alone
                Webhook(key).verify(body, headers)
        except WebhookVerificationError:
            self.bad_signatures += 1
            self.attempts.append((headers.get("webhook-id", ""), "bad-signature"))
            return web.Response(status=400)
        msg_id = headers["webhook-id"]
        attempt = 1 + sum(1 for seen, _ in self.attempts if seen == msg_id)
        action = self.plan(msg_id, attempt)
        self.attempts.append((msg_id, action))
        if action == "take-and-hang":  # kept, as if handled, but the answer never sent
            self.accepted.append(
                Delivery(msg_id, json.loads(body), headers, asyncio.get_running_loop().time())
            )
            self.arrived.set()
            action = "hang"
        if action == "hang":
            self.hanging.set()
            await self._release.wait()
            return web.Response(status=503)
        if action == "fail":
            return web.Response(status=500, text="not now")
        if action == "redirect":  # elsewhere: a sender that follows it delivers nothing here
            return web.Response(status=307, headers={"location": "/elsewhere"})
        if action.startswith("status "):
            status = int(action.removeprefix("status "))
            if 200 <= status < 300:
                self.accepted.append(
                    Delivery(msg_id, json.loads(body), headers, asyncio.get_running_loop().time())
                )
                self.arrived.set()
            return web.Response(status=status)
        self.accepted.append(Delivery(msg_id, json.loads(body), headers, asyncio.get_running_loop().time()))
        self.arrived.set()
        return web.Response(status=204)

    def cursors(self) -> list[int]:
        return [int(d.msg_id) for d in self.accepted]

    async def wait_for(self, count: int, within: float = 60.0) -> None:
        """Until `count` deliveries were accepted (no fixed sleeps: machines are noisy)."""
        async with asyncio.timeout(within):
            while len(self.accepted) < count:
                self.arrived.clear()
                await self.arrived.wait()
