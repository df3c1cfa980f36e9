"""Metrics and the side ports, scraped during a real run."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from agent_rewind.api.v1 import rewind_service_pb2, session_service_pb2
from agent_rewind.testing.processes import cli_pids
from tests.integration.harness import FILES, error_info, prompt_id, serve


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_a_scrape_shows_what_the_service_did(tmp_path: Path) -> None:
    async with serve(tmp_path, metrics_listen="127.0.0.1:0", interrupt_timeout=0.05) as c:
        assert c.running is not None and c.running.side is not None and c.running.side.metrics is not None
        port = c.running.side.metrics.port
        before = await asyncio.to_thread(_scrape, port)
        session = await c.create()
        sid = session.session_id
        ids = [prompt_id(await c.prompt(sid, p)) for p in ("write a.txt v0", "edit a.txt v0 => v1")]
        watch = c.rewinds.WatchRewindEvents(rewind_service_pb2.WatchRewindEventsRequest())
        assert (await watch.read()).HasField("caught_up")
        await c.dry_run(sid, ids[0], FILES)
        await c.rewind(sid, ids[1], FILES)
        assert (await watch.read()).HasField("event")
        with pytest.raises(grpc.aio.AioRpcError):
            await c.rewind(sid, ids[0], FILES, expected_last_message_id="msg_not_the_last")
        # A turn that does not stop in time when interrupted: its process is killed. The CLI is
        # stopped first (CLI 2.1.332 may honour an interrupt within the 50 ms given it).
        turn = asyncio.create_task(c.prompt(sid, "sleep 30"))
        await c.wait_for_state(sid, 2)
        [pid] = cli_pids(sid)
        os.kill(pid, signal.SIGSTOP)
        try:
            await c.sessions.Interrupt(session_service_pb2.InterruptRequest(session_id=sid))
            await turn
        finally:
            if pid in cli_pids(sid):
                os.kill(pid, signal.SIGKILL)
        # A process that cannot start: its workspace was removed behind the service's back.
        other = await c.create()
        await c.sessions.CloseSession(session_service_pb2.CloseSessionRequest(session_id=other.session_id))
        shutil.rmtree(other.cwd)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.prompt(other.session_id, "say hi")
        assert error_info(err.value).reason == "AGENT_UNAVAILABLE"

        after = await asyncio.to_thread(_scrape, port)
        watch.cancel()

    def grew(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert grew("agent_rewind_rpcs_total", method="Prompt", code="OK") >= 3
    assert grew("agent_rewind_rpcs_total", method="Rewind", code="OK") == 1
    assert grew("agent_rewind_rpcs_total", method="Rewind", code="ABORTED") == 1
    assert grew("agent_rewind_rpcs_total", method="CreateSession", code="OK") == 2
    assert grew("agent_rewind_rpc_duration_seconds_count", method="Rewind") == 2
    assert grew("agent_rewind_rewinds_total", mode="files", outcome="applied", source="checkpoint") == 1
    assert grew("agent_rewind_rewinds_total", mode="files", outcome="refused", source="checkpoint") == 1
    assert grew("agent_rewind_rewind_duration_seconds_count", mode="files") == 1
    assert grew("agent_rewind_cli_starts_total") >= 2
    assert grew("agent_rewind_cli_start_failures_total") == 1
    assert grew("agent_rewind_cli_kills_total") == 1
    assert grew("agent_rewind_events_sent_total") >= 1
    assert grew("agent_rewind_ledger_write_seconds_count") > 0
    assert _value(after, "agent_rewind_watchers") == 1
    # The first session's process was killed (hibernated now), the other is closed.
    assert _value(after, "agent_rewind_sessions", state="hibernated") == 1
    assert _value(after, "agent_rewind_sessions", state="closed") == 1
    assert _value(after, "agent_rewind_sessions", state="idle") == 0
    assert _value(after, "agent_rewind_live_processes") == 0
    assert _value(after, "agent_rewind_live_processes_max") > 0
    assert _value(after, "agent_rewind_live_processes_waiting") == 0


async def test_the_health_port_answers_only_health_in_plaintext(tmp_path: Path) -> None:
    async with serve(tmp_path, health_listen="127.0.0.1:0") as c:
        assert c.running is not None and c.running.side is not None
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{c.running.side.health_port}")
        try:
            probe = health_pb2_grpc.HealthStub(channel)
            answer = await probe.Check(health_pb2.HealthCheckRequest(service=""))
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
            # Nothing else is served there.
            other = channel.unary_unary("/agent_rewind.v1.RewindService/GetCapabilities")
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await other(b"")
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
            # A stop turns it NOT_SERVING first.
            await c.running.health.enter_graceful_shutdown()
            answer = await probe.Check(health_pb2.HealthCheckRequest(service=""))
            assert answer.status == health_pb2.HealthCheckResponse.NOT_SERVING
        finally:
            await channel.close()
