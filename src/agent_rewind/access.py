"""Who may call, and what they may do: principals, their permissions, and the access file.

A principal is a name and a set of permissions (API.md, "Identity and ownership"). Callers prove
who they are with a bearer token or a TLS client certificate; the access file maps both to
principals. It stores only SHA-256 hashes of tokens, never a token, and is read again when it
changes on disk, so tokens are added and revoked without a restart.

```json
{
  "principals": [
    {
      "name": "billing-backend",
      "permissions": ["sessions.read", "sessions.write", "rewind", "rewind.preview", "events.read"],
      "token_sha256": ["9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"],
      "certificate_subjects": ["billing-backend.prod.svc"]
    }
  ]
}
```

A certificate subject is the client certificate's common name (CN).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import structlog

from agent_rewind.errors import PermissionDenied, Unauthenticated

log = structlog.get_logger(__name__)


class Permission(StrEnum):
    SESSIONS_READ = "sessions.read"
    SESSIONS_WRITE = "sessions.write"
    REWIND = "rewind"
    REWIND_PREVIEW = "rewind.preview"
    EVENTS_READ = "events.read"
    ADMIN = "admin"


@dataclass(frozen=True)  # gremlin: pardon[equivalent] nothing assigns to or hashes one
class Principal:
    name: str
    permissions: frozenset[Permission] = field(default_factory=frozenset)

    @functools.cached_property
    def admin(self) -> bool:  # (cached: owns() runs once per event per watcher)
        return Permission.ADMIN in self.permissions

    def require(self, permission: Permission) -> None:
        """PERMISSION_DENIED naming the permission, unless the principal has it (or admin)."""
        if permission not in self.permissions and not self.admin:
            raise PermissionDenied(permission.value)

    def owns(self, owner: str) -> bool:
        """Whether a session created by `owner` is this principal's to see (admin sees all)."""
        return self.admin or owner == self.name


# Without authentication (a local, loopback-only server), every caller is this principal.
LOCAL = Principal("local", frozenset(Permission))


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A bearer token: 256 random bits, URL-safe."""
    return "arw_" + secrets.token_urlsafe(32)


class AccessFileError(ValueError):
    """The access file is malformed; the message says where."""


def parse(data: Any) -> tuple[dict[str, Principal], dict[str, Principal]]:
    """(token hash -> principal, certificate subject -> principal) from the file's JSON."""
    if not isinstance(data, dict) or not isinstance(data.get("principals"), list):
        raise AccessFileError('needs {"principals": [...]}')
    by_token: dict[str, Principal] = {}
    by_subject: dict[str, Principal] = {}
    names: set[str] = set()
    for n, raw in enumerate(data["principals"]):
        where = f"principals[{n}]"
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not raw["name"].strip():
            raise AccessFileError(f"{where}: needs a name")
        name = raw["name"]
        if name in names:
            raise AccessFileError(f"{where}: {name!r} is named twice")
        names.add(name)
        try:
            permissions = frozenset(Permission(p) for p in raw.get("permissions", []))
        except ValueError as err:
            raise AccessFileError(
                f"{where}: {err}; permissions are {[p.value for p in Permission]}"
            ) from None
        principal = Principal(name, permissions)
        for digest in raw.get("token_sha256", []):
            if (
                not isinstance(digest, str)
                or len(digest) != 64
                or any(c not in "0123456789abcdef" for c in digest)
            ):
                raise AccessFileError(f"{where}: token_sha256 holds lowercase hex SHA-256 digests")
            if digest in by_token:
                raise AccessFileError(f"{where}: a token hash is listed twice")
            by_token[digest] = principal
        for subject in raw.get("certificate_subjects", []):
            if not isinstance(subject, str) or not subject:
                raise AccessFileError(f"{where}: certificate_subjects holds common names")
            by_subject[subject] = principal
    return by_token, by_subject


class AccessFile:
    """The access file, read again (at most once a second) whenever it changed on disk.

    A file that became unreadable or malformed keeps the last good version in force, and says so
    in the log: a typo must not lock every caller out, nor let anyone in.
    """

    def __init__(self, path: Path, *, check_every: float = 1.0) -> None:
        self.path = path
        self._check_every = check_every
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._checked = 0.0
        self._by_token: dict[str, Principal] = {}
        self._by_subject: dict[str, Principal] = {}
        self._by_name: dict[str, Principal] = {}
        self.reload(force=True)

    def reload(self, *, force: bool = False) -> None:
        with self._lock:
            now = time.monotonic()
            if not force and now - self._checked < self._check_every:
                return
            self._checked = now
            try:
                st = os.stat(self.path)
                stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
                if not force and stamp == self._stamp:
                    return
                data = json.loads(self.path.read_text())
                by_token, by_subject = parse(data)
            except (OSError, ValueError) as err:
                if force:  # the start (the only forced read): no version in force yet
                    raise AccessFileError(f"{self.path}: {err}") from err
                log.error("access file not reloaded; the previous version stays in force", error=str(err))
                return
            self._stamp = stamp
            self._by_token, self._by_subject = by_token, by_subject
            # Every principal by name, one with no token or certificate too (a webhook's).
            self._by_name = {
                raw["name"]: Principal(
                    raw["name"], frozenset(Permission(x) for x in raw.get("permissions", []))
                )
                for raw in data["principals"]
            }
            log.info(
                "access file loaded",
                principals=len({p.name for p in (*by_token.values(), *by_subject.values())}),
            )

    def by_token(self, token: str) -> Principal:
        self.reload()
        digest = hash_token(token)
        for known, principal in self._by_token.items():
            if hmac.compare_digest(known, digest):
                return principal
        raise Unauthenticated("the bearer token is not valid")

    def by_name(self, name: str) -> Principal:
        """The principal named `name` (a call another replica authenticated and forwarded)."""
        self.reload()
        for principal in (*self._by_token.values(), *self._by_subject.values()):
            if principal.name == name:
                return principal
        raise Unauthenticated("the forwarded call names no principal this replica's access file knows")

    def named(self, name: str) -> Principal | None:
        """The principal the file names `name`, whether or not it has a token or a certificate
        (a webhook's principal needs neither); None when the file names none."""
        self.reload()
        return self._by_name.get(name)

    def by_subject(self, subject: str) -> Principal:
        self.reload()
        principal = self._by_subject.get(subject)
        if principal is None:
            raise Unauthenticated("the client certificate names no principal this service knows")
        return principal
