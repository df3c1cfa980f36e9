"""The table of `serve` flags and the parsing of a command line and environment into a Config.

Each flag is a `Flag` (flag.py) naming the Config field it sets; `parse_args` reads the command
line, falls back to the environment for each absent flag, and resolves the record.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agent_rewind.config.flag import Flag, count, lease, niceness, positive_int, positive_seconds, seconds
from agent_rewind.config.record import Config

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
        "--cli-confinement",
        "cli_confinement",
        "landlock: the Claude Code process is confined by the kernel to its workspace and its session's "
        "own files, whatever its tools are asked (needs Landlock ABI 3, Linux 6.2; docs/security.md); "
        "off: only the service's checks confine its file tools",
        choices=("landlock", "off"),
    ),
    Flag(
        "--cli-nice",
        "cli_nice",
        "added to the niceness of every Claude Code process and the commands it runs, so the service's "
        "own answers (points, dry runs, events) never wait behind the agents' work on a busy node; 0: none",
        convert=niceness,
        metavar="N",
    ),
    Flag(
        "--sandbox-max-processes",
        "sandbox_max_processes",
        "processes (threads count) one sandboxed command may have at once, with all it starts: a fork "
        "bomb stops there (not enforced when the service runs as root: the pod's pids limit is)",
        convert=positive_int,
        metavar="N",
    ),
    Flag(
        "--sandbox-max-memory",
        "sandbox_max_memory",
        "bytes of data (heap and private writable memory) one process of a sandboxed command may map",
        convert=positive_int,
        metavar="BYTES",
        default_help="4294967296 (4 GiB)",
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
        "--live-session-wait",
        "live_session_wait",
        "seconds a prompt or rewind that needs a live process waits for one when every slot runs a turn "
        "(first come, first served; at most 1,000 waiting) before LIVE_SESSIONS_EXHAUSTED; 0: refused at once",
        convert=seconds,
        metavar="S",
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
        "--webhook-url",
        "webhook_urls",
        "an http(s) URL every rewind event is POSTed to, as a signed CloudEvent (docs/events.md#webhooks); "
        "repeatable",
        metavar="URL",
        repeatable=True,
        separator=" ",
        env="AGENT_REWIND_WEBHOOK_URLS",
        default_help="none",
    ),
    Flag(
        "--webhook-secret-file",
        "webhook_secret_file",
        "the Standard Webhooks keys that sign every delivery, one whsec_... key a line (all of them sign: "
        "keys rotate), readable by no other user; needed by webhook URLs",
        convert=Path,
        metavar="FILE",
        default_help="none",
    ),
    Flag(
        "--webhook-principal",
        "webhook_principals",
        "PRINCIPAL=URL: that URL gets only the events of sessions PRINCIPAL may read (a URL named in none "
        "gets every event); repeatable",
        metavar="PRINCIPAL=URL",
        repeatable=True,
        separator=" ",
        env="AGENT_REWIND_WEBHOOK_PRINCIPALS",
        default_help="none: every URL gets every event",
    ),
    Flag(
        "--webhook-max-attempts",
        "webhook_max_attempts",
        "POSTs of one event to one URL before it is recorded as failed and delivery goes on (retries "
        "wait 0.5 s, 1 s, 2 s, ... up to 60 s, with jitter)",
        convert=positive_int,
        metavar="N",
    ),
    Flag(
        "--webhook-timeout",
        "webhook_timeout",
        "seconds one webhook POST may take, connecting included, before it counts as failed",
        convert=positive_seconds,
        metavar="S",
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
    # (Before --retain-file-points: given both, the newer name wins.)
    Flag(
        "--snapshot-retention",
        "retain_file_points",
        "round 2's name of retain-file-points, which it is an alias of",
        convert=count,
        metavar="N",
        default_help="0: all",
    ),
    Flag(
        "--retain-file-points",
        "retain_file_points",
        "rewind points per session (the newest) that keep what a files rewind to them needs "
        "(workspace snapshots, the CLI's file backups), 0 for all; what only older points need is "
        "deleted, and those points are marked files_pruned",
        convert=count,
        metavar="N",
        default_help="0: all",
    ),
    Flag(
        "--retain-file-days",
        "retain_file_days",
        "points younger than this many days keep what a files rewind to them needs, 0 for no age "
        "bound; with --retain-file-points, a point is pruned when either says so",
        convert=seconds,
        metavar="DAYS",
        default_help="0: no age bound",
    ),
    Flag(
        "--max-session-storage",
        "max_session_storage",
        "bytes a session may hold (its workspace and its history: transcript, the CLI's file "
        "backups, snapshots), 0 for no limit; a Prompt or ForkSession of a session at or over it "
        "is refused (RESOURCE_EXHAUSTED, QUOTA_EXCEEDED); rewinds, reads and deletes never are",
        convert=count,
        metavar="BYTES",
        default_help="0: no limit",
    ),
    Flag(
        "--max-principal-storage",
        "max_principal_storage",
        "bytes a principal's sessions may hold together (across replicas, from the ledger), 0 for "
        "no limit; a Prompt or ForkSession is refused over it as over the session limit",
        convert=count,
        metavar="BYTES",
        default_help="0: no limit",
    ),
    Flag(
        "--storage-reserve",
        "storage_reserve",
        "bytes kept in a file in the state dir for the service's own writes (ledger, transcripts) "
        "when a workspace fills the volume: released when it is full, made again once twice this "
        "is free; no Prompt or ForkSession starts while it is released or while the state dir's or "
        "the workspace's volume has less than this free (RESOURCE_EXHAUSTED, QUOTA_EXCEEDED); 0: none",
        convert=count,
        metavar="BYTES",
        default_help="67108864 (64 MiB)",
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
