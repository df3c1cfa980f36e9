"""Service configuration: command-line flags with environment fallbacks."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

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
    # Rewind points per session (the newest) that keep their snapshots; 0 for all.
    snapshot_retention: int = 0
    # The command sandbox (sandbox/): "on" confines every command the agent runs; the hosts
    # its commands may reach through the egress proxy ("host", "host:port", "*.domain").
    sandbox: Literal["on", "off"] = "on"
    sandbox_allow_hosts: tuple[str, ...] = ()
    # A file holding the database password (a Secret mounted as a file), rather than the URL.
    database_password_file: Path | None = None
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


# --- the `serve` flags ---------------------------------------------------------------------------

ENV_PREFIX = "AGENT_REWIND_"
# How a yes/no flag's variable may say yes or no (any case).
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def seconds(text: str) -> float:
    """A duration flag's value: a finite number of seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds, 0 or more: {text!r}")
    return value


def lease(text: str) -> float:
    """A lease's length: a duration of at least one second (renewed every third of it)."""
    value = seconds(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 second: {text!r}")
    return value


def count(text: str) -> int:
    """A bound's value: an integer of 0 (no bound) or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more: {text!r}")
    return value


def positive_int(text: str) -> int:
    """A count flag's value: an integer of 1 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more: {text!r}")
    return value


@dataclass(frozen=True)
class Flag:
    """One `serve` flag, declared once: its argparse argument, its environment fallback and its help.

    The flag sets the Config field `config_field`. When the flag is not given, its environment
    variable (AGENT_REWIND_ + the flag's name, unless `env` says otherwise) is read and checked by
    the flag's own argparse argument, so it gets the same conversion, the same choices and the same
    messages; an empty variable counts as unset. Without either, the Config field keeps its default,
    which the help shows (or `default_help`, when that reads better).
    """

    name: str
    config_field: str
    help: str
    convert: Callable[[str], Any] = str
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    # action="append"; the environment form holds several values separated by `separator`.
    repeatable: bool = False
    separator: str = os.pathsep
    # A yes/no flag: --name and --no-name, taking no value; its variable says true or false.
    switch: bool = False
    env: str = ""
    default_help: str = ""

    @property
    def dest(self) -> str:
        return self.name.removeprefix("--").replace("-", "_")

    @property
    def env_var(self) -> str:
        return self.env or ENV_PREFIX + self.dest.upper()

    def default_text(self) -> str:
        if self.default_help:
            return self.default_help
        value = getattr(Config(), self.config_field)
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, float):
            return str(int(value)) if value.is_integer() else f"{value:g}"
        return str(value)

    def help_text(self) -> str:
        form = f", several separated by {self.separator!r}" if self.repeatable else ""
        form += ", true or false" if self.switch else ""
        text = f"{self.help} (env {self.env_var}{form}, default {self.default_text()})"
        return text.replace("%", "%%")  # argparse formats help with %

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """The argparse argument. Its default is None, so an absent flag can fall back to the environment."""
        if self.switch:
            parser.add_argument(
                self.name,
                dest=self.dest,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=self.help_text(),
            )
            return
        parser.add_argument(
            self.name,
            dest=self.dest,
            action="append" if self.repeatable else "store",
            type=self.convert,
            choices=self.choices,
            metavar=self.metavar,
            default=None,
            help=self.help_text(),
        )

    def from_environment(self, environ: Mapping[str, str]) -> Any:
        """The environment variable's value as the flag would parse it; None when unset or empty.

        Raises argparse.ArgumentError naming the variable when the flag would refuse the value.
        """
        text = environ.get(self.env_var, "")
        if not text:
            return None
        if self.switch:
            if text.strip().lower() not in _TRUE + _FALSE:
                raise self._env_error(f"invalid boolean value: {text!r} (use true or false)")
            argv = [self.name if text.strip().lower() in _TRUE else "--no-" + self.name.removeprefix("--")]
        else:
            values = [v for v in text.split(self.separator) if v] if self.repeatable else [text]
            argv = [f"{self.name}={v}" for v in values]
        # The flag's own argument parses the value: nothing to keep in step with the command line.
        probe = argparse.ArgumentParser(add_help=False, exit_on_error=False)
        self.add_to(probe)
        try:
            parsed = probe.parse_args(argv)
        except argparse.ArgumentError as err:
            raise self._env_error(err.message) from None
        return getattr(parsed, self.dest)

    def _env_error(self, message: str) -> argparse.ArgumentError:
        return argparse.ArgumentError(None, f"environment variable {self.env_var} ({self.name}): {message}")


