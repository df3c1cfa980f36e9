"""What the server is made of, each part opened by one function here that puts the part's close
on the start's exit stack (`made`) as it opens it.

`server.start` calls them in order, handing each what it needs and passing every callback to a
constructor (nothing is set on a part once it is made). A start that fails at any step thus
closes, latest first, whatever the steps before it opened, and leaves an embedding process (or
a retry) no thread, connection or port of it; a running server's stop unwinds the same stack.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import timedelta

import grpc
import structlog
from grpc_health.v1 import health, health_pb2_grpc

from agent_rewind import logs, metrics, tracing
from agent_rewind.access import AccessFile
from agent_rewind.config import Config, StartError
from agent_rewind.errors import StorageUnavailable
from agent_rewind.events import EventHub
from agent_rewind.metrics import MetricsServer
from agent_rewind.replicas import Owners
from agent_rewind.rpc.forwarding import Forwarder
from agent_rewind.sessions.live import LiveSlots
from agent_rewind.sessions.registry import SessionRegistry
from agent_rewind.snapshots import Limits
from agent_rewind.snapshots import git as snapshot_git
from agent_rewind.snapshots.taking import Snapshots, snapshots_dir
from agent_rewind.storage.reserve import RESERVE_NAME, Reserve
from agent_rewind.store.ledger import Ledger, SchemaTooNew, now
from agent_rewind.store.sqlite import SqliteLedger
from agent_rewind.webhooks import SecretFileError, Subscription, SubscriptionError, Webhooks
from agent_rewind.webhooks import read_secret_file as read_webhook_keys
from agent_rewind.webhooks import subscriptions as webhook_subscriptions
from agent_rewind.webhooks.delivery import Settings as WebhookSettings
from agent_rewind.webhooks.envelope import Encode

log = structlog.get_logger(__name__)

Made = contextlib.AsyncExitStack

# The largest request the server reads: a prompt is at most 512 KiB of text (rpc/requests.py).
MAX_MESSAGE_BYTES = 2 * 1024 * 1024


async def open_ledger(made: Made, config: Config, on_full: Callable[[], bool] | None = None) -> Ledger:
    """The SQLite file in the state dir, or PostgreSQL with --database-url; the events past their
    retention dropped."""
    try:
        ledger = await ledger_of(config)
    except (SchemaTooNew, StorageUnavailable, ImportError, StartError) as err:
        raise err if isinstance(err, StartError) else StartError(str(err)) from err
    made.push_async_callback(ledger.close)
    if on_full is not None and isinstance(ledger, SqliteLedger):
        ledger.dialect.on_full = on_full
    try:
        await _trim_events(ledger, config)
    except Exception as err:
        log.warning("could not drop old events", error=str(err))
    return ledger


async def ledger_of(config: Config) -> Ledger:
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


async def start_events(
    made: Made, ledger: Ledger, config: Config, on_session_deleted: Callable[[str], None]
) -> EventHub:
    """The event hub, following the ledger's event log; it tells `on_session_deleted` of every
    deleted session (what holds copies of its events, pages or record drops them)."""
    hub = EventHub(ledger, max_lag=config.watcher_buffer, on_session_deleted=on_session_deleted)
    made.push_async_callback(hub.close)
    await hub.start()
    return hub


def open_snapshots(made: Made, config: Config, ledger: Ledger) -> Snapshots | None:
    """Workspace snapshots and their threads. A capability is what works on this host now:
    without git there are none (new sessions take none, GetCapabilities says so, and the CLI's
    checkpoints serve files rewinds)."""
    missing = snapshot_git.available()
    if missing is not None:
        log.warning("workspace snapshots are off: " + missing)
        return None
    limits = Limits(
        max_file_bytes=config.snapshot_max_file_bytes,
        max_total_bytes=config.snapshot_max_bytes,
        timeout_s=config.snapshot_timeout,
    )
    snapshots = Snapshots(snapshots_dir(config.state_dir), ledger, limits, watch=config.snapshot_watch)
    made.callback(snapshots.close)
    return snapshots


def ping_ms(config: Config) -> int:
    """How often a replica pings another while a call forwarded to it is open: a third of the lease."""
    return max(1000, int(config.replica_lease * 1000 / 3))


class Listening:
    """The gRPC server, bound to --listen, and whether it serves yet."""

    def __init__(self, server: grpc.aio.Server, port: int) -> None:
        self.server = server
        self.port = port
        self._serving = False

    async def serve(self) -> None:
        await self.server.start()
        self._serving = True

    async def close(self) -> None:
        if not self._serving:
            # gRPC keeps the listening socket of a server stopped before it ever started (the
            # port stays taken for the process's life): it is started, and stopped at once with
            # no grace, so that its stop frees the port. Health says NOT_SERVING meanwhile.
            with contextlib.suppress(Exception):
                await self.server.start()
        await self.server.stop(0)


def open_tracing(made: Made, config: Config) -> tracing.Tracing | None:
    """Traces, when the OTEL_* variables ask for them (tracing.py); flushed at the stop."""
    try:
        traces = tracing.configure(config.replica_id)
    except (tracing.TracingConfigError, ImportError) as err:
        raise StartError(str(err), usage=True) from err
    if traces is None:
        return None
    made.push_async_callback(traces.close)
    log.info("tracing on", exporters=list(traces.exporters))
    return traces


def listen(made: Made, config: Config, credentials: grpc.ServerCredentials | None) -> Listening:
    """The gRPC server, bound to --listen (not serving yet); every RPC traced when tracing is on."""
    server = grpc.aio.server(
        interceptors=tracing.server_interceptors(),
        options=[
            # A port in use is "address in use", never shared with another server.
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", 16 * MAX_MESSAGE_BYTES),
            # The other replicas' keepalive pings, during a turn that sends nothing for minutes.
            ("grpc.http2.min_recv_ping_interval_without_data_ms", ping_ms(config) // 2),
            ("grpc.http2.max_ping_strikes", 0),
        ],
    )
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
    listening = Listening(server, port)
    made.push_async_callback(listening.close)
    return listening


def open_forwarder(
    made: Made, config: Config, owners: Owners, secret: str, credentials: grpc.ChannelCredentials | None
) -> Forwarder:
    """The channels to the other replicas, for the calls that belong to them."""
    forwarder = Forwarder(
        owners,
        secret,
        credentials,
        interceptors=tracing.client_interceptors(),
        options=(
            ("grpc.max_receive_message_length", 16 * MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            # An owner that stops answering (frozen, cut off) fails the calls forwarded to it
            # within two pings, rather than holding them for the caller's whole deadline.
            ("grpc.keepalive_time_ms", ping_ms(config)),
            ("grpc.keepalive_timeout_ms", ping_ms(config)),
            ("grpc.http2.ping_timeout_ms", ping_ms(config)),  # (what gRPC 1.85 reads)
            # Nor does a connection to it hang for gRPC's default 20 s; and one that came back
            # is connected again within two pings, however long it was away.
            ("grpc.min_reconnect_backoff_ms", 2 * ping_ms(config)),
            ("grpc.max_reconnect_backoff_ms", 2 * ping_ms(config)),
            ("grpc.keepalive_permit_without_calls", 0),
            ("grpc.http2.max_pings_without_data", 0),
        ),
    )
    made.push_async_callback(forwarder.close)
    return forwarder


class SidePorts:
    """The plaintext side ports: Prometheus metrics, and grpc.health.v1 alone for probes."""

    def __init__(
        self,
        *,
        config: Config,
        health_servicer: health.aio.HealthServicer,
        registry: SessionRegistry,
        hub: EventHub,
        live: LiveSlots,
    ) -> None:
        self._config = config
        self._health_servicer = health_servicer
        self._registry = registry
        self._hub = hub
        self._live = live
        self.metrics: MetricsServer | None = None
        self.health: grpc.aio.Server | None = None
        self.health_port = 0
        self._unobserve: Callable[[], None] | None = None

    async def start(self) -> None:
        hub, live = self._hub, self._live
        self._unobserve = metrics.observe(
            self._registry.states, lambda: hub.watchers, lambda: (live.held, live.capacity, live.waiting)
        )
        config = self._config
        if config.metrics_listen:
            self.metrics = MetricsServer(config.metrics_listen)
            log.info("serving metrics", address=config.metrics_listen, port=self.metrics.port)
        if config.health_listen:
            self.health = grpc.aio.server()
            health_pb2_grpc.add_HealthServicer_to_server(self._health_servicer, self.health)
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


async def open_side_ports(made: Made, side: SidePorts) -> SidePorts:
    """The side ports, started (stopped again whatever part of them started)."""
    made.push_async_callback(side.stop)
    await side.start()
    return side


class Chores:
    """What the server does now and then while it serves: forgets request ids past their
    retention (--request-id-retention), drops events past theirs (--event-retention)."""

    def __init__(self, ledger: Ledger, config: Config) -> None:
        self._ledger = ledger
        self._config = config
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._forget_old_requests(), name="forget-requests"))
        self._tasks.append(asyncio.create_task(self._keep_trimming_events(), name="trim-events"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def _forget_old_requests(self) -> None:
        retention = self._config.request_id_retention
        while True:
            try:
                dropped = await self._ledger.forget_requests(now() - timedelta(seconds=retention))
                if dropped:
                    log.info("request ids past their retention forgotten", count=dropped)
            except Exception as err:  # a full disk now is no reason to stop serving
                log.warning("could not forget old request ids", error=str(err))
            await asyncio.sleep(min(3600.0, max(retention / 10, 1.0)))

    async def _keep_trimming_events(self) -> None:
        config = self._config
        every = min(600.0, max(config.event_retention / 10, 1.0)) if config.event_retention else 60.0
        while True:
            await asyncio.sleep(every)
            try:
                await _trim_events(self._ledger, config)
            except Exception as err:  # a full disk now is no reason to stop serving
                log.warning("could not drop old events", error=str(err))


def start_chores(made: Made, ledger: Ledger, config: Config) -> Chores:
    chores = Chores(ledger, config)
    made.push_async_callback(chores.stop)
    chores.start()
    return chores


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


def webhook_keys(config: Config) -> tuple[list[Subscription], list[str]]:
    """The webhook URLs and the keys that sign for them, checked before anything is opened: a
    bad URL, a missing, open or malformed secret file is a usage error."""
    try:
        subscriptions = webhook_subscriptions(config.webhook_urls, config.webhook_principals)
    except SubscriptionError as err:
        raise StartError(str(err), usage=True) from err
    if not subscriptions:
        return [], []
    if config.webhook_secret_file is None:
        raise StartError(
            "--webhook-url needs --webhook-secret-file (the keys that sign deliveries)", usage=True
        )
    try:
        keys = read_webhook_keys(config.webhook_secret_file)
    except SecretFileError as err:
        raise StartError(f"--webhook-secret-file {err}", usage=True) from err
    for key in keys:
        logs.secret(key)
    return subscriptions, keys


def make_webhooks(
    config: Config,
    ledger: Ledger,
    subscriptions: list[Subscription],
    keys: list[str],
    encode: Encode,
    access: AccessFile | None,
) -> Webhooks:
    """Every URL's delivery loop, not started (`start_webhooks`, once the server serves): its
    `publish` is wired beside the event hub's before the parts that publish are made."""
    settings = WebhookSettings(
        holder=config.replica_id,
        lease_s=config.replica_lease,
        max_attempts=config.webhook_max_attempts,
        timeout_s=config.webhook_timeout,
    )
    for subscription in subscriptions:
        if (
            subscription.principal is not None
            and access is not None
            and not access.named(subscription.principal)
        ):
            log.warning(
                "a webhook's principal is not in the access file: it is sent nothing until it is",
                webhook=subscription.shown,
                principal=subscription.principal,
            )
    return Webhooks(subscriptions, ledger, settings, keys, encode, access)


