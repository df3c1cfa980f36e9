"""One tenant filling the disk stops only that tenant (issue 40, item 4), through the real server
and the real CLI, on a real small file system: a 96 MiB tmpfs the test mounts. The tests run as
root, as CI does; a machine where the mount fails fails them, rather than skipping what they pin.

Two principals. Alice's agent runs `dd` until the volume is full, while a turn of bob's is in
flight. Both ways the volumes can be laid out:

- the workspaces on a volume of their own (`--workspace-root`, as deploy/ has it): the volume
  that fills is theirs only; the state dir is untouched;
- one volume for both (the default): `--storage-reserve` keeps space in the state dir, released
  as the volume fills, so that what the service must write is written.

Either way: bob's turn in flight is recorded, alice's turn ends cleanly and is recorded, both
transcripts are whole and the points right; ListSessions, GetSession, ListRewindPoints and a
rewind work for both; a new turn of either is refused before it starts (RESOURCE_EXHAUSTED,
QUOTA_EXCEEDED, limit `storage_reserve`), writing nothing; once space is freed (alice deletes her
session, or her big file), both start turns again and the reserve is there again.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2

from agent_rewind.access import Permission, hash_token
from agent_rewind.api.v1 import session_pb2, session_service_pb2
from agent_rewind.storage.reserve import FULL_BELOW, RESERVE_NAME, space
from tests.integration.harness import (
    BOTH,
    Client,
    error_info,
    prompt_id,
    result_of,
    serve,
)

MIB = 1 << 20
VOLUME = 96 * MIB
RESERVE = 16 * MIB
FILL = "bash dd if=/dev/zero of=big bs=1M count=200"
TOKENS = {"alice": "arw_alice-full-disk", "bob": "arw_bob-full-disk"}


@contextmanager
def tmpfs(path: Path, size: int = VOLUME) -> Iterator[Path]:
    """A tmpfs of `size` bytes mounted at `path` for the block, then unmounted."""
    path.mkdir(parents=True)
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)]
    done = subprocess.run(mount, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.fail(
            f"a full disk is tested on a real small file system, and `{' '.join(mount)}` failed "
            f"({done.stderr.strip()}): run as root, as CI does"
        )
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], check=False).returncode != 0:
            subprocess.run(["umount", "--lazy", str(path)], check=True)


def as_principal(c: Client, name: str) -> Client:
    """The same server, called with `name`'s bearer token."""
    metadata = (("authorization", f"Bearer {TOKENS[name]}"),)

    class Stub:
        def __init__(self, stub: Any) -> None:
            self._stub = stub

        def __getattr__(self, method: str) -> Any:
            call = getattr(self._stub, method)
            return lambda request, **kw: call(request, metadata=metadata, **kw)

    return Client(c.running, c.channel, Stub(c.sessions), Stub(c.rewinds))  # type: ignore[arg-type]


@asynccontextmanager
async def two_principals(state_dir: Path, **overrides: Any) -> AsyncIterator[tuple[Client, Client]]:
    """A server with workspace snapshots on (the default outside tests) and the reserve, and
    alice and bob, each with every permission but admin."""
    access = state_dir.parent / "access.json"
    permissions = [p.value for p in Permission if p is not Permission.ADMIN]
    entries = [
        {"name": name, "permissions": permissions, "token_sha256": [hash_token(token)]}
        for name, token in TOKENS.items()
    ]
    access.write_text(json.dumps({"principals": entries}))
    async with serve(
        state_dir, access_file=access, workspace_snapshots=True, storage_reserve=RESERVE, **overrides
    ) as c:
        yield as_principal(c, "alice"), as_principal(c, "bob")


def bash_allowed() -> struct_pb2.Struct:
    options = struct_pb2.Struct()
    options.update({"allowed_tools": ["Bash"]})
    return options


async def recorded(c: Client, session_id: str, text: str) -> str:
    """A turn that ends well; its prompt's id."""
    events = await c.prompt(session_id, text)
    assert not result_of(events).is_error, events
    return prompt_id(events)


async def point_ids(c: Client, session_id: str) -> list[str]:
    return [p.message_id for p in await c.all_points(session_id)]


async def refused_for_space(c: Client, session_id: str, volume: str) -> None:
    """A Prompt and a ForkSession refused before they start: the storage limits' error, the
    volume named."""
    fork = c.sessions.ForkSession(session_service_pb2.ForkSessionRequest(session_id=session_id))
    for call in (c.prompt(session_id, "write never.txt never"), fork):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        info = error_info(err.value)
        assert (err.value.code(), info.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "QUOTA_EXCEEDED")
        assert (info.metadata["limit"], info.metadata["volume"]) == ("storage_reserve", volume)
        assert int(info.metadata["used_bytes"]) >= int(info.metadata["max_bytes"])


def whole(state_dir: Path, session_id: str) -> None:
    """Every line of the session's transcript is a JSON entry: none was cut short by the full
    volume (a cut line, and the line the CLI appends after it, are lost to every reader)."""
    (path,) = (state_dir / "claude" / "projects").glob(f"*/{session_id}.jsonl")
    lines = path.read_text().splitlines()
    assert lines
    for number, line in enumerate(lines, 1):
        try:
            json.loads(line)
        except ValueError:
            pytest.fail(f"{path.name} line {number} was cut short: {line[:80]}...{line[-80:]}")