# What the CLI accepts as credentials for a real model (API key, OAuth or gateway token, a cloud
# provider's switch): any one of them makes `--model auto` use the real API.
CREDENTIAL_VARIABLES = (
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "CLAUDE_CODE_OAUTH_TOKEN",
    "CLAUDE_CODE_USE_BEDROCK",
    "CLAUDE_CODE_USE_VERTEX",
    "CLAUDE_CODE_USE_FOUNDRY",
)


SERVE_FLAGS: tuple[Flag, ...] = (
    Flag("--listen", "listen", "the host:port to serve gRPC on", metavar="HOST:PORT"),
    Flag(
        "--metrics-listen",
        "metrics_listen",
        "the host:port to serve Prometheus metrics on (plain HTTP, /metrics)",
        metavar="HOST:PORT",
        default_help="off",
    ),
    Flag(
        "--health-listen",
        "health_listen",
        "a host:port serving only grpc.health.v1, in plaintext, for probes that cannot use TLS",
        metavar="HOST:PORT",
        default_help="off",
    ),
    Flag(
        "--state-dir",
        "state_dir",
        "where the service and its CLI processes keep all state: ledger, transcripts, file backups",
        convert=Path,
        metavar="DIR",
        default_help="./var",
    ),
    Flag(
        "--replica-id",
        "replica_id",
        "this replica's name in the replica directory, unique per deployment",
        metavar="ID",
        default_help="the host name (a StatefulSet pod's name)",
    ),
    Flag(
        "--advertise-address",
        "advertise_address",
        "the host:port other replicas reach this one at",
        metavar="HOST:PORT",
        default_help="--listen, with a wildcard host replaced by the replica id",
    ),
    Flag(
        "--replica-lease",
        "replica_lease",
        "seconds this replica's entry in the directory stays current without a heartbeat "
        "(renewed every third of it)",
        convert=lease,
        metavar="S",
    ),
    Flag(
        "--placement",
        "placement",
        "where CreateSession puts a new session: on the replica that got the call, or on the "
        "replica owning the fewest sessions (ties stay where the call arrived)",
        choices=("local", "least-loaded"),
    ),
    Flag(
        "--shared-storage",
        "shared_storage",
        "every replica mounts the same state dir and workspace roots at the same paths: a replica "
        "takes over the sessions of one whose lease ran out (with a PostgreSQL database only)",
        switch=True,
    ),
    Flag(
        "--database-url",
        "database_url",
        "a postgresql:// URL (libpq form; its password is better in --database-password-file): "
        "the ledger, the event log and the snapshot records in PostgreSQL instead of the SQLite file",
        metavar="URL",
        default_help="none: ledger.sqlite3 in the state dir",
    ),
    Flag(
        "--database-password-file",
        "database_password_file",
        "a file holding the database password (its first line), so that it is in no URL, command "
        "line or environment",
        convert=Path,
        metavar="FILE",
        default_help="none",
    ),
    Flag(
        "--workspace-root",
        "workspace_roots",
        "a directory session workspaces must resolve under; repeatable",
        convert=Path,
        metavar="DIR",
        repeatable=True,
        env="AGENT_REWIND_WORKSPACE_ROOTS",
        default_help="workspaces/ in the state dir",
    ),
    Flag(
        "--model",
        "model",
        "anthropic: the real API (needs a credential the CLI accepts: one of "
        + ", ".join(CREDENTIAL_VARIABLES)
        + "); offline: the built-in scripted model; auto: anthropic when one of them is set, else offline",
        choices=("auto", "offline", "anthropic"),
    ),
    Flag(
        "--shutdown-grace",
        "shutdown_grace",
        "seconds running turns get to finish when the service is told to stop: SIGTERM, SIGINT",
        convert=seconds,
        metavar="S",
    ),
    Flag(
        "--idle-timeout",
        "idle_timeout",
        "seconds an idle session keeps its CLI process before it hibernates, 0 for never; it resumes on demand",
        convert=seconds,
        metavar="S",
    ),
    Flag(
        "--interrupt-timeout",
        "interrupt_timeout",
        "seconds a turn may ignore Interrupt (or CloseSession --force) before its CLI process is killed",
        convert=seconds,
        metavar="S",
    ),
    Flag(
        "--request-id-retention",
        "request_id_retention",
        "seconds a request id is remembered: a retry within it gets the first call's outcome",
        convert=seconds,
        metavar="S",
        default_help="604800 (7 days)",
    ),
    Flag(
        "--sandbox",
        "sandbox",
        "on: every command the agent runs is confined to its workspace, with no network but the "
        "allowed hosts (needs bubblewrap; docs/security.md); off: commands run unconfined, as the service's user",
        choices=("on", "off"),
    ),
    Flag(
        "--sandbox-allow-host",
        "sandbox_allow_hosts",
        "a host the agent's commands may reach through the sandbox's proxy: host (ports 80 and 443), "
        "host:port or *.domain; repeatable",
        metavar="HOST",
        repeatable=True,
        separator=",",
        env="AGENT_REWIND_SANDBOX_ALLOW_HOSTS",
        default_help="none",
    ),
    Flag(
        "--allow-bypass-permissions",
        "allow_bypass_permissions",
        "let callers set permission_mode bypassPermissions (skips the service's tool policy)",
        switch=True,
    ),
    Flag(
        "--allow-stdio-mcp",
        "allow_stdio_mcp",
        "let callers configure stdio MCP servers (they run a command on this host)",
        switch=True,
    ),
    Flag(
        "--mcp-host",
        "mcp_hosts",
        "a host (or host:port) remote MCP servers of callers may be on; repeatable",
        metavar="HOST",
        repeatable=True,
        separator=",",
        env="AGENT_REWIND_MCP_HOSTS",
        default_help="none",
    ),
    Flag(
        "--trust-project-settings",
        "trust_project_settings",
        "let the CLI load a workspace's .claude/ settings, hooks and commands (trusted workspaces only)",
        switch=True,
    ),
    Flag(
        "--access-file",
        "access_file",
        "a JSON file of principals, their permissions and the SHA-256 of their tokens; turns "
        "authentication on (docs/security.md), re-read when it changes",
        convert=Path,
        metavar="FILE",
        default_help="none: no authentication, loopback only",
    ),
    Flag(
        "--tls-cert",
        "tls_cert",
        "the server's TLS certificate chain (PEM)",
        convert=Path,
        metavar="FILE",
        default_help="none",
    ),
    Flag(
        "--tls-key",
        "tls_key",
        "the server's TLS private key (PEM)",
        convert=Path,
        metavar="FILE",
        default_help="none",
    ),
    Flag(
        "--tls-client-ca",
        "tls_client_ca",
        "CA certificates (PEM) client certificates must chain to: mutual TLS, each certificate's "
        "common name a principal of the access file",
        convert=Path,
        metavar="FILE",
        default_help="none",
    ),
    Flag(
        "--replica-ca",
        "replica_ca",
        "CA certificates (PEM) the other replicas' server certificates chain to, for the calls this "
        "replica forwards to them over TLS (it presents its own server certificate as its client certificate)",
        convert=Path,
        metavar="FILE",
        default_help="the client CA file, else the server certificate",
    ),
    Flag(
        "--insecure",
        "insecure",
        "allow listening beyond loopback without authentication and TLS (logs a warning at every start)",
        switch=True,
    ),
    Flag(
        "--max-sessions-per-principal",
        "max_sessions_per_principal",
        "sessions one principal may have",
        convert=positive_int,
        metavar="N",
    ),
    Flag(
        "--max-running-turns-per-principal",
        "max_running_turns_per_principal",
        "turns of one principal's sessions that may run at once",
        convert=positive_int,
        metavar="N",
    ),
    Flag(
        "--max-watch-streams-per-principal",
        "max_watch_streams_per_principal",
        "WatchRewindEvents streams one principal may hold open at once on this replica",
        convert=positive_int,
        metavar="N",
    ),
    Flag(
        "--max-live-sessions",
        "max_live_sessions",
        "live Claude Code processes at most (each budgeted 320 MiB); beyond, the least recently used idle "
        "session hibernates; 0 sizes it from the memory limit",
        convert=count,
        metavar="N",
        default_help="0: (memory limit - 512 MiB) / 320 MiB",
    ),
    Flag(
        "--event-retention",
        "event_retention",
        "seconds the event log keeps an event, 0 for no age bound; an older cursor is CURSOR_EXPIRED",
        convert=seconds,
        metavar="S",
        default_help="2592000 (30 days)",
    ),
    Flag(
        "--event-retention-count",
        "event_retention_count",
        "the most events the log keeps (the newest), 0 for no count bound",
        convert=count,
        metavar="N",
    ),
    Flag(
        "--watcher-buffer",
        "watcher_buffer",
        "events a WatchRewindEvents stream may fall behind before it is ended (SUBSCRIBER_TOO_SLOW)",
        convert=positive_int,
        metavar="N",
    ),
    Flag(
        "--workspace-snapshots",
        "workspace_snapshots",
        "snapshot each session's whole workspace when each turn starts and ends, so a files rewind "
        "restores Bash and subagent edits too (a session may say otherwise at CreateSession)",
        switch=True,
    ),
    Flag(
        "--snapshot-max-file-bytes",
        "snapshot_max_file_bytes",
        "a file larger than this makes a snapshot incomplete (its point then cannot be restored from it)",
        convert=positive_int,
        metavar="BYTES",
        default_help="16777216 (16 MiB)",
    ),
    Flag(
        "--snapshot-max-bytes",
        "snapshot_max_bytes",
        "bytes one snapshot may add to the store; beyond, it is incomplete",
        convert=positive_int,
        metavar="BYTES",
        default_help="536870912 (512 MiB)",
    ),
    Flag(
        "--snapshot-timeout",
        "snapshot_timeout",
        "seconds one snapshot may take; beyond, it is incomplete",
        convert=seconds,
        metavar="S",
    ),
    Flag(
        "--snapshot-watch",
        "snapshot_watch",
        "follow live sessions' workspaces with inotify, so a snapshot asks git only about what "
        "changed; turn off where other machines write the workspaces (a network filesystem)",
        switch=True,
    ),
    Flag(
        "--snapshot-retention",
        "snapshot_retention",
        "rewind points per session (the newest) that keep their workspace snapshots, 0 for all; older "
        "snapshots are collected by reachability",
        convert=count,
        metavar="N",
        default_help="0: all",
    ),
    Flag(
        "--log-format",
        "log_format",
        "json, console, or auto: console when stderr is a terminal, else json",
        choices=("auto", "json", "console"),
    ),
    Flag(
        "--log-level",
        "log_level",
        "the least severe level logged, in any case",
        convert=str.lower,
        choices=("debug", "info", "warning", "error", "critical"),
    ),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `serve` flags. Reads no environment: `from_arguments` applies the fallbacks."""
    for flag in SERVE_FLAGS:
        flag.add_to(parser)


def from_arguments(ns: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Config:
    """The Config from parsed `serve` flags, each absent one from its environment variable.

    Raises argparse.ArgumentError, naming the variable, for an environment value the flag would refuse.
    """
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for flag in SERVE_FLAGS:
        value = getattr(ns, flag.dest, None)
        if value is None:
            value = flag.from_environment(env)
        if value is not None:
            values[flag.config_field] = tuple(value) if flag.repeatable else value
    return Config(**values).resolved()


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run the gRPC service. A flag not given falls back to its environment variable "
        "(an empty one counts as unset), then to its default.",
    )
    add_arguments(parser)
    return parser


def parse_args(
    argv: Sequence[str], *, prog: str | None = None, environ: Mapping[str, str] | None = None
) -> Config:
    """`serve`'s command line and environment as a Config. Exits 2, argparse-style, on a bad flag or variable."""
    parser = build_parser(prog)
    ns = parser.parse_args(list(argv))
    try:
        return from_arguments(ns, environ)
    except argparse.ArgumentError as err:
        parser.error(str(err))
