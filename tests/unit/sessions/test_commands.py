"""Slash commands (sessions/commands.py): the CLI's commands the service does not run are refused
as INVALID_ARGUMENT naming `text`; /compact and ordinary text pass."""

from __future__ import annotations

import pytest

from agent_rewind.errors import InvalidArgument
from agent_rewind.sessions.commands import ALLOWED, check_prompt


def test_only_compact_is_run() -> None:
    assert frozenset({"compact"}) == ALLOWED


@pytest.mark.parametrize(
    "text", ["/compact", "/compact keep the API notes", "/COMPACT", "/Compact\nfocus on tests"]
)
def test_compact_is_sent(text: str) -> None:
    check_prompt(text)


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("/clear", "clear"),
        ("/resume 0b7f3c1e-5a8d-4d6e-9f10-2a3b4c5d6e7f", "resume"),
        ("/rewind", "rewind"),
        ("/model opus", "model"),
        ("/config", "config"),
        ("/plugin:command arg", "plugin:command"),
        ("/my-skill.v2\tnow", "my-skill.v2"),
        ("/clear\nthen say hi", "clear"),
        ("/compacts", "compacts"),
    ],
)
def test_other_commands_are_refused_naming_the_text_field(text: str, name: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        check_prompt(text)
    assert caught.value.field == "text"
    assert caught.value.reason == "INVALID_ARGUMENT"
    assert f"/{name} " in caught.value.description
    assert "/compact" in caught.value.description  # what is allowed
    assert "start the prompt with a space" in caught.value.description


@pytest.mark.parametrize(
    "text",
    [
        "fix the bug",
        "/etc/hosts lists the local names; explain it",
        "/usr/bin/env python3 is the shebang",
        " /clear",  # a leading space: text for the model
        "please run /clear for me",
        "/",
        "/ clear",
    ],
)
def test_text_that_is_not_a_command_is_sent(text: str) -> None:
    check_prompt(text)
