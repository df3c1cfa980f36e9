"""The Config record: every setting `agent-rewind serve` runs with, and the paths derived from it.

Only the record and its resolution (absolute paths, the replica's name and address) live here;
the flags that fill it are in `flag.py` (how one flag is declared and read) and `serve.py` (the
table of `serve` flags and the parsing).
"""

from __future__ import annotations

import dataclasses
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

ModelBackend = Literal["auto", "offline", "anthropic"]

DEFAULT_LISTEN = "127.0.0.1:50051"


def advertised(listen: str, replica_id: str) -> str:
    """The address others reach a server listening on `listen` at: a wildcard host (0.0.0.0,
    [::], none) becomes the replica id, which is a resolvable name in a StatefulSet."""
    host, _, port = listen.rpartition(":")
    if host in ("", "0.0.0.0", "[::]", "::", "*"):
        host = replica_id
    return f"{host}:{port}"


@dataclass(frozen=True)
class Config:
    """Everything `agent-rewind serve` needs. Paths are absolute after `resolved()`."""

    state_dir: Path = Path("var")
    workspace_roots: tuple[Path, ...] = ()
    listen: str = DEFAULT_LISTEN
    # Plaintext side ports, off unless given: Prometheus metrics (HTTP) and grpc.health.v1 only
    # (for probes that cannot speak TLS, like the kubelet's).
    metrics_listen: str = ""
    health_listen: str = ""
    # This replica in the replica directory: its id (default: the host name, a StatefulSet pod's
    # name), the host:port other replicas reach it at (default: from --listen), and its lease.
    replica_id: str = ""
    advertise_address: str = ""
    replica_lease: float = 15.0
    # Where CreateSession puts a new session: "local" (the replica that got the call) or
    # "least-loaded" (the replica owning the fewest sessions).
    placement: Literal["local", "least-loaded"] = "local"
    # Every replica mounts the same state dir and workspace roots, at the same paths (one
    # ReadWriteMany volume): a replica takes over the sessions of one whose lease ran out.
    shared_storage: bool = False
    model: ModelBackend = "auto"
    # Seconds a running turn gets to finish when the server is told to stop.
    shutdown_grace: float = 10.0
    # Seconds an idle session keeps its CLI process before it hibernates (0: never).
    idle_timeout: float = 300.0
    # Seconds allowed for a CLI process to start and answer its first control request.
    connect_timeout: float = 60.0
    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: str = "info"
    # Seconds a turn may ignore Interrupt before its CLI process is killed.
    interrupt_timeout: float = 10.0
    # Seconds a request id is remembered (a retry within it gets the first call's outcome).
    request_id_retention: float = 7 * 24 * 3600.0
    # Operator opt-ins beyond the default option allowlist (sessions/options.py).
    allow_bypass_permissions: bool = False
    allow_stdio_mcp: bool = False
    mcp_hosts: tuple[str, ...] = ()
    # Let the CLI read a workspace's .claude/ settings (hooks!): trusted workspaces only.
    trust_project_settings: bool = False
    # Seconds a ledger write waits for another writer (an operator's sqlite3 shell, a backup).
    ledger_busy_timeout: float = 5.0
    # A postgresql:// URL: the ledger in PostgreSQL (store/postgres.py) instead of the SQLite file.
    database_url: str = ""
    # Authentication: principals, their permissions and token hashes (access.py); TLS.
    access_file: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    # CA certificates the other replicas' server certificates chain to (forwarded calls, over TLS
    # when this replica serves TLS); default: --tls-client-ca, else --tls-cert itself.
    replica_ca: Path | None = None
    # Listen beyond loopback without authentication and TLS (a warning at every start).
    insecure: bool = False
    # Per-principal limits (QUOTA_EXCEEDED beyond them).
    max_sessions_per_principal: int = 10_000
    max_running_turns_per_principal: int = 16
    max_watch_streams_per_principal: int = 100
    # Live CLI processes at most (each budgeted 320 MiB); 0: as many as the memory holds.
    max_live_sessions: int = 0
    # Seconds a call that needs a live process waits for a slot when every one runs a turn (first
    # come, first served), before LIVE_SESSIONS_EXHAUSTED; 0: refused at once.
    live_session_wait: float = 30.0
    # The event log keeps events this many seconds and at most this many of them (0: no bound).
    event_retention: float = 30 * 24 * 3600.0
    event_retention_count: int = 1_000_000
    # How many events a watcher may fall behind before it is cut off (SUBSCRIBER_TOO_SLOW).
    watcher_buffer: int = 1000
    # Workspace snapshots (snapshots/): the default for new sessions, and their bounds.
    workspace_snapshots: bool = True
    snapshot_max_file_bytes: int = 16 * 1024 * 1024
    snapshot_max_bytes: int = 512 * 1024 * 1024
    snapshot_timeout: float = 30.0
    # Follow live sessions' workspaces with inotify, so a snapshot asks git about what changed
    # rather than scanning the workspace; off where other machines write the workspaces (NFS).
    snapshot_watch: bool = True
    # Retention of what files rewinds need (snapshots, the CLI's backups): the newest points of
    # each session that keep it (0: all), and the days a younger point keeps it (0: no age bound).
    retain_file_points: int = 0
    retain_file_days: float = 0.0
    # Storage limits (0: none): a session's, and the sum of a principal's sessions'; a Prompt or
    # ForkSession at or over one is refused (QUOTA_EXCEEDED) before it starts.
    max_session_storage: int = 0
    max_principal_storage: int = 0
    # Bytes kept free on the state dir's volume for the service's own writes (storage/reserve.py):
    # released when the volume is full; no turn starts while it is. 0: none.
    storage_reserve: int = 64 << 20
    # The command sandbox (sandbox/): "on" confines every command the agent runs; the hosts
    # its commands may reach through the egress proxy ("host", "host:port", "*.domain").
    sandbox: Literal["on", "off"] = "on"
    sandbox_allow_hosts: tuple[str, ...] = ()
    # What one sandboxed command, with all it starts, may take: processes and threads at once,
    # and bytes of data per process (sandbox/commands.py, CommandLimits).
    sandbox_max_processes: int = 512
    # The CLI process itself confined by the kernel (sandbox/cli.py): "landlock" or "off".
    cli_confinement: Literal["landlock", "off"] = "landlock"
    # Added to the niceness of every CLI process and the commands it runs (0: none), so that on
    # a node the agents keep busy the service's own answers do not wait behind them.
    cli_nice: int = 10
    sandbox_max_memory: int = 4 << 30
    # A file holding the database password (a Secret mounted as a file), rather than the URL.
    database_password_file: Path | None = None
    # Webhook delivery (webhooks/): the URLs every event is POSTed to, the file of the keys that
    # sign them, the principal a URL's events are filtered by ("PRINCIPAL=URL"; else every event),
    # the attempts an event gets and how long each may take.
    webhook_urls: tuple[str, ...] = ()
    webhook_secret_file: Path | None = None
    webhook_principals: tuple[str, ...] = ()
    webhook_max_attempts: int = 8
    webhook_timeout: float = 10.0
    # The environment the CLI processes see, beyond what the service sets itself.
    extra_env: dict[str, str] = field(default_factory=dict)

    def resolved(self) -> Config:
        state = self.state_dir.expanduser().resolve()
        roots = self.workspace_roots or (state / "workspaces",)

        def absolute(path: Path | None) -> Path | None:
            return path.expanduser().resolve() if path is not None else None

        replica_id = self.replica_id or socket.gethostname()
        return dataclasses.replace(
            self,
            replica_id=replica_id,
            advertise_address=self.advertise_address or advertised(self.listen, replica_id),
            state_dir=state,
            workspace_roots=tuple(r.expanduser().resolve() for r in roots),
            extra_env=dict(self.extra_env),
            access_file=absolute(self.access_file),
            tls_cert=absolute(self.tls_cert),
            tls_key=absolute(self.tls_key),
            tls_client_ca=absolute(self.tls_client_ca),
            replica_ca=absolute(self.replica_ca),
            database_password_file=absolute(self.database_password_file),
            webhook_secret_file=absolute(self.webhook_secret_file),
        )

    @property
    def claude_config_dir(self) -> Path:
        """Where the CLI keeps transcripts and file backups ($CLAUDE_CONFIG_DIR)."""
        return self.state_dir / "claude"

    @property
    def sessions_dir(self) -> Path:
        """Each session's own directories for its CLI: temporary, scratch, runtime, sandbox."""
        return self.state_dir / "sessions"

    @property
    def ledger_path(self) -> Path:
        return self.state_dir / "ledger.sqlite3"

    @property
    def default_workspace_root(self) -> Path:
        return self.workspace_roots[0] if self.workspace_roots else self.state_dir / "workspaces"