async def start_webhooks(made: Made, webhooks: Webhooks) -> Webhooks:
    """Starts the delivery loops, last of all (this replica's epoch fences their writes), so that
    a stop ends them first: before the sessions wind down and detached work is waited for."""
    made.push_async_callback(webhooks.stop)
    await webhooks.start()
    return webhooks


def replica_credentials(config: Config) -> grpc.ChannelCredentials | None:
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


def server_credentials(config: Config) -> grpc.ServerCredentials | None:
    if config.tls_cert is None or config.tls_key is None:
        return None
    client_ca = config.tls_client_ca.read_bytes() if config.tls_client_ca is not None else None
    return grpc.ssl_server_credentials(
        [(config.tls_key.read_bytes(), config.tls_cert.read_bytes())],
        root_certificates=client_ca,
        require_client_auth=client_ca is not None,
    )


async def open_reserve(made: Made, config: Config) -> Reserve:
    """The storage reserve in the state dir (storage/reserve.py), made if there is room, and
    watched until the server stops."""
    # One file per replica where replicas share the state dir: each keeps, and releases, its own.
    name = f"{RESERVE_NAME}-{config.replica_id}" if config.shared_storage else RESERVE_NAME
    reserve = Reserve(config.state_dir, config.storage_reserve, config.workspace_roots, name=name)
    if config.storage_reserve and not await asyncio.to_thread(reserve.make):
        log.warning(
            "no room for the storage reserve: no turn starts until the state dir's volume has "
            "twice --storage-reserve free",
            bytes=config.storage_reserve,
        )
    watching = asyncio.create_task(reserve.watch(), name="storage-reserve")

    async def stop() -> None:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching

    made.push_async_callback(stop)
    return reserve
