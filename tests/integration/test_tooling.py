"""Generic gRPC tools against the real server (issue "Deployable", 7), with `buf curl` itself:
reflection in both protocols, Health/List, and the error-detail types in the reflected files."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from tests.integration.harness import Client, serve

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from lint_protos import ensure_buf  # noqa: E402  - the pinned buf `make lint` uses

MISSING = "7d3c54b0-2a55-4c39-9a43-0d8e0b1f9a11"


@pytest.fixture(scope="module")
def buf() -> Path:
    return ensure_buf()


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Client]:
    async with serve(tmp_path / "state") as c:
        yield c


async def curl(buf: Path, c: Client, *args: str) -> subprocess.CompletedProcess[str]:
    assert c.running is not None
    command = [str(buf), "curl", "--protocol", "grpc", "--http2-prior-knowledge", *args]
    command[-1] = f"http://{c.running.address}{command[-1]}"
    return await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("protocol", ["grpc-v1", "grpc-v1alpha"])
async def test_reflection_in_both_protocols_lists_every_method(
    buf: Path, server: Client, protocol: str
) -> None:
    done = await curl(buf, server, "--reflect-protocol", protocol, "--list-methods", "")
    assert done.returncode == 0, done.stderr
    methods = set(done.stdout.split())
    assert {
        "agent_rewind.v1.SessionService/Prompt",
        "agent_rewind.v1.RewindService/Rewind",
        "agent_rewind.v1.RewindService/WatchRewindEvents",
        "grpc.health.v1.Health/List",
    } <= methods


async def test_health_list_answers_every_service(buf: Path, server: Client) -> None:
    done = await curl(buf, server, "/grpc.health.v1.Health/List")
    assert done.returncode == 0, done.stderr
    statuses = json.loads(done.stdout)["statuses"]
    assert statuses == {
        name: {"status": "SERVING"}
        for name in ("", "agent_rewind.v1.SessionService", "agent_rewind.v1.RewindService")
    }


@pytest.mark.parametrize("service", ["agent_rewind.v1.SessionService", "agent_rewind.v1.RewindService"])
async def test_the_files_of_a_service_bring_the_error_detail_types(
    buf: Path, server: Client, service: str
) -> None:
    """A tool that fetches a service's files has google.rpc.ErrorInfo and BadRequest to decode
    the details of its errors."""
    done = await curl(
        buf,
        server,
        "-d",
        json.dumps({"file_containing_symbol": service}),
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)["fileDescriptorResponse"]["fileDescriptorProto"]
    files = {}
    for encoded in found:
        proto = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(encoded))
        files[proto.name] = proto
    assert "google/rpc/error_details.proto" in files
    details = {m.name for m in files["google/rpc/error_details.proto"].message_type}
    assert {"ErrorInfo", "BadRequest"} <= details
    own = next(f for f in files.values() if any(s.name == service.rsplit(".", 1)[1] for s in f.service))
    assert "google/rpc/error_details.proto" in own.dependency


async def test_an_error_through_buf_curl_carries_its_reason(buf: Path, server: Client) -> None:
    done = await curl(
        buf, server, "-d", json.dumps({"session_id": MISSING}), "/agent_rewind.v1.SessionService/GetSession"
    )
    assert done.returncode != 0
    error = json.loads(done.stderr[done.stderr.index("{") :])
    assert error["code"] == "not_found"
    assert [d["type"] for d in error["details"]] == ["google.rpc.ErrorInfo"]
