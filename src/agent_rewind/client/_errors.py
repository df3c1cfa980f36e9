"""Rendering a failed RPC as a few lines a person can act on, never a traceback."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from google.protobuf.message import DecodeError

# googleapis-common-protos ships .pyi stubs but no py.typed marker; the second code keeps this line
# clean once mypy is told to follow google.rpc's stubs (follow_untyped_imports).
from google.rpc import code_pb2, error_details_pb2, status_pb2  # type: ignore[import-untyped, unused-ignore]

from agent_rewind.errors import NEXT_STEPS

# Where gRPC carries the google.rpc.Status of a failed call (the same key grpc_status reads).
_DETAILS_KEY = "grpc-status-details-bin"
_UNREACHABLE_HINT = "is the server running (`make run` in another terminal)?"
_TLS_FLAGS = "--tls-ca, --tls-cert/--tls-key or $AGENT_REWIND_TLS_*"
# (text in the channel's message, over TLS?, hint): a connection that failed in its TLS handshake.
_TLS_HINTS = (
    (
        "CERTIFICATE_VERIFY_FAILED",
        True,
        "the server's certificate is not signed by a trusted CA: pass the CA that signed it with --tls-ca",
    ),
    ("Hostname Verification", True, "the server's certificate does not name the host of --server"),
    ("WRONG_VERSION_NUMBER", True, f"the server does not speak TLS: call it without {_TLS_FLAGS}"),
    (
        "security handshaker",
        True,
        "the TLS files cannot be used: is --tls-key the key of --tls-cert, and --tls-ca a CA certificate?",
    ),
    (
        "Socket closed",
        True,
        "the server closed the connection in the TLS handshake: does it want a client certificate "
        "(--tls-cert/--tls-key) signed by a CA it trusts?",
    ),
    (
        "Socket closed",
        False,
        "the server closed the connection: if it serves TLS, pass --tls-ca (and --tls-cert/--tls-key "
        f"for mutual TLS); else {_UNREACHABLE_HINT}",
    ),
)
_AUTH_HINTS = {
    code_pb2.UNAUTHENTICATED: "the service admits a token (--token-file FILE or $AGENT_REWIND_TOKEN) "
    "or a client certificate (--tls-cert/--tls-key) that its access file lists",
    code_pb2.PERMISSION_DENIED: "ask the service's operator to grant it in the access file",
}


def _cursor(metadata: Mapping[str, str], key: str) -> int | None:
    try:
        value = int(metadata[key])
    except (KeyError, ValueError):
        return None
    return value if value >= 0 else None


def _cursor_expired_hint(metadata: Mapping[str, str], resume_after: int | None) -> str:
    oldest = _cursor(metadata, "oldest_cursor")
    gone = f"the events before cursor {oldest} are" if oldest else "events after that cursor are"
    resume = (
        f"--after {oldest - 1} (or --after 0: from the oldest event kept)"
        if oldest and oldest > 1
        else "--after 0 (from the oldest event kept)"
    )
    return (
        f"{gone} no longer kept and changes may have been missed: resync what you mirror "
        f"(`agent-rewind points SESSION`), then watch again with {resume}"
    )


def _too_slow_hint(metadata: Mapping[str, str], resume_after: int | None) -> str:
    last = _cursor(metadata, "last_cursor")
    if last is None:
        last = resume_after
    if last is None:
        return "read the events faster, and watch again with --after the last cursor received"
    return f"resume with --after {last} (the last cursor sent): the events after it are replayed"


# Reasons whose error says what to do next: (ErrorInfo metadata, the last cursor a watch printed) -> hint.
def _external_changes_hint(metadata: Mapping[str, str], resume_after: int | None) -> str:
    return (
        "see them with --dry-run (--diff for the changes), then rewind with --conflicts skip "
        "(leave those paths as they are) or --conflicts overwrite"
    )


def _revert_conflict_hint(metadata: Mapping[str, str], resume_after: int | None) -> str:
    return (
        "see them with --dry-run (--diff for what the revert would apply), then revert with "
        "--conflicts skip (leave those files as they are) or --conflicts overwrite (put them back "
        "as they were before the turn; what changed since is lost)"
    )


_REASON_HINTS: dict[str, Callable[[Mapping[str, str], int | None], str]] = {
    "CURSOR_EXPIRED": _cursor_expired_hint,
    "SUBSCRIBER_TOO_SLOW": _too_slow_hint,
    "EXTERNAL_CHANGES": _external_changes_hint,
    "REVERT_CONFLICT": _revert_conflict_hint,
}


def next_step(reason: str) -> str | None:
    """What to do after a refusal with this reason (agent_rewind.errors.NEXT_STEPS, the table
    docs/errors.md shows), its links to other pages as the paths of those pages."""
    step = NEXT_STEPS.get(reason)
    return None if step is None else re.sub(r"\[[^\]]*\]\(([^)#]+)[^)]*\)", r"docs/\1", step)


def refusal_hint(reason: str, metadata: Mapping[str, str]) -> str | None:
    """What to do after a refusal: in this CLI's terms for a reason it has flags for, else the
    service's `next_step`."""
    cli_hint = _REASON_HINTS.get(reason)
    return cli_hint(metadata, None) if cli_hint is not None else next_step(reason)


def code_name(code: int) -> str:
    """`5` -> `NOT_FOUND`."""
    try:
        name: str = code_pb2.Code.Name(code)
    except ValueError:
        return f"CODE_{code}"
    return name


