"""What stops a start for its configuration: `StartError`, and the files `serve` flags name (each
must be readable by the server's user, and none readable by an agent's command)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from agent_rewind.config.record import Config
from agent_rewind.config.serve import SERVE_FLAGS


class StartError(Exception):
    """The server cannot start with this configuration; the message says why. A usage error
    (a flag this host cannot honour) exits 2, like a bad flag."""

    def __init__(self, message: str, *, usage: bool = False) -> None:
        super().__init__(message)
        self.usage = usage


# The Config fields of the files the service reads, each set by a `serve` flag.
FILE_FIELDS = (
    "access_file",
    "tls_cert",
    "tls_key",
    "tls_client_ca",
    "replica_ca",
    "database_password_file",
    "webhook_secret_file",
)


def service_files(config: Config) -> list[Path]:
    """The service's own files and directories, which no command of an agent may read."""
    files = [getattr(config, field) for field in FILE_FIELDS]
    return [config.state_dir, *config.workspace_roots, *(f for f in files if f is not None)]


def check_files_readable(config: Config) -> None:
    """Every file a flag names can be read by this process, or a one-line StartError names the
    flag, its environment variable, the path, and the uid and gid that must read it.

    A Secret mounted with an owner or mode the image's user (uid 10001) cannot read is the usual
    cause; a bare `[Errno 13] Permission denied: PATH` names neither the setting nor the user.
    """
    flags = {flag.config_field: flag for flag in SERVE_FLAGS}
    for field in FILE_FIELDS:
        path: Path | None = getattr(config, field)
        if path is None:
            continue
        try:
            # Not blocking on a FIFO; a directory opens, so its type is checked too.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                problem = "is a directory" if stat.S_ISDIR(os.fstat(fd).st_mode) else None
            finally:
                os.close(fd)
        except OSError as err:
            problem = (err.strerror or str(err)).lower()
        if problem is not None:
            flag = flags[field]
            raise StartError(
                f"{flag.name} (or {flag.env_var}) {path}: {problem}; the server runs as uid "
                f"{os.getuid()}, gid {os.getgid()}, which must be able to read it"
            )
