"""The test-only fault hook: inert unless armed, then SIGKILL at exactly the named step and hit."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agent_rewind import faults

SCRIPT = """
import sys
from agent_rewind import faults
for i in range(3):
    print(i, flush=True)
    faults.point("turn.accepted")
print("survived", flush=True)
"""


def _run(value: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AGENT_REWIND_FAULT": value}
    return subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=60)


def test_unarmed_points_do_nothing() -> None:
    for step in faults.STEPS:
        faults.point(step)


def test_an_unknown_step_is_a_bug() -> None:
    with pytest.raises(ValueError):
        faults.point("no.such.step")


def test_an_armed_step_kills_the_process_at_its_nth_hit() -> None:
    done = _run("turn.accepted@2")
    assert done.returncode == -9
    assert done.stdout.split() == ["0", "1"]
    assert "fault injected at turn.accepted" in done.stderr


def test_another_armed_step_leaves_this_one_alone() -> None:
    done = _run("turn.result")
    assert done.returncode == 0 and "survived" in done.stdout


def test_a_misspelt_step_fails_loudly_at_start() -> None:
    done = _run("turn.acepted")
    assert done.returncode != 0 and "unknown step" in done.stderr
