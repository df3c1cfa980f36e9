"""The gRPC server: wiring, the model backend, health, reflection, graceful shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import os
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from agent_rewind import logs, metrics, tasks
from agent_rewind.access import AccessFile, AccessFileError
from agent_rewind.api.v1 import (
    rewind_service_pb2,
    session_service_pb2,
)
from agent_rewind.config import CREDENTIAL_VARIABLES, Config
from agent_rewind.errors import StorageUnavailable
from agent_rewind.events import EventHub
from agent_rewind.logs import configure
from agent_rewind.metrics import MetricsServer
from agent_rewind.replicas import Membership, Owners
from agent_rewind.rewind.engine import RewindEngine
from agent_rewind.rpc import registration, tooling
from agent_rewind.rpc.auth import Authenticator
from agent_rewind.rpc.forwarding import Forwarder
from agent_rewind.rpc.requests import PageTokens
from agent_rewind.rpc.rewind_service import RewindServicer
from agent_rewind.rpc.session_service import SessionServicer
from agent_rewind.sandbox import CommandSandbox, SandboxUnavailable, environment
from agent_rewind.sandbox.commands import private_directories, session_dir
from agent_rewind.sandbox.proxy import EgressProxy, HostPattern, HostPatternError
from agent_rewind.sessions import options as session_options
from agent_rewind.sessions.adapter import AgentClient, ClientSpec, SdkAgentClient
from agent_rewind.sessions.live import LiveSlots, default_max_live
from agent_rewind.sessions.policy import ToolPolicy
from agent_rewind.sessions.process import ClientFactory
from agent_rewind.sessions.registry import SessionRegistry
from agent_rewind.sessions.snapshotting import Snapshots
from agent_rewind.sessions.worker import WorkerContext
from agent_rewind.snapshots import Limits
from agent_rewind.snapshots import git as snapshot_git
from agent_rewind.store.ledger import Ledger, SchemaTooNew, now
from agent_rewind.store.sqlite import SqliteLedger
from agent_rewind.testing.scripted_model import ScriptedModel

log = structlog.get_logger(__name__)

SESSION_SERVICE = session_service_pb2.DESCRIPTOR.services_by_name["SessionService"]
REWIND_SERVICE = rewind_service_pb2.DESCRIPTOR.services_by_name["RewindService"]
SERVICE_NAMES = (SESSION_SERVICE.full_name, REWIND_SERVICE.full_name)
# How long a stop waits for detached work (a rewind, undo, fork or deletion) after the server stops.
DETACHED_GRACE = 10.0


def cli_environment(config: Config, model: ScriptedModel | None) -> dict[str, str]:
    """The environment of every CLI process: an allowlist of the service's (sandbox/environment.py).

    With the offline model, no ANTHROPIC_* variable of the service's environment is passed on,
    so a stray key or gateway can never change where the CLI sends requests.
    """
    return environment.cli_environment(
        os.environ,
        config_dir=str(config.claude_config_dir),
        home=str(config.state_dir / "home"),
        offline_model_url=model.base_url if model is not None else None,
        extra=config.extra_env,
    )


def service_files(config: Config) -> list[Path]:
    """The service's own files and directories, which no command of an agent may read."""
    files = [config.access_file, config.tls_cert, config.tls_key, config.tls_client_ca, config.replica_ca]
    files.append(config.database_password_file)
    return [config.state_dir, *config.workspace_roots, *(f for f in files if f is not None)]


def _hold_state_dir(config: Config) -> int | None:
    """Locks the state dir for this server's life (released by the kernel on any exit): a second
    server on it would register a newer epoch and fence this one off. With --shared-storage every
    replica mounts the same state dir, and the replica directory keeps them apart instead."""
    if config.shared_storage:
        return None
    path = config.state_dir / "server.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 512, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise StartError(
            f"the state dir {config.state_dir} is in use by another agent-rewind server ({holder}); "
            "stop it, or give this one a --state-dir of its own"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}, listening on {config.listen}\n".encode(), 0)
    return fd


