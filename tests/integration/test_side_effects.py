"""Side effects a rewind cannot undo, named before it drops them: a real MCP server, the real CLI.

A session is given an MCP server (the `mcp` package's own, over streamable HTTP on loopback) with
one tool that "sends" a message; a turn calls it. DryRun and Rewind over that turn list the call,
with the tool and a summary that holds none of the values the call was given.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from google.protobuf import struct_pb2
from mcp.server.mcpserver import MCPServer

from agent_rewind.api.v1 import rewind_pb2
from tests.integration.harness import BOTH, CONVERSATION, FILES, prompt_id, serve

SECRET = "s3cret-body-text"


class MailServer:
    """An MCP server with one tool, `send`, that records what it was sent."""

    def __init__(self) -> None:
        self.sent: list[dict[str, str]] = []
        mcp = MCPServer("mail")

        @mcp.tool()
        def send(to: str, body: str) -> str:
            """Sends a message."""
            self.sent.append({"to": to, "body": body})
            return "sent"

        config = uvicorn.Config(mcp.streamable_http_app(), host="127.0.0.1", port=0, log_level="warning")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="mcp-mail", daemon=True)

    def __enter__(self) -> MailServer:
        self._thread.start()
        for _ in range(500):
            if self._server.started:
                break
            threading.Event().wait(0.01)
        assert self._server.started, "the MCP server did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(10)

    @property
    def port(self) -> int:
        port: int = self._server.servers[0].sockets[0].getsockname()[1]
        return port


@pytest.fixture
def mail() -> Iterator[MailServer]:
    with MailServer() as server:
        yield server


def _options(port: int) -> struct_pb2.Struct:
    options = struct_pb2.Struct()
    options.update(
        {
            "mcp_servers": {"mail": {"type": "http", "url": f"http://127.0.0.1:{port}/mcp"}},
            "allowed_tools": ["mcp__mail__send"],
        }
    )
    return options


async def test_a_dry_run_and_the_rewind_name_the_mcp_call_they_cannot_undo(
    tmp_path: Path, mail: MailServer
) -> None:
    async with serve(tmp_path, mcp_hosts=(f"127.0.0.1:{mail.port}",), workspace_snapshots=True) as c:
        sid = (await c.create(options=_options(mail.port))).session_id
        first = prompt_id(await c.prompt(sid, "write a.txt one"))
        call = f'tool mcp__mail__send {{"to": "bob@example.com", "body": "{SECRET}"}}\nsay sent'
        sending = prompt_id(await c.prompt(sid, call))
        assert mail.sent == [{"to": "bob@example.com", "body": SECRET}]  # it really ran
        later = prompt_id(await c.prompt(sid, "write b.txt two"))
        expected = [
            rewind_pb2.SideEffect(
                message_id=sending,
                tool="mcp__mail__send",
                summary="called send on MCP server mail (to, body)",
            )
        ]

        # Over the sending turn: named, in every mode (a files rewind does not undo it either).
        for mode in (CONVERSATION, FILES, BOTH):
            assert list((await c.dry_run(sid, sending, mode)).side_effects) == expected
        assert list((await c.dry_run(sid, first, CONVERSATION)).side_effects) == expected
        # Not over a later turn only.
        assert list((await c.dry_run(sid, later, CONVERSATION)).side_effects) == []

        rid = str(uuid.uuid4())
        rewound = await c.rewind(sid, sending, BOTH, request_id=rid)
        assert rewound.conversation.rewound
        assert list(rewound.side_effects) == expected
        assert SECRET not in str(rewound) and "bob@example.com" not in str(rewound)
        # A retry gets the same answer; the call is not made again.
        assert list((await c.rewind(sid, sending, BOTH, request_id=rid)).side_effects) == expected
        assert len(mail.sent) == 1


FETCH = (
    "import sys, urllib.request\n"
    "for url in sys.argv[1:]:\n"
    "    try:\n"
    "        print(url, urllib.request.urlopen(url, timeout=10).read().decode())\n"
    "    except Exception as err:\n"
    "        print(url, 'failed', err)\n"
)


async def test_a_host_a_dropped_turns_command_reached_is_named(tmp_path: Path, web: tuple[int, int]) -> None:
    allowed, refused = web
    async with serve(tmp_path, sandbox_allow_hosts=(f"127.0.0.1:{allowed}",)) as c:
        options = struct_pb2.Struct()
        options.update({"allowed_tools": ["Bash"]})
        session = await c.create(options=options)
        sid, cwd = session.session_id, Path(session.cwd)
        (cwd / "fetch.py").write_text(FETCH)
        first = prompt_id(await c.prompt(sid, "say hi"))
        urls = f"http://127.0.0.1:{allowed}/ http://127.0.0.1:{allowed}/again http://127.0.0.1:{refused}/"
        fetching = prompt_id(await c.prompt(sid, f"bash python3 fetch.py {urls} > out.txt 2>&1"))
        out = (cwd / "out.txt").read_text().splitlines()
        assert out[0].endswith(f"hello from {allowed}") and out[1].endswith(f"hello from {allowed}"), out
        assert "failed" in out[2], out
        expected = [
            rewind_pb2.SideEffect(
                message_id=fetching, tool="Bash", summary=f"a command reached 127.0.0.1:{allowed}"
            )
        ]
        # Once per host and turn; the refused host is not there.
        assert list((await c.dry_run(sid, first, CONVERSATION)).side_effects) == expected
        assert list((await c.dry_run(sid, fetching, FILES)).side_effects) == expected
    async with serve(tmp_path, sandbox_allow_hosts=(f"127.0.0.1:{allowed}",)) as c:
        assert (
            list((await c.dry_run(sid, fetching, CONVERSATION)).side_effects) == expected
        )  # after a restart
