"""Service configuration: command-line flags with environment fallbacks."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

ModelBackend = Literal["auto", "offline", "anthropic"]

DEFAULT_LISTEN = "127.0.0.1:50051"


@dataclass(frozen=True)
class Config:
    """Everything `agent-rewind serve` needs. Paths are absolute after `resolved()`."""

    state_dir: Path = Path("var")
    workspace_roots: tuple[Path, ...] = ()
    listen: str = DEFAULT_LISTEN
    model: ModelBackend = "auto"
    # Seconds a running turn gets to finish when the server is told to stop.
    shutdown_grace: float = 10.0
    # Seconds an idle session keeps its CLI process before it hibernates (0: never).
    idle_timeout: float = 300.0
    # Seconds allowed for a CLI process to start and answer its first control request.
    connect_timeout: float = 60.0
    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: str = "info"
    # The environment the CLI processes see, beyond what the service sets itself.
    extra_env: dict[str, str] = field(default_factory=dict)

    def resolved(self) -> Config:
        state = self.state_dir.expanduser().resolve()
        roots = self.workspace_roots or (state / "workspaces",)
        return Config(
            state_dir=state,
            workspace_roots=tuple(r.expanduser().resolve() for r in roots),
            listen=self.listen,
            model=self.model,
            shutdown_grace=self.shutdown_grace,
            idle_timeout=self.idle_timeout,
            connect_timeout=self.connect_timeout,
            log_format=self.log_format,
            log_level=self.log_level,
            extra_env=dict(self.extra_env),
        )

    @property
    def claude_config_dir(self) -> Path:
        """Where the CLI keeps transcripts and file backups ($CLAUDE_CONFIG_DIR)."""
        return self.state_dir / "claude"

    @property
    def ledger_path(self) -> Path:
        return self.state_dir / "ledger.sqlite3"

    @property
    def default_workspace_root(self) -> Path:
        return self.workspace_roots[0] if self.workspace_roots else self.state_dir / "workspaces"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `serve` flags. Each has an AGENT_REWIND_* environment fallback."""
    env = os.environ.get
    parser.add_argument(
        "--listen", default=env("AGENT_REWIND_LISTEN", DEFAULT_LISTEN), help="host:port to serve on"
    )
    parser.add_argument(
        "--state-dir",
        default=env("AGENT_REWIND_STATE_DIR", "var"),
        help="where the service and its CLI processes keep all state (default ./var)",
    )
    parser.add_argument(
        "--workspace-root",
        action="append",
        default=None,
        help="a directory session workspaces must live under (repeatable; default <state-dir>/workspaces)",
    )
    parser.add_argument(
        "--model",
        choices=["auto", "offline", "anthropic"],
        default=env("AGENT_REWIND_MODEL", "auto"),
        help="anthropic: the real API (needs ANTHROPIC_API_KEY); offline: the built-in scripted model; "
        "auto: anthropic when a key is set, else offline",
    )
    parser.add_argument(
        "--shutdown-grace", type=float, default=float(env("AGENT_REWIND_SHUTDOWN_GRACE", "10"))
    )
    parser.add_argument("--idle-timeout", type=float, default=float(env("AGENT_REWIND_IDLE_TIMEOUT", "300")))
    parser.add_argument(
        "--log-format", choices=["auto", "json", "console"], default=env("AGENT_REWIND_LOG_FORMAT", "auto")
    )
    parser.add_argument("--log-level", default=env("AGENT_REWIND_LOG_LEVEL", "info"))


def from_arguments(ns: argparse.Namespace) -> Config:
    roots = ns.workspace_root
    if not roots and os.environ.get("AGENT_REWIND_WORKSPACE_ROOTS"):
        roots = os.environ["AGENT_REWIND_WORKSPACE_ROOTS"].split(os.pathsep)
    return Config(
        state_dir=Path(ns.state_dir),
        workspace_roots=tuple(Path(r) for r in roots or ()),
        listen=ns.listen,
        model=ns.model,
        shutdown_grace=ns.shutdown_grace,
        idle_timeout=ns.idle_timeout,
        log_format=ns.log_format,
        log_level=ns.log_level,
    ).resolved()