async def _start_sandbox(config: Config) -> tuple[CommandSandbox | None, EgressProxy | None]:
    """The command sandbox (and, with allowed hosts, its egress proxy), checked to work here."""
    if config.sandbox == "off":
        log.warning(
            "sandbox off (--sandbox off): the agent's commands run unconfined, as the service's "
            "user, with its files and network"
        )
        return None, None
    try:
        patterns = [HostPattern.parse(h) for h in config.sandbox_allow_hosts]
    except HostPatternError as err:
        raise StartError(f"--sandbox-allow-host: {err}", usage=True) from err
    root = config.sessions_dir
    try:
        sandbox = CommandSandbox.find(root, need_socat=bool(patterns), hidden=service_files(config))
        await asyncio.to_thread(sandbox.probe)
    except SandboxUnavailable as err:
        raise StartError(str(err), usage=True) from err
    if not patterns:
        log.info("sandbox on: commands confined, no network")
        return sandbox, None
    proxy = EgressProxy(config.state_dir / "proxy.sock", patterns)
    await proxy.start()
    log.info(
        "sandbox on: commands confined, network only to the allowed hosts", hosts=[str(p) for p in patterns]
    )
    return dataclasses.replace(sandbox, proxy_socket=proxy.socket_path), proxy


class StartError(Exception):
    """The server cannot start with this configuration; the message says why. A usage error
    (a flag this host cannot honour) exits 2, like a bad flag."""

    def __init__(self, message: str, *, usage: bool = False) -> None:
        super().__init__(message)
        self.usage = usage


def choose_backend(config: Config, environ: Mapping[str, str] | None = None) -> str:
    """The model backend: `--model` as given, or for `auto` the real API whenever a credential the
    CLI accepts is present (never the scripted model by accident)."""
    env = os.environ if environ is None else environ
    credentials = [v for v in CREDENTIAL_VARIABLES if env.get(v)]
    if config.model == "anthropic" and not credentials:
        raise StartError(
            "--model anthropic, but no credential for the Claude Code CLI is set: set one of "
            + ", ".join(CREDENTIAL_VARIABLES)
        )
    if config.model != "auto":
        return config.model
    return "anthropic" if credentials else "offline"


@dataclass
class RunningServer:
    server: grpc.aio.Server
    port: int
    registry: SessionRegistry
    ledger: Ledger
    health: health.aio.HealthServicer
    model: ScriptedModel | None
    config: Config
    engine: RewindEngine
    backend: str
    hub: EventHub
    authenticated: bool = False
    side: SidePorts | None = None
    snapshots: Snapshots | None = None
    sandbox: CommandSandbox | None = None
    proxy: EgressProxy | None = None
    state_lock: int | None = None
    membership: Membership | None = None
    forwarder: Forwarder | None = None
    _stopped: bool = False
    _chores: list[asyncio.Task[None]] = field(default_factory=list)

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
        # Watchers reconnect (elsewhere, or here after the restart) with their cursor.
        await self.hub.close()
        await self.registry.shutdown(grace)
        await self.server.stop(grace=1.0)
        # A rewind, undo, fork or deletion whose caller hung up still runs to its end, before the
        # ledger it writes to closes (what is left then is recovered from its intent at the next start).
        left = await tasks.drain(DETACHED_GRACE)
        if left:
            log.warning("detached work still running at shutdown", tasks=sorted(t.get_name() for t in left))
        for chore in self._chores:
            chore.cancel()
        await asyncio.gather(*self._chores, return_exceptions=True)
        if self.model is not None:
            self.model.stop()
        if self.forwarder is not None:
            await self.forwarder.close()
        if self.membership is not None:
            await self.membership.leave()
        await self.ledger.close()
        if self.snapshots is not None:
            self.snapshots.close()
        if self.side is not None:
            await self.side.stop()
        if self.proxy is not None:
            await self.proxy.close()
        if self.state_lock is not None:
            with contextlib.suppress(OSError):
                os.close(self.state_lock)
            self.state_lock = None
        log.info("stopped")


