"""Who is calling: credentials from a call, the principal they name, and what each RPC needs.

The permission each RPC needs is in one table here (API.md, "Identity and ownership"); the
handlers in `rpc/handlers.py` authenticate every call and check it before the servicer runs, and
the servicers check ownership of the sessions they touch.
"""

from __future__ import annotations

import contextvars
import hmac

import grpc

from agent_rewind.access import LOCAL, AccessFile, Permission, Principal
from agent_rewind.errors import Unauthenticated

# RPC -> the permission it needs (None: any authenticated caller).
METHOD_PERMISSIONS: dict[str, Permission | None] = {
    "CreateSession": Permission.SESSIONS_WRITE,
    "GetSession": Permission.SESSIONS_READ,
    "ListSessions": Permission.SESSIONS_READ,
    "Prompt": Permission.SESSIONS_WRITE,
    "Interrupt": Permission.SESSIONS_WRITE,
    "CloseSession": Permission.SESSIONS_WRITE,
    "ForkSession": Permission.SESSIONS_WRITE,
    "DeleteSession": Permission.SESSIONS_WRITE,
    "GetCapabilities": None,
    "ListRewindPoints": Permission.REWIND_PREVIEW,
    "DryRun": Permission.REWIND_PREVIEW,
    "Rewind": Permission.REWIND,
    "UndoRewind": Permission.REWIND,
    "WatchRewindEvents": Permission.EVENTS_READ,
}

# The metadata of a forwarded call: which replica forwarded it, for whom, and its proof.
FORWARDED_BY = "agent-rewind-forwarded-by"
PRINCIPAL = "agent-rewind-principal"
REPLICA_SECRET = "agent-rewind-replica-secret"

_current: contextvars.ContextVar[Principal] = contextvars.ContextVar("principal", default=LOCAL)
_forwarded_by: contextvars.ContextVar[str] = contextvars.ContextVar("forwarded_by", default="")


def current() -> Principal:
    """The principal of the call being handled."""
    return _current.get()


def forwarded_by() -> str:
    """The replica that forwarded the call being handled; "" for a call from a client."""
    return _forwarded_by.get()


class Authenticator:
    """Credentials -> principal. Without an access file every caller is the local principal (a
    server that listens on loopback only, or one started with --insecure)."""

    def __init__(self, access: AccessFile | None, replica_secret: str = "") -> None:
        self.access = access
        # The deployment's replica secret (set once the ledger is open); "" accepts no forwarded call.
        self.replica_secret = replica_secret

    @property
    def enabled(self) -> bool:
        return self.access is not None

    def authenticate(self, context: grpc.aio.ServicerContext, metadata: dict[str, str]) -> Principal:
        """The caller's principal; `metadata`: the call's (text) metadata, by lower-case key."""
        if FORWARDED_BY in metadata:
            return self._forwarded(metadata)
        if self.access is None:
            return LOCAL
        header = metadata.get("authorization")
        if header is not None:
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise Unauthenticated(
                    "the authorization header must be the word Bearer, a space, and the token"
                )
            return self.access.by_token(token.strip())
        names = (context.auth_context() or {}).get("x509_common_name") or []
        if names:
            return self.access.by_subject(names[0].decode(errors="replace"))
        raise Unauthenticated("no credentials: send 'authorization: Bearer <token>', or a client certificate")

    def _forwarded(self, metadata: dict[str, str]) -> Principal:
        """The principal another replica authenticated, if the call proves it comes from one."""
        secret = metadata.get(REPLICA_SECRET, "")
        if not self.replica_secret or not hmac.compare_digest(secret.encode(), self.replica_secret.encode()):
            raise Unauthenticated("a forwarded call must carry the deployment's replica secret")
        if self.access is None:
            return LOCAL
        return self.access.by_name(metadata.get(PRINCIPAL, ""))

    def admit(self, method: str, context: grpc.aio.ServicerContext) -> Principal:
        """Authenticates the call and checks the permission its RPC needs; sets `current()` and
        `forwarded_by()`."""
        metadata = {k.lower(): v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        principal = self.authenticate(context, metadata)
        needed = METHOD_PERMISSIONS[method]
        if needed is not None:
            principal.require(needed)
        _current.set(principal)
        _forwarded_by.set(metadata.get(FORWARDED_BY, ""))
        return principal
