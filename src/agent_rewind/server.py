"""The gRPC server: wiring, the model backend, health, reflection, graceful shutdown."""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import dataclass

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from agent_rewind.api.v1 import (
    rewind_service_pb2,
    rewind_service_pb2_grpc,
    session_service_pb2,
    session_service_pb2_grpc,
)
from agent_rewind.config import Config
from agent_rewind.logs import configure
from agent_rewind.rewind.engine import RewindEngine
from agent_rewind.rpc.requests import PageTokens
from agent_rewind.rpc.rewind_service import RewindServicer
from agent_rewind.rpc.session_service import SessionServicer
from agent_rewind.sessions.adapter import SdkAgentClient
from agent_rewind.sessions.registry import SessionRegistry
from agent_rewind.sessions.worker import ClientFactory
from agent_rewind.store.ledger import Ledger
from agent_rewind.testing.scripted_model import ScriptedModel

log = structlog.get_logger(__name__)

SERVICE_NAMES = (
    session_service_pb2.DESCRIPTOR.services_by_name["SessionService"].full_name,
    rewind_service_pb2.DESCRIPTOR.services_by_name["RewindService"].full_name,
)


def cli_environment(config: Config, model: ScriptedModel | None) -> dict[str, str]:
    """The environment of every CLI process, on top of the service's own.

    With the offline model, every ANTHROPIC_* variable of the service's environment is
    blanked so a stray key or gateway can never change where the CLI sends requests.
    """
    env = {
        "CLAUDE_CONFIG_DIR": str(config.claude_config_dir),
        "HOME": str(config.state_dir / "home"),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    if model is not None:
        env.update({k: "" for k in os.environ if k.startswith("ANTHROPIC_")})
        env.update(ANTHROPIC_BASE_URL=model.base_url, ANTHROPIC_API_KEY="offline-scripted-model")
    env.update(config.extra_env)
    return env


def choose_backend(config: Config) -> str:
    if config.model != "auto":
        return config.model
    return "anthropic" if os.environ.get("ANTHROPIC_API_KEY") else "offline"


@dataclass
class RunningServer:
    server: grpc.aio.Server
    port: int
    registry: SessionRegistry
    ledger: Ledger
    health: health.aio.HealthServicer
    model: ScriptedModel | None
    config: Config
    _stopped: bool = False

    @property
    def address(self) -> str:
        host = self.config.listen.rsplit(":", 1)[0]
        return f"{host}:{self.port}"

    async def stop(self, grace: float | None = None) -> None:
        """Health NOT_SERVING, refuse new work, give running turns a grace period, end every CLI."""
        if self._stopped:
            return
        self._stopped = True
        grace = self.config.shutdown_grace if grace is None else grace
        log.info("shutting down", grace=grace)
        await self.health.enter_graceful_shutdown()
        await self.registry.shutdown(grace)
        await self.server.stop(grace=1.0)
        if self.model is not None:
            self.model.stop()
        self.ledger.close()
        log.info("stopped")


async def start(config: Config, client_factory: ClientFactory | None = None) -> RunningServer:
    """Starts a server for `config` (which must be resolved) and returns once it listens."""
    config.state_dir.mkdir(parents=True, exist_ok=True)
    for root in config.workspace_roots:
        root.mkdir(parents=True, exist_ok=True)
    (config.state_dir / "home").mkdir(exist_ok=True)
    backend = choose_backend(config)
    model = ScriptedModel().start() if backend == "offline" else None
    log.info("model backend", backend=backend, scripted_model=model.base_url if model else None)
    if backend == "anthropic" and not (
        os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_AUTH_TOKEN")
    ):
        log.warning("--model anthropic without ANTHROPIC_API_KEY: turns will fail to authenticate")
    ledger = Ledger(config.ledger_path)
    factory = client_factory or (lambda spec: SdkAgentClient(spec, connect_timeout=config.connect_timeout))
    registry = SessionRegistry(config, ledger, factory, cli_environment(config, model))
    engine = RewindEngine(ledger)

    server = grpc.aio.server()
    tokens = PageTokens(ledger.secret("page_tokens"))
    session_service_pb2_grpc.add_SessionServiceServicer_to_server(SessionServicer(registry, tokens), server)
    rewind_service_pb2_grpc.add_RewindServiceServicer_to_server(
        RewindServicer(registry, engine, tokens), server
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    port = server.add_insecure_port(config.listen)
    if port == 0:
        raise OSError(f"cannot listen on {config.listen}")
    # Interrupted rewinds are finished before any call is admitted.
    await engine.recover(registry.workers)
    await server.start()
    for name in (*SERVICE_NAMES, ""):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    running = RunningServer(server, port, registry, ledger, health_servicer, model, config)
    log.info(
        "serving", address=running.address, state_dir=str(config.state_dir), sessions=len(registry.workers)
    )
    return running


async def _serve(config: Config) -> None:
    running = await start(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await running.stop()


def run(config: Config) -> int:
    """Serves until SIGTERM or SIGINT. The entry point of `agent-rewind serve`."""
    configure(config.log_format, config.log_level)
    try:
        asyncio.run(_serve(config))
    except OSError as err:
        log.error("cannot start", error=str(err))
        return 1
    return 0