class SidePorts:
    """The plaintext side ports: Prometheus metrics, and grpc.health.v1 alone for probes."""

    def __init__(self) -> None:
        self.metrics: MetricsServer | None = None
        self.health: grpc.aio.Server | None = None
        self.health_port = 0
        self._unobserve: Callable[[], None] | None = None

    async def start(
        self,
        config: Config,
        health_servicer: health.aio.HealthServicer,
        registry: SessionRegistry,
        hub: EventHub,
        live: LiveSlots,
    ) -> None:
        self._unobserve = metrics.observe(
            registry.states, lambda: hub.watchers, lambda: (live.held, live.capacity)
        )
        if config.metrics_listen:
            self.metrics = MetricsServer(config.metrics_listen)
            log.info("serving metrics", address=config.metrics_listen, port=self.metrics.port)
        if config.health_listen:
            self.health = grpc.aio.server()
            health_pb2_grpc.add_HealthServicer_to_server(health_servicer, self.health)
            self.health_port = self.health.add_insecure_port(config.health_listen)
            if self.health_port == 0:
                raise OSError(f"cannot listen on {config.health_listen}")
            await self.health.start()
            log.info("serving health", address=config.health_listen, port=self.health_port)

    async def stop(self) -> None:
        if self.health is not None:
            await self.health.stop(grace=0)
        if self.metrics is not None:
            await asyncio.to_thread(self.metrics.stop)
        if self._unobserve is not None:
            self._unobserve()
            self._unobserve = None


def default_factory(
    config: Config, sandbox: CommandSandbox | None = None, proxy: EgressProxy | None = None
) -> ClientFactory:
    def make(spec: ClientSpec) -> AgentClient:
        policy = ToolPolicy(spec.cwd, spec.options.get("allowed_tools") or ())
        if proxy is not None:
            proxy.narrow(spec.session_id, session_options.sandbox_hosts(spec.options))
        # Its own temporary, scratch and runtime directories (erased with it), and with the
        # sandbox on, the program that confines its commands.
        own = (
            sandbox.prepare(
                spec.session_id,
                spec.cwd,
                proxy=proxy is not None,
                proxy_url=proxy.url(spec.session_id) if proxy is not None else "",
            )
            if sandbox is not None
            else private_directories(session_dir(config.sessions_dir, spec.session_id))
        )
        spec = dataclasses.replace(spec, env={**spec.env, **own.environment()})
        return SdkAgentClient(spec, policy, connect_timeout=config.connect_timeout)

    return make


def _ping_ms(config: Config) -> int:
    """How often a replica pings another while a call forwarded to it is open: a third of the lease."""
    return max(1000, int(config.replica_lease * 1000 / 3))


async def _open_ledger(config: Config) -> Ledger:
    """The SQLite file in the state dir, or PostgreSQL with --database-url."""
    if not config.database_url:
        return await SqliteLedger.open(config.ledger_path, busy_timeout=config.ledger_busy_timeout)
    try:
        from agent_rewind.store.postgres import PostgresLedger
    except ImportError as err:
        raise ImportError(
            f"--database-url needs the PostgreSQL driver: pip install 'agent-rewind[postgres]' ({err})"
        ) from err
    password = None
    if config.database_password_file is not None:
        try:
            password = config.database_password_file.read_text().splitlines()[0].strip()
        except (OSError, IndexError, UnicodeDecodeError) as err:
            raise StartError(f"--database-password-file {config.database_password_file}: {err}") from err
    ledger = await PostgresLedger.open(
        config.database_url, lock_timeout=config.ledger_busy_timeout, password=password
    )
    log.info("ledger", backend="postgresql")
    return ledger


async def _forget_old_requests(ledger: Ledger, retention: float) -> None:
    """Request ids are remembered for `retention` seconds (--request-id-retention)."""
    while True:
        try:
            dropped = await ledger.forget_requests(now() - timedelta(seconds=retention))
            if dropped:
                log.info("request ids past their retention forgotten", count=dropped)
        except Exception as err:  # a full disk now is no reason to stop serving
            log.warning("could not forget old request ids", error=str(err))
        await asyncio.sleep(min(3600.0, max(retention / 10, 1.0)))


async def _trim_events(ledger: Ledger, config: Config) -> None:
    """Drops events beyond --event-retention (seconds) and --event-retention-count."""
    age, count = config.event_retention, config.event_retention_count
    if not age and not count:
        return
    dropped = await ledger.trim_events(
        keep=count or None, older_than=now() - timedelta(seconds=age) if age else None
    )
    if dropped:
        log.info("events past their retention dropped", count=dropped)


