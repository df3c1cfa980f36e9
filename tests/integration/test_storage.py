"""What a session holds, measured, and the storage limits, end to end: a real server, real Claude
Code processes, the scripted model. A turn that writes a large file shows in the session's usage;
a session, or a principal's sessions together, at their limit start no turn and no fork, with the
contract's metadata, while rewinds, reads and deletes go on and bring them back under it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2

from agent_rewind.api.v1 import session_pb2, session_service_pb2
from tests.integration.harness import FILES, Client, error_info, prompt_id, serve

MIB = 1 << 20


def _bash_allowed() -> struct_pb2.Struct:
    options = struct_pb2.Struct()
    options.update({"allowed_tools": ["Bash"]})
    return options


async def _session(c: Client, **kw: Any) -> tuple[str, Path]:
    session = await c.create(options=_bash_allowed(), **kw)
    return session.session_id, Path(session.cwd)


async def _usage(c: Client, sid: str, at_least: int = 0, within: float = 20.0) -> session_pb2.StorageUsage:
    """The session's storage, once it shows a workspace of at least `at_least` bytes (measured in
    the background after a turn: polled, never slept for)."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        storage = (await c.get(sid)).storage
        if storage.workspace_bytes >= at_least and storage.history_bytes > 0:
            return storage
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"the usage never reached {at_least} bytes: {storage}")
        await asyncio.sleep(0.05)


async def _refused(call: Any) -> dict[str, str]:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.value.details()
    info = error_info(err.value)
    assert info.reason == "QUOTA_EXCEEDED"
    return dict(info.metadata)


async def test_the_usage_grows_with_a_large_file_and_shrinks_when_it_is_rewound_away(tmp_path: Path) -> None:
    async with serve(tmp_path, workspace_snapshots=True) as c:
        sid, cwd = await _session(c)
        await c.prompt(sid, "write small.txt tiny")
        before = await _usage(c, sid)
        assert before.workspace_bytes < MIB
        point = prompt_id(await c.prompt(sid, "bash head -c 6000000 /dev/urandom > big.bin"))
        grown = await _usage(c, sid, at_least=6_000_000)
        # The transcript and the snapshot of the random file count in the history.
        assert grown.history_bytes > before.history_bytes + 5_000_000
        await c.rewind(sid, point, FILES)
        assert not (cwd / "big.bin").exists()
        deadline = asyncio.get_running_loop().time() + 20
        while (await c.get(sid)).storage.workspace_bytes >= MIB:  # measured again after the rewind
            assert asyncio.get_running_loop().time() < deadline, "the rewind's usage was never measured"
            await asyncio.sleep(0.05)


async def test_a_session_at_its_limit_starts_no_turn_or_fork_until_a_rewind_frees_it(tmp_path: Path) -> None:
    async with serve(tmp_path, workspace_snapshots=True, max_session_storage=4 * MIB) as c:
        sid, cwd = await _session(c)
        await c.prompt(sid, "write a.txt small")
        point = prompt_id(await c.prompt(sid, "bash head -c 5000000 /dev/zero > big.bin\nsay done"))
        assert (cwd / "big.bin").stat().st_size == 5_000_000, "the turn that crossed the limit finished"
        # The next prompt, sent at once, is judged by the figure the last turn left.
        said = await _refused(c.prompt(sid, "write b.txt more"))
        assert said["limit"] == "session_storage" and said["max_bytes"] == str(4 * MIB)
        assert int(said["used_bytes"]) >= 5_000_000
        assert not (cwd / "b.txt").exists()
        await _refused(
            c.sessions.ForkSession(session_service_pb2.ForkSessionRequest(session_id=sid, message_id=point))
        )
        # Reads, dry runs and rewinds are never refused for storage: they are the way back.
        assert (await c.get(sid)).storage.workspace_bytes >= 5_000_000
        assert (await c.dry_run(sid, point, FILES)).files.can_rewind
        await c.rewind(sid, point, FILES)
        assert not (cwd / "big.bin").exists()
        await c.prompt(sid, "write b.txt more")
        assert (cwd / "b.txt").read_text() == "more\n"


async def test_a_principal_s_sessions_together_at_its_limit_start_no_turn_until_one_is_deleted(
    tmp_path: Path,
) -> None:
    async with serve(tmp_path, workspace_snapshots=False, max_principal_storage=5 * MIB) as c:
        first, _ = await _session(c)
        second, cwd = await _session(c)
        await c.prompt(first, "bash head -c 3000000 /dev/zero > one.bin")
        await c.prompt(second, "bash head -c 3000000 /dev/zero > two.bin")
        for sid in (first, second):
            said = await _refused(c.prompt(sid, "write c.txt see"))
            assert said["limit"] == "principal_storage" and int(said["used_bytes"]) >= 6_000_000
        await c.sessions.DeleteSession(
            session_service_pb2.DeleteSessionRequest(session_id=first, delete_workspace=True)
        )
        await c.prompt(second, "write c.txt see")
        assert (cwd / "c.txt").read_text() == "see\n"
