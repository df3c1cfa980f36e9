"""`make load` runs from a fresh clone: the generator at a tiny size, for a few seconds, gives a
well-formed report whose consistency check passed (the measurements themselves are `make load`'s
to judge, never a test's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_load_generator_runs_and_every_session_matches_its_model(tmp_path: Path) -> None:
    report = tmp_path / "load.json"
    args = ["--sessions", "4", "--principals", "2", "--watchers", "2", "--seconds", "5"]
    args += ["--max-live-sessions", "2", "--warmup-turns", "1", "--recall", "1", "--seed", "41"]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.load", *args, "--json", str(report)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    got = json.loads(report.read_text())
    (run,) = got["runs"]
    assert run["options"]["sessions"] == 4 and run["options"]["principals"] == 2
    # Every call the loops made is in a row of its RPC, with its latencies and errors.
    assert run["calls"] == sum(row["calls"] for row in run["rpcs"].values()) > 0
    for row in run["rpcs"].values():
        assert row["ok"] + sum(row["errors"].values()) == row["calls"]
        assert row["ok"] == 0 or row["p50"] <= row["p99"]
    assert run["rpcs"]["Prompt"]["ok"] > 0
    assert run["cpu"]["server_s"] > 0 and run["server"]["peak_rss_kb"] > 0
    assert run["cli"]["peak_alive"] <= 2
    # The check at the end looked at every session, and found each as its model says.
    consistency = run["consistency"]
    assert consistency["passed"], consistency["first_violations"]
    assert consistency["checked"]["sessions checked"] >= 4 - consistency["checked"].get(
        "deleted sessions checked", 0
    )
    assert consistency["checked"]["recalls"] >= 1
    assert run["faults"] == 0
    assert run["events"]["missing"] == 0