async def _keep_trimming_events(ledger: Ledger, config: Config) -> None:
    every = min(600.0, max(config.event_retention / 10, 1.0)) if config.event_retention else 60.0
    while True:
        await asyncio.sleep(every)
        try:
            await _trim_events(ledger, config)
        except Exception as err:  # a full disk now is no reason to stop serving
            log.warning("could not drop old events", error=str(err))


_LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
# The largest request the server reads: a prompt is at most 512 KiB of text (rpc/requests.py).
MAX_MESSAGE_BYTES = 2 * 1024 * 1024


def check_replicas(config: Config) -> None:
    if config.shared_storage and not config.database_url:
        raise StartError("--shared-storage is for replicas sharing a database: it needs --database-url")


def check_transport(config: Config) -> None:
    """Beyond loopback, callers must authenticate over TLS, unless the operator says --insecure."""
    if (config.tls_cert is None) != (config.tls_key is None):
        raise StartError("--tls-cert and --tls-key go together")
    if config.tls_client_ca is not None and config.tls_cert is None:
        raise StartError("--tls-client-ca needs --tls-cert and --tls-key")
    if config.tls_client_ca is not None and config.access_file is None:
        raise StartError("--tls-client-ca names principals by certificate: it needs --access-file")
    host = config.listen.rsplit(":", 1)[0]
    secured = config.access_file is not None and config.tls_cert is not None
    if host not in _LOOPBACK and not secured:
        if not config.insecure:
            raise StartError(
                f"listening on {config.listen} without authentication and TLS would let anyone who can "
                "reach the port run agents on this host: pass --access-file with --tls-cert/--tls-key, "
                "listen on loopback, or say --insecure"
            )
        log.warning(
            "insecure: listening beyond loopback without authentication and TLS (--insecure)",
            listen=config.listen,
        )


def _replica_credentials(config: Config) -> grpc.ChannelCredentials | None:
    """How this replica reaches the others: TLS when it serves TLS (they do too), trusting
    --replica-ca (else --tls-client-ca, else its own certificate), and presenting its own
    certificate for mutual TLS."""
    if config.tls_cert is None or config.tls_key is None:
        return None
    roots = config.replica_ca or config.tls_client_ca or config.tls_cert
    return grpc.ssl_channel_credentials(
        root_certificates=roots.read_bytes(),
        private_key=config.tls_key.read_bytes(),
        certificate_chain=config.tls_cert.read_bytes(),
    )


def _credentials(config: Config) -> grpc.ServerCredentials | None:
    if config.tls_cert is None or config.tls_key is None:
        return None
    client_ca = config.tls_client_ca.read_bytes() if config.tls_client_ca is not None else None
    return grpc.ssl_server_credentials(
        [(config.tls_key.read_bytes(), config.tls_cert.read_bytes())],
        root_certificates=client_ca,
        require_client_auth=client_ca is not None,
    )


async def start(config: Config, client_factory: ClientFactory | None = None) -> RunningServer:
    """Starts a server for `config` (which must be resolved) and returns once it listens."""
    backend = choose_backend(config)
    for variable in CREDENTIAL_VARIABLES:
        logs.secret(os.environ.get(variable, ""))
    check_transport(config)
    check_replicas(config)
    try:
        access = AccessFile(config.access_file) if config.access_file is not None else None
        credentials = _credentials(config)
        replica_credentials = _replica_credentials(config)
    except (AccessFileError, OSError) as err:
        raise StartError(str(err)) from err
    authenticator = Authenticator(access)
    config.state_dir.mkdir(parents=True, exist_ok=True)
    lock = _hold_state_dir(config)
    try:
        # What is made is closed again, latest first, if the start fails before it serves: an
        # embedding process, or a retry, is left with no thread, connection or port of it.
        async with contextlib.AsyncExitStack() as made:
            running = await _make(
                made, config, client_factory, authenticator, credentials, replica_credentials, backend, lock
            )
            running.state_lock = lock
            made.pop_all()
    except BaseException:
        if lock is not None:
            os.close(lock)
        raise
    log.info(
        "serving",
        address=running.address,
        state_dir=str(config.state_dir),
        sessions=len(running.registry.workers),
        backend=backend,
    )
    return running


