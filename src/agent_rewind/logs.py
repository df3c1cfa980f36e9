"""structlog setup: JSON lines in production, readable console output on a TTY."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


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
        processors.append(structlog.dev.ConsoleRenderer())
    else:
        processors += [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