async def until(condition: Any, within: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "never happened"
        await asyncio.sleep(0.02)


async def fill_while_bob_runs(
    alice: Client, bob: Client, volume: Path, given_back: int = 0
) -> tuple[session_pb2.Session, session_pb2.Session, list[str]]:
    """Alice's agent fills `volume` while a turn of bob's is between its write and its answer.
    Both turns end well and are recorded. Alice's session, bob's, and bob's points.
    `given_back`: what the reserve freed once the volume was full."""
    a = await alice.create(options=bash_allowed())
    b = await bob.create()
    one = await recorded(bob, b.session_id, "write one.txt one")
    in_flight = asyncio.create_task(bob.prompt(b.session_id, "write two.txt two\nsleep 3\nsay bob done"))
    await until(lambda: (Path(b.cwd) / "two.txt").exists())
    filled = await alice.prompt(a.session_id, FILL)
    assert space(volume).free < given_back + FULL_BELOW, "the volume was full"
    (ran,) = [e.tool_result for e in filled if e.HasField("tool_result")]
    assert ran.is_error, "dd stopped at a full volume"  # its output too, where /tmp is full
    assert not result_of(filled).is_error, "alice's turn ends cleanly: the failed command is its answer"
    two = prompt_id(await in_flight)
    assert await point_ids(alice, a.session_id) == [prompt_id(filled)]
    assert await point_ids(bob, b.session_id) == [one, two]
    assert (Path(b.cwd) / "two.txt").read_text() == "two\n"
    return a, b, [one, two]


async def everything_but_turns_goes_on(
    alice: Client, bob: Client, a: session_pb2.Session, b: session_pb2.Session, points: list[str], volume: str
) -> None:
    """Reads and rewinds work for both; a turn of either is refused and writes nothing."""
    listed = await bob.sessions.ListSessions(session_service_pb2.ListSessionsRequest())
    assert [s.session_id for s in listed.sessions] == [b.session_id]
    assert (await bob.get(b.session_id)).session_id == b.session_id
    assert (await alice.get(a.session_id)).session_id == a.session_id
    # A rewind is how a caller gets space back: it is never refused for space.
    await bob.rewind(b.session_id, points[1], BOTH)
    assert not (Path(b.cwd) / "two.txt").exists()
    assert await point_ids(bob, b.session_id) == points[:1]
    before = await point_ids(alice, a.session_id)
    await refused_for_space(bob, b.session_id, volume)
    await refused_for_space(alice, a.session_id, volume)
    listed = await bob.sessions.ListSessions(session_service_pb2.ListSessionsRequest())
    assert [s.session_id for s in listed.sessions] == [b.session_id], "no fork was made"
    assert await point_ids(bob, b.session_id) == points[:1]
    assert await point_ids(alice, a.session_id) == before
    assert not (Path(b.cwd) / "never.txt").exists() and not (Path(a.cwd) / "never.txt").exists()


async def test_a_full_workspace_volume_stops_turns_only_and_the_state_dir_goes_on(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    with tmpfs(tmp_path / "workspaces") as volume:
        async with two_principals(state_dir, workspace_roots=(volume,)) as (alice, bob):
            a, b, points = await fill_while_bob_runs(alice, bob, volume)
            assert space(state_dir).free > 2 * RESERVE and (state_dir / RESERVE_NAME).exists()
            await everything_but_turns_goes_on(alice, bob, a, b, points, "workspace")
            for session in (a, b):
                whole(state_dir, session.session_id)
            # Alice frees the volume the way a caller can: her session, its workspace with it.
            await alice.sessions.DeleteSession(
                session_service_pb2.DeleteSessionRequest(session_id=a.session_id, delete_workspace=True)
            )
            assert space(volume).free > VOLUME // 2
            three = await recorded(bob, b.session_id, "write three.txt three")
            assert await point_ids(bob, b.session_id) == [points[0], three]
            assert (Path(b.cwd) / "three.txt").read_text() == "three\n"
            again = await alice.create()
            await recorded(alice, again.session_id, "write mine.txt mine")
            assert (Path(again.cwd) / "mine.txt").read_text() == "mine\n"
            for session in (again, b):
                whole(state_dir, session.session_id)


async def test_on_one_volume_the_reserve_keeps_the_ledger_and_transcripts_written(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "volume") as volume:
        state_dir = volume / "state"  # the workspaces under it: the default
        async with two_principals(state_dir) as (alice, bob):
            reserve = state_dir / RESERVE_NAME
            assert reserve.stat().st_size == RESERVE
            a, b, points = await fill_while_bob_runs(alice, bob, volume, given_back=RESERVE)
            assert not reserve.exists(), "released for what the service had to write"
            await everything_but_turns_goes_on(alice, bob, a, b, points, "state")
            for session in (a, b):
                whole(state_dir, session.session_id)
            # Alice's big file deleted: the reserve is made again, and turns start again.
            filled = await point_ids(alice, a.session_id)
            (Path(a.cwd) / "big").unlink()
            await until(reserve.exists)
            assert reserve.stat().st_size == RESERVE
            three = await recorded(bob, b.session_id, "write three.txt three")
            assert await point_ids(bob, b.session_id) == [points[0], three]
            mine = await recorded(alice, a.session_id, "write mine.txt mine")
            assert await point_ids(alice, a.session_id) == [*filled, mine]
            assert (Path(a.cwd) / "mine.txt").read_text() == "mine\n"
            for session in (a, b):
                whole(state_dir, session.session_id)
