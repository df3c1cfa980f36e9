"""Service configuration: command-line flags with environment fallbacks.

`record.py` holds the Config record, `flag.py` how one flag is declared and read from the command
line or the environment, `serve.py` the table of `serve` flags and the parsing, `start.py` what stops a start for its
configuration. Every name is
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
from agent_rewind.config.start import FILE_FIELDS, StartError, check_files_readable, service_files

__all__ = [
    "CREDENTIAL_VARIABLES",
    "DEFAULT_LISTEN",
    "ENV_PREFIX",
    "FILE_FIELDS",
    "SERVE_FLAGS",
    "Config",
    "Flag",
    "ModelBackend",
    "StartError",
    "add_arguments",
    "advertised",
    "build_parser",
    "check_files_readable",
    "count",
    "from_arguments",
    "lease",
    "parse_args",
    "positive_int",
    "seconds",
    "service_files",
]
