"""Client helpers shared by the `agent-rewind` CLI and scripts/demo.py.

A typed synchronous client (`Client`) with its credentials (a bearer token, TLS) and where the
command line finds them (`resolve_credentials`), parsing of command-line values, plain-text formatting of
the API's messages, and rendering of failed RPCs.
"""

from ._connection import DEFAULT_SERVER, SERVER_ENV, Client, PromptStream, is_loopback, resolve_server
from ._credentials import (
    TLS_CA_ENV,
    TLS_CERT_ENV,
    TLS_KEY_ENV,
    TOKEN_ENV,
    BearerToken,
    Credentials,
    Tls,
    check_token,
    resolve_credentials,
)
from ._errors import code_name, error_info, is_unreachable, render_rpc_error, render_status, status_from_error
from ._formatting import (
    format_capabilities,
    format_duration,
    format_points,
    format_rewind_result,
    format_session,
    format_sessions,
    format_table,
    format_time,
    format_turn_event,
    format_turn_result,
    one_line,
    state_name,
    summarize_input,
    to_json,
)
from ._parsing import MODES, UsageError, build_options, mode_name, parse_mode, parse_option, read_prompt_text
from ._turns import TurnOutcome, follow_turn

__all__ = [
    "DEFAULT_SERVER",
    "MODES",
    "SERVER_ENV",
    "TLS_CA_ENV",
    "TLS_CERT_ENV",
    "TLS_KEY_ENV",
    "TOKEN_ENV",
    "BearerToken",
    "Client",
    "Credentials",
    "PromptStream",
    "Tls",
    "TurnOutcome",
    "UsageError",
    "build_options",
    "check_token",
    "code_name",
    "error_info",
    "follow_turn",
    "format_capabilities",
    "format_duration",
    "format_points",
    "format_rewind_result",
    "format_session",
    "format_sessions",
    "format_table",
    "format_time",
    "format_turn_event",
    "format_turn_result",
    "is_loopback",
    "is_unreachable",
    "mode_name",
    "one_line",
    "parse_mode",
    "parse_option",
    "read_prompt_text",
    "render_rpc_error",
    "render_status",
    "resolve_credentials",
    "resolve_server",
    "state_name",
    "status_from_error",
    "summarize_input",
    "to_json",
]
