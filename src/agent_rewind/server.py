"""The gRPC server: the model backend, the checks a start makes, the order its parts are opened
in (each part is opened by components.py, its close on one exit stack), health, reflection,
graceful shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gc
import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from agent_rewind import agents, components, logs, tasks
from agent_rewind.access import AccessFile, AccessFileError
from agent_rewind.agents import cli_environment as cli_environment
from agent_rewind.agents import default_factory as default_factory
from agent_rewind.api.v1 import (
    rewind_service_pb2,
    session_service_pb2,
)
from agent_rewind.components import SidePorts as SidePorts
from agent_rewind.config import CREDENTIAL_VARIABLES, Config, check_files_readable
from agent_rewind.config import StartError as StartError
from agent_rewind.events import EventHub
from agent_rewind.logs import configure
from agent_rewind.replicas import Membership, Owners
from agent_rewind.rewind import intent
from agent_rewind.rewind.engine import RewindEngine
from agent_rewind.rpc import convert, registration, tooling
from agent_rewind.rpc.auth import Authenticator
from agent_rewind.rpc.caches import ServiceCaches
from agent_rewind.rpc.forwarding import Forwarder
from agent_rewind.rpc.requests import PageTokens
from agent_rewind.rpc.rewind_service import RewindServicer
from agent_rewind.rpc.session_service import SessionServicer
from agent_rewind.sandbox import CommandSandbox
from agent_rewind.sandbox.proxy import EgressProxy
from agent_rewind.sessions.live import LiveSlots, default_max_live
from agent_rewind.sessions.process import ClientFactory
from agent_rewind.sessions.registry import SessionRegistry
from agent_rewind.sessions.worker import WorkerContext
from agent_rewind.snapshots.taking import Snapshots
from agent_rewind.storage.retention import Retention
from agent_rewind.storage.usage import Limits, UsageBook
from agent_rewind.store.ledger import EventRecord, Ledger
from agent_rewind.testing.scripted_model import ScriptedModel
from agent_rewind.webhooks import Subscription, Webhooks

log = structlog.get_logger(__name__)

SESSION_SERVICE = session_service_pb2.DESCRIPTOR.services_by_name["SessionService"]
REWIND_SERVICE = rewind_service_pb2.DESCRIPTOR.services_by_name["RewindService"]
SERVICE_NAMES = (SESSION_SERVICE.full_name, REWIND_SERVICE.full_name)
# How long a stop waits for detached work (a rewind, undo, fork or deletion) after the server stops.
DETACHED_GRACE = 10.0


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


def _release(lock: int) -> None:
    with contextlib.suppress(OSError):
        os.close(lock)


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
class _Stopping:
    """What a stop gives the work still running when it closes the start's exit stack: a start
    that fails gives none."""

    grace: float = 0.0  # running turns
    calls_grace: float = 0.0  # open calls
    detached_grace: float = 0.0  # detached work (tasks.py)


@dataclass(kw_only=True)
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
    membership: Membership | None = None
    forwarder: Forwarder | None = None
    webhooks: Webhooks | None = None
    # Everything the start opened, closed latest first by `stop` (`_make` says what, in order).
    closes: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack)
    stopping: _Stopping = field(default_factory=_Stopping)
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
        # Watchers reconnect (elsewhere, or here after the restart) with their cursor.
        await self.hub.close()
        self.stopping.grace, self.stopping.calls_grace, self.stopping.detached_grace = (
            grace,
            1.0,
            DETACHED_GRACE,
        )
        await self.closes.aclose()
        log.info("stopped")


_LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


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


async def start(config: Config, client_factory: ClientFactory | None = None) -> RunningServer:
    """Starts a server for `config` (which must be resolved) and returns once it listens."""
    backend = choose_backend(config)
    for variable in CREDENTIAL_VARIABLES:
        logs.secret(os.environ.get(variable, ""))
    check_transport(config)
    check_replicas(config)
    check_files_readable(config)
    webhooks = components.webhook_keys(config)
    try:
        access = AccessFile(config.access_file) if config.access_file is not None else None
        credentials = components.server_credentials(config)
        replica_credentials = components.replica_credentials(config)
    except (AccessFileError, OSError) as err:
        raise StartError(str(err)) from err
    config.state_dir.mkdir(parents=True, exist_ok=True)
    # What is made is closed again, latest first, if the start fails before it serves: an
    # embedding process, or a retry, is left with no thread, connection or port of it.
    async with contextlib.AsyncExitStack() as made:
        lock = _hold_state_dir(config)
        if lock is not None:
            made.callback(_release, lock)
        running = await _make(
            made,
            config,
            client_factory=client_factory,
            access=access,
            credentials=credentials,
            replica_credentials=replica_credentials,
            backend=backend,
            lock=lock,
            webhooks=webhooks,
        )
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
    *,
    client_factory: ClientFactory | None,
    access: AccessFile | None,
    credentials: grpc.ServerCredentials | None,
    replica_credentials: grpc.ChannelCredentials | None,
    backend: str,
    lock: int | None,
    webhooks: tuple[list[Subscription], list[str]] = ([], []),
) -> RunningServer:
    """Opens every part of the server in order, each close on `made` as it opens, and hands the
    stack to the running server, whose stop closes them: the chores; the sessions (running turns
    get the stop's grace), open calls, and detached work; the directory's lease; the side ports;
    the channels to other replicas; the port; the snapshot threads; the event hub; the ledger; the
    scripted model; the egress proxy; the tracer provider (what is left exported); the state dir's
    lock. (The webhook loops start last and stop first.)"""
    for root in config.workspace_roots:
        root.mkdir(parents=True, exist_ok=True)
    (config.state_dir / "home").mkdir(exist_ok=True)
    components.open_tracing(made, config)  # before the port and the channels it instruments

    def reached(session_id: str, host: str, port: int) -> None:
        """The egress proxy opened a connection for a session's commands (only once it serves,
        so the registry, made below, exists): a side effect of its turn."""
        worker = registry.workers.get(session_id)
        if worker is not None:
            worker.reached(host, port)

    sandbox, proxy = await agents.open_sandbox(made, config, reached=reached)
    confinement = await agents.open_cli_confinement(config)
    model = agents.start_model(made, backend)
    reserve = await components.open_reserve(made, config)
    ledger = await components.open_ledger(made, config, on_full=reserve.release)
    caches = ServiceCaches()
    hub = await components.start_events(made, ledger, config, caches.forget)
    snapshots = components.open_snapshots(made, config, ledger)
    listening = components.listen(made, config, credentials)
    server, port = listening.server, listening.port
    if lock is not None:  # who holds the state dir, for the next server that tries
        os.ftruncate(lock, 0)
        os.pwrite(
            lock, f"pid {os.getpid()}, listening on {config.listen.rsplit(':', 1)[0]}:{port}\n".encode(), 0
        )
    deliveries = components.make_webhooks(config, ledger, *webhooks, convert.rewind_event_json, access)

    usage = UsageBook(ledger, Limits(config.max_session_storage, config.max_principal_storage))
    made.callback(usage.close)

    def publish(event: EventRecord) -> None:
        """An event this process committed: to the watchers, and the webhook loops woken; a
        rewind's or an undo's session is measured again."""
        hub.publish(event)
        deliveries.publish(event)
        if event.kind in ("REWOUND", "UNDONE"):
            usage.changed(event.session_id)

    engine = RewindEngine(ledger, publish=publish, snapshots=snapshots)
    live = LiveSlots(config.max_live_sessions or default_max_live(), wait=config.live_session_wait)
    log.info("live process bound", max_live_sessions=live.capacity)
    health_servicer = tooling.Health()

    # The directory's callbacks and the owners' `local` name the registry, made after them
    # (it takes the owners): they run only once the server serves.
    async def give_up() -> None:
        """Fenced off (another process registered as this replica, or took its sessions over),
        or, on shared storage, a lease it could not renew: it ends every agent now, so that no
        session runs on two replicas, and lets go of its sessions (calls for them are forwarded
        to their owner). Its health stays NOT_SERVING (in Kubernetes, the liveness probe
        restarts it)."""
        await registry.abandon()
        await _set_health(health_servicer, health_pb2.HealthCheckResponse.NOT_SERVING)

    async def take_over(replica_id: str, session_ids: list[str]) -> None:
        adopted = await registry.adopt(session_ids)
        await engine.recover({worker.session_id: worker for worker in adopted})

    address = config.advertise_address
    if address.endswith(":0"):  # an ephemeral port: the one bound
        address = f"{address.rpartition(':')[0]}:{port}"
    membership = Membership(
        ledger,
        config.replica_id,
        address,
        config.replica_lease,
        give_up,
        on_lease_lost=give_up if config.shared_storage else None,
        take_over=take_over if config.shared_storage else None,
    )
    owners: Owners | None = None
    secret: str | None = None
    if config.database_url:  # a shared ledger: other replicas may own sessions
        owners = Owners(
            ledger, membership, lambda session_id: session_id in registry.workers, config.placement
        )
        secret = (await ledger.secret("replica_forwarding")).hex()
    ctx = WorkerContext(
        ledger=ledger,
        client_factory=client_factory or agents.default_factory(config, sandbox, proxy, confinement),
        cli_env=cli_environment(config, model),
        claude_config_dir=config.claude_config_dir,
        idle_timeout=config.idle_timeout,
        interrupt_timeout=config.interrupt_timeout,
        resolve_pending=engine.resolve_pending,
        project_settings=config.trust_project_settings,
        live=live,
        snapshots=snapshots,
        retention=Retention(config.retain_file_points, config.retain_file_days),
        rewind_trees=intent.undo_trees,
        usage=usage,
        replica_id=config.replica_id,
        reserve=reserve,
    )
    registry = SessionRegistry(config=config, ledger=ledger, ctx=ctx, publish=publish, owners=owners)
    forwarder = (
        components.open_forwarder(made, config, owners, secret, replica_credentials)
        if owners is not None and secret is not None
        else None
    )
    authenticator = Authenticator(access, replica_secret=secret or "")
    tokens = PageTokens(await ledger.secret("page_tokens"))
    _add_services(
        server,
        health_servicer,
        SessionServicer(registry, engine, tokens, authenticator, forwarder, offline=backend == "offline"),
        RewindServicer(
            registry,
            engine,
            tokens,
            authenticator,
            backend,
            hub,
            caches,
            live.capacity,
            membership,
            forwarder,
            sandbox_hosts=tuple(config.sandbox_allow_hosts) if sandbox is not None else None,
            landlock_abi=confinement.abi if confinement is not None else 0,
            max_watch_streams=config.max_watch_streams_per_principal,
        ),
    )
    await _set_health(health_servicer, health_pb2.HealthCheckResponse.NOT_SERVING)
    # Probes see NOT_SERVING while interrupted rewinds are finished, before any call is admitted.
    side = await components.open_side_ports(
        made, SidePorts(config=config, health_servicer=health_servicer, registry=registry, hub=hub, live=live)
    )
    # In the directory before loading and recovery write anything: from here every write is
    # fenced.
    made.push_async_callback(membership.leave)
    await membership.join()
    stopping = _Stopping()
    made.push_async_callback(_wind_down, registry, server, stopping)
    await registry.load()
    await engine.recover(registry.workers)
    await listening.serve()
    await _set_health(health_servicer, health_pb2.HealthCheckResponse.SERVING)
    components.start_chores(made, ledger, config)
    await components.start_webhooks(made, deliveries)
    return RunningServer(
        server=server,
        port=port,
        registry=registry,
        ledger=ledger,
        health=health_servicer,
        model=model,
        config=config,
        engine=engine,
        backend=backend,
        hub=hub,
        authenticated=authenticator.enabled,
        side=side,
        snapshots=snapshots,
        sandbox=sandbox,
        proxy=proxy,
        membership=membership,
        forwarder=forwarder,
        webhooks=deliveries,
        closes=made.pop_all(),
        stopping=stopping,
    )


def _add_services(
    server: grpc.aio.Server,
    health_servicer: health.aio.HealthServicer,
    sessions: SessionServicer,
    rewinds: RewindServicer,
) -> None:
    registration.add(server, SESSION_SERVICE, sessions)
    registration.add(server, REWIND_SERVICE, rewinds)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    tooling.enable_reflection(server, (SESSION_SERVICE, REWIND_SERVICE))


async def _set_health(servicer: health.aio.HealthServicer, status: int) -> None:
    for name in (*SERVICE_NAMES, ""):
        await servicer.set(name, status)


async def _wind_down(registry: SessionRegistry, server: grpc.aio.Server, stopping: _Stopping) -> None:
    """Ends the sessions' work (running turns get the stop's grace), then the open calls; then
    waits for detached work: a rewind, undo, fork or deletion whose caller hung up still runs to
    its end, before the ledger it writes to closes (what is left then is recovered from its
    intent at the next start)."""
    await registry.shutdown(stopping.grace)
    await server.stop(grace=stopping.calls_grace)
    left = await tasks.drain(stopping.detached_grace) if stopping.detached_grace else []
    if left:
        log.warning("detached work still running at shutdown", tasks=sorted(t.get_name() for t in left))


async def _serve(config: Config) -> None:
    running = await start(config)
    # The cycle collector, tuned for serving (benchmarks/events.py measured it; docs/benchmarks.md
    # section 4). What the start made (the modules, the SDK's and the API's classes, the session
    # records) lives as long as the process: frozen, a full collection no longer scans it (it
    # was a pause of up to 130 ms with 1,000 watchers). And an event's fan-out holds a few
    # objects per watcher alive at once, which at the default threshold (700) set off a young
    # collection every few hundred deliveries, and a full one every few rewinds; at 20,000 a
    # fan-out to 1,000 sets off none. What serving makes is mostly freed by its reference count.
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 10, 10)
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
