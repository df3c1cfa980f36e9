"""structlog setup: JSON lines in production, readable console output on a TTY."""

from __future__ import annotations

import logging
import re
import sys
import threading
from collections.abc import MutableMapping
from typing import Any

import structlog

# Values that must never reach a log line: credentials from the environment, MCP headers of
# sessions. Anything that looks like a credential is masked too.
_secrets: set[str] = set()
_secrets_lock = threading.Lock()
_PATTERNS = re.compile(r"(?i)\bbearer\s+\S+|\bsk-ant-[\w-]+|\barw_[\w-]+")
REDACTED = "[redacted]"


def secret(value: str) -> None:
    """Registers a value the logs must never show (too short a value would mask too much)."""
    if len(value) >= 8:
        with _secrets_lock:
            _secrets.add(value)


def redact(text: str) -> str:
    with _secrets_lock:
        known = sorted(_secrets, key=len, reverse=True)
    for value in known:
        if value in text:
            text = text.replace(value, REDACTED)
    return _PATTERNS.sub(REDACTED, text)


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _redact_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_redact_value(v) for v in value)
    return value


def redact_secrets(
    logger: Any, method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """A structlog processor: masks secrets in every field, the rendered exception included."""
    for key, value in list(event_dict.items()):
        event_dict[key] = _redact_value(value)
    return event_dict


def configure(fmt: str = "auto", level: str = "info") -> None:
    """`fmt` is json, console, or auto (console on a TTY, else JSON)."""
    use_console = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    if use_console:
        processors += [redact_secrets, structlog.dev.ConsoleRenderer()]
    else:
        processors += [
            structlog.processors.format_exc_info,
            redact_secrets,
            structlog.processors.JSONRenderer(),
        ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
