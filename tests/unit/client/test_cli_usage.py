"""A usage error of any command prints that command's usage and names it, not the top level's."""

from __future__ import annotations

import pytest

from agent_rewind.cli import main

SID = "11111111-2222-3333-4444-555555555555"
# A port nothing listens on: none of these commands gets as far as calling it.
NOWHERE = ["--server", "127.0.0.1:1"]


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        # An unknown flag or a surplus argument (argparse leaves these to the caller).
        (["session", "fork", SID, "p0", "--at", "p1"], "session fork"),
        (["points", SID, "--bogus"], "points"),
        (["capabilities", "extra"], "capabilities"),
        (["webhooks", "--bogus"], "webhooks"),
        (["token", "hash", "--bogus"], "token hash"),
        # A missing argument, and a value its type refuses.
        (["rewind", SID, "p0"], "rewind"),
        (["watch", "--after", "x"], "watch"),
        (["session", "show"], "session show"),
        # Refused by the command itself, before any call.
        (["rewind", SID, "p0", "--mode", "files", "--diff"], "rewind"),
    ],
)
def test_a_usage_error_prints_the_usage_of_the_command_given(
    argv: list[str], command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*NOWHERE, *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: agent-rewind {command} "), err
    assert err.splitlines()[-1].startswith(f"agent-rewind {command}: error: ")
