"""Service configuration: command-line flags with environment fallbacks.

`record.py` holds the Config record, `flag.py` how one flag is declared and read from the command
line or the environment, `serve.py` the table of `serve` flags and the parsing. Every name is
importable from here, as it was when this was one module.
"""

from agent_rewind.config.flag import ENV_PREFIX, Flag, count, lease, positive_int, seconds
from agent_rewind.config.record import DEFAULT_LISTEN, Config, ModelBackend, advertised
from agent_rewind.config.serve import (
    CREDENTIAL_VARIABLES,
    SERVE_FLAGS,
    add_arguments,
    build_parser,
    from_arguments,
    parse_args,
)

__all__ = [
    "CREDENTIAL_VARIABLES",
    "DEFAULT_LISTEN",
    "ENV_PREFIX",
    "SERVE_FLAGS",
    "Config",
    "Flag",
    "ModelBackend",
    "add_arguments",
    "advertised",
    "build_parser",
    "count",
    "from_arguments",
    "lease",
    "parse_args",
    "positive_int",
    "seconds",
]