def status_from_error(error: Any) -> status_pb2.Status:
    """The google.rpc.Status of a failed call, or one built from its code and details.

    Parsed from the trailing metadata directly rather than by `grpc_status.rpc_status.from_call`,
    which raises when code or message disagree with the header; we want to show whatever arrived.
    """
    rich: status_pb2.Status | None = None
    trailing: Any = None
    try:
        trailing = error.trailing_metadata()
    except AttributeError:  # not a grpc.Call: there are no details to read
        trailing = None
    for key, value in trailing or ():
        if key == _DETAILS_KEY and isinstance(value, bytes):
            try:
                rich = status_pb2.Status.FromString(value)
            except DecodeError:  # undecodable details: fall back to the plain code and message
                rich = None
            break
    if rich is None:
        rich = status_pb2.Status()
    code = _call_code(error)
    if code is not None and not rich.code:
        rich.code = code
    if not rich.message:
        rich.message = _call_details(error)
    return rich


def _call_code(error: Any) -> int | None:
    try:
        value = error.code().value
    except AttributeError:
        return None
    # grpc.StatusCode values are (int, "name") tuples.
    if isinstance(value, tuple) and value and isinstance(value[0], int):
        return value[0]
    return None


def _call_details(error: Any) -> str:
    try:
        details = error.details()
    except AttributeError:
        return str(error)
    return str(details or "")


def error_info(status: status_pb2.Status) -> error_details_pb2.ErrorInfo | None:
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return info
    return None


def is_unreachable(status: status_pb2.Status) -> bool:
    """UNAVAILABLE from the channel itself (no ErrorInfo), as opposed to the service's AGENT_UNAVAILABLE."""
    return status.code == code_pb2.UNAVAILABLE and error_info(status) is None


def _unreachable_hint(message: str, tls: bool) -> str:
    for needle, over_tls, hint in _TLS_HINTS:
        if needle in message and over_tls == tls:
            return hint
    return _UNREACHABLE_HINT


def render_status(
    status: status_pb2.Status,
    *,
    server: str | None = None,
    tls: bool = False,
    resume_after: int | None = None,
) -> list[str]:
    """`error: <STATUS> <REASON>: <message>`, then metadata and field violations, one per line.

    A server that cannot be reached, and a call refused as UNAUTHENTICATED or PERMISSION_DENIED, are
    one line with a hint. `tls` says whether the call went over TLS (for the hint to a failed handshake).
    A refusal gets a last `hint:` line saying what to do next: for a reason this CLI has flags for
    (a watch that ended with CURSOR_EXPIRED or SUBSCRIBER_TOO_SLOW, conflicts) in its terms, else
    the service's (`next_step`); `resume_after`, the last cursor a watch printed, gives any other
    failure of it the line `hint: resume with --after N`.
    """
    lines = _render(status, server=server, tls=tls)
    info = error_info(status)
    reason_hint = _REASON_HINTS.get(info.reason) if info is not None else None
    if reason_hint is not None and info is not None:
        lines.append(f"hint: {reason_hint(info.metadata, resume_after)}")
    elif resume_after is not None:
        lines.append(f"hint: resume with --after {resume_after} (the last cursor printed)")
    elif info is not None and status.code not in _AUTH_HINTS and (step := next_step(info.reason)):
        # (The auth refusals are one line that ends with their own hint.)
        lines.append(f"hint: {step}")
    return lines


def _render(status: status_pb2.Status, *, server: str | None, tls: bool) -> list[str]:
    name = code_name(status.code)
    if is_unreachable(status):
        where = f" at {server}" if server else ""
        first = status.message.splitlines()[0] if status.message else "unavailable"
        return [f"error: cannot reach agent-rewind{where} ({first}); {_unreachable_hint(first, tls)}"]
    info = error_info(status)
    if status.code in _AUTH_HINTS:
        # The reason is the status' own name: say it once. The message names what is missing.
        reason = f" {info.reason}" if info and info.reason and info.reason != name else ""
        message = status.message.splitlines()[0] if status.message else name.lower().replace("_", " ")
        return [f"error: {name}{reason}: {message}; {_AUTH_HINTS[status.code]}"]
    head = f"error: {name} {info.reason}" if info and info.reason else f"error: {name}"
    lines = [f"{head}: {status.message}" if status.message else head]
    violations = [v for d in status.details if (bad := _bad_request(d)) for v in bad.field_violations]
    if info is not None:
        # A field the violations below name is said there, not again as metadata.
        named = {v.field for v in violations}
        lines.extend(
            f"  {key}: {info.metadata[key]}"
            for key in sorted(info.metadata)
            if not (key == "field" and info.metadata[key] in named)
        )
    # A violation the message already says (the one bad field, usually) is not said twice.
    lines.extend(
        f"  field {v.field}: {v.description}"
        for v in violations
        if f"{v.field}: {v.description}" != status.message
    )
    for detail in status.details:
        retry = error_details_pb2.RetryInfo()
        if detail.Unpack(retry):
            delay = retry.retry_delay.seconds + retry.retry_delay.nanos / 1e9
            lines.append(f"  retry after {delay:g}s")
    return lines


def _bad_request(detail: Any) -> error_details_pb2.BadRequest | None:
    bad = error_details_pb2.BadRequest()
    return bad if detail.Unpack(bad) else None


def render_rpc_error(
    error: Any, *, server: str | None = None, tls: bool = False, resume_after: int | None = None
) -> list[str]:
    """The lines `render_status` gives for a raised grpc.RpcError."""
    return render_status(status_from_error(error), server=server, tls=tls, resume_after=resume_after)
