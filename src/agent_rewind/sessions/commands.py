"""Which prompts the CLI would take as slash commands, and which of those the service runs.

The CLI answers a slash command itself, in ways the service cannot always keep consistent with
its own view: `/clear` starts a second transcript under a new session id, `/resume` switches
sessions, `/rewind` cuts the conversation behind the ledger's back, and others open dialogs that
nobody answers. So a prompt whose first word has a command's shape is refused unless the command
is one the service has been tested to stay consistent with. Text that merely starts with a path
("/etc/hosts is ...") is not a command to the CLI, and is sent as a prompt; so is any prompt that
starts with a space.
"""

from __future__ import annotations

import re

from agent_rewind.errors import InvalidArgument

# What the CLI reads as a command: "/" and a name, then a space or the end.
_COMMAND = re.compile(r"^/([A-Za-z0-9][A-Za-z0-9_:.-]*)(?:\s|$)")

# Commands the service runs, each covered by an integration test:
# /compact summarizes the conversation; the prompts before it stay rewind points (compacted).
ALLOWED = frozenset({"compact"})


def check_prompt(text: str) -> None:
    """INVALID_ARGUMENT naming `text` for a slash command the service does not run."""
    match = _COMMAND.match(text)
    if match is None:
        return
    name = match.group(1)
    if name.lower() not in ALLOWED:
        allowed = ", ".join(f"/{c}" for c in sorted(ALLOWED))
        raise InvalidArgument(
            "text",
            f"/{name} is a Claude Code slash command the service does not run (only {allowed}); "
            "start the prompt with a space to send it to the model as text",
        )