async def _make(
    made: contextlib.AsyncExitStack,
    config: Config,
    client_factory: ClientFactory | None,
    authenticator: Authenticator,
    credentials: grpc.ServerCredentials | None,
    replica_credentials: grpc.ChannelCredentials | None,
    backend: str,
    lock: int | None,
) -> RunningServer:
    for root in config.workspace_roots:
        root.mkdir(parents=True, exist_ok=True)
    (config.state_dir / "home").mkdir(exist_ok=True)
    sandbox, proxy = await _start_sandbox(config)
    if proxy is not None:
        made.push_async_callback(proxy.close)
    model = ScriptedModel().start() if backend == "offline" else None
    if model is not None:
        made.callback(model.stop)
        log.warning(
            "model backend: the offline SCRIPTED model, not Claude; for the real API pass --model anthropic"
            " with a credential",
            scripted_model=model.base_url,
        )
    else:
        log.info("model backend", backend=backend)
    try:
        ledger = await _open_ledger(config)
    except (SchemaTooNew, StorageUnavailable, ImportError, StartError) as err:
        raise err if isinstance(err, StartError) else StartError(str(err)) from err
    made.push_async_callback(ledger.close)
    try:
        await _trim_events(ledger, config)
    except Exception as err:
        log.warning("could not drop old events", error=str(err))
    hub = EventHub(ledger, max_lag=config.watcher_buffer)
    made.push_async_callback(hub.close)
    await hub.start()
    # A capability is what works on this host now: without git there are no snapshots (new
    # sessions take none, GetCapabilities says so, and the CLI's checkpoints serve files rewinds).
    missing = snapshot_git.available()
    if missing is not None:
        log.warning("workspace snapshots are off: " + missing)
    snapshots = (
        Snapshots(
            config.state_dir / "snapshots",
            ledger,
            Limits(
                max_file_bytes=config.snapshot_max_file_bytes,
                max_total_bytes=config.snapshot_max_bytes,
                timeout_s=config.snapshot_timeout,
            ),
            watch=config.snapshot_watch,
        )
        if missing is None
        else None
    )
    if snapshots is not None:
        made.callback(snapshots.close)
    engine = RewindEngine(ledger, publish=hub.publish, snapshots=snapshots)
    live = LiveSlots(config.max_live_sessions or default_max_live())
    log.info("live process bound", max_live_sessions=live.capacity)
    ctx = WorkerContext(
        ledger=ledger,
        client_factory=client_factory or default_factory(config, sandbox, proxy),
        cli_env=cli_environment(config, model),
        claude_config_dir=config.claude_config_dir,
        idle_timeout=config.idle_timeout,
        interrupt_timeout=config.interrupt_timeout,
        resolve_pending=engine.resolve_pending,
        project_settings=config.trust_project_settings,
        live=live,
        snapshots=snapshots,
        snapshot_retention=config.snapshot_retention,
        replica_id=config.replica_id,
    )
    membership = Membership(ledger, config.replica_id, config.advertise_address, config.replica_lease)
    owners: Owners | None = None
    if config.database_url:  # a shared ledger: other replicas may own sessions
        owners = Owners(
            ledger, membership, lambda session_id: session_id in registry.workers, config.placement
        )
    registry = SessionRegistry(config=config, ledger=ledger, ctx=ctx, publish=hub.publish, owners=owners)
    forwarder: Forwarder | None = None
    if owners is not None:
        secret = (await ledger.secret("replica_forwarding")).hex()
        authenticator.replica_secret = secret
        forwarder = Forwarder(
            owners,
            secret,
            replica_credentials,
            options=(
                ("grpc.max_receive_message_length", 16 * MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                # An owner that stops answering (frozen, cut off) fails the calls forwarded to it
                # within two pings, rather than holding them for the caller's whole deadline.
                ("grpc.keepalive_time_ms", _ping_ms(config)),
                ("grpc.keepalive_timeout_ms", _ping_ms(config)),
                ("grpc.http2.ping_timeout_ms", _ping_ms(config)),  # (what gRPC 1.85 reads)
                # Nor does a connection to it hang for gRPC's default 20 s; and one that came back
                # is connected again within two pings, however long it was away.
                ("grpc.min_reconnect_backoff_ms", 2 * _ping_ms(config)),
                ("grpc.max_reconnect_backoff_ms", 2 * _ping_ms(config)),
                ("grpc.keepalive_permit_without_calls", 0),
                ("grpc.http2.max_pings_without_data", 0),
            ),
        )
        made.push_async_callback(forwarder.close)

    server = grpc.aio.server(
        options=[
            # A port in use is "address in use", never shared with another server.
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", 16 * MAX_MESSAGE_BYTES),
            # The other replicas' keepalive pings, during a turn that sends nothing for minutes.
            ("grpc.http2.min_recv_ping_interval_without_data_ms", _ping_ms(config) // 2),
            ("grpc.http2.max_ping_strikes", 0),
        ]
    )
    made.push_async_callback(server.stop, 0)
    tokens = PageTokens(await ledger.secret("page_tokens"))
    registration.add(
        server,
        SESSION_SERVICE,
        SessionServicer(registry, engine, tokens, authenticator, forwarder, offline=backend == "offline"),
    )
    registration.add(
        server,
        REWIND_SERVICE,
        RewindServicer(
            registry,
            engine,
            tokens,
            authenticator,
            backend,
            hub,
            live.capacity,
            membership,
            forwarder,
            sandbox_hosts=tuple(config.sandbox_allow_hosts) if sandbox is not None else None,
            max_watch_streams=config.max_watch_streams_per_principal,
        ),
    )
    health_servicer = tooling.Health()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    tooling.enable_reflection(server, (SESSION_SERVICE, REWIND_SERVICE))
    try:
        port = (
            server.add_secure_port(config.listen, credentials)
            if credentials is not None
            else server.add_insecure_port(config.listen)
        )
    except RuntimeError:  # grpc's "Failed to bind"
        port = 0
    if port == 0:
        raise OSError(f"cannot listen on {config.listen}: the address is in use, or not one of this host's")
    if lock is not None:  # who holds the state dir, for the next server that tries
        os.ftruncate(lock, 0)
        os.pwrite(
            lock, f"pid {os.getpid()}, listening on {config.listen.rsplit(':', 1)[0]}:{port}\n".encode(), 0
        )
    for name in (*SERVICE_NAMES, ""):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)

    async def give_up() -> None:
        """Fenced off (another process registered as this replica, or took its sessions over),
        or, on shared storage, a lease it could not renew: it ends every agent now, so that no
        session runs on two replicas, and lets go of its sessions (calls for them are forwarded
        to their owner). Its health stays NOT_SERVING (in Kubernetes, the liveness probe
        restarts it)."""
        await registry.abandon()
        for name in (*SERVICE_NAMES, ""):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)

    async def take_over(replica_id: str, session_ids: list[str]) -> None:
        adopted = await registry.adopt(session_ids)
        await engine.recover({worker.session_id: worker for worker in adopted})

    membership.on_fenced = give_up
    if config.shared_storage:
        membership.on_lease_lost = give_up
        membership.take_over = take_over
    if membership.address.endswith(":0"):  # an ephemeral port: the one bound
        membership.address = f"{membership.address.rpartition(':')[0]}:{port}"
    side = SidePorts()
    made.push_async_callback(side.stop)
    # Probes see NOT_SERVING while interrupted rewinds are finished, before any call is admitted.
    await side.start(config, health_servicer, registry, hub, live)
    # In the directory before loading and recovery write anything: from here every write is
    # fenced.
    made.push_async_callback(membership.leave)
    await membership.join()
    made.push_async_callback(registry.shutdown, 0)
    await registry.load()
    await engine.recover(registry.workers)
    await server.start()
    for name in (*SERVICE_NAMES, ""):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    running = RunningServer(
        server, port, registry, ledger, health_servicer, model, config, engine, backend, hub
    )
    running.side = side
    running.snapshots = snapshots
    running.sandbox = sandbox
    running.proxy = proxy
    running.membership = membership
    running.forwarder = forwarder
    running.authenticated = authenticator.enabled
    running._chores.append(asyncio.create_task(_forget_old_requests(ledger, config.request_id_retention)))
    running._chores.append(asyncio.create_task(_keep_trimming_events(ledger, config)))
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
    except StartError as err:
        log.error("cannot start", error=str(err))
        if err.usage:
            print(f"agent-rewind serve: error: {err}", file=sys.stderr)
            return 2
        return 1
    except OSError as err:
        log.error("cannot start", error=str(err))
        return 1
    return 0
