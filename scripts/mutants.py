"""`make mutants`: mutation testing (pytest-gremlins) of the modules where a silent bug costs most.

Each group mutates one module and runs, for each mutant, only the tests of the group that cover
the mutated line (pytest-gremlins' coverage-guided selection), each mutant in a subprocess of its
own. The tests are chosen per module so each group takes minutes on two cores (every group:
about three hours): the module's unit tests and the fast integration tests that drive it through the real server in the test's
own process (a server in a process of its own runs unmutated code, so those are left out).

Why pytest-gremlins (measured here, docs/reliability.md): mutmut 3.8 forks its mutant workers
from a process that has run the tests, and once grpc's threads exist there the forked children
deadlock (a pytest run that never ends); cosmic-ray rewrites the file and runs the whole test
command per mutant, with no per-mutant test selection, many times slower on this suite.

The report (`.mutants/report.md`, printed at the end) has the score per module and every
surviving mutant; docs/reliability.md records the last run and explains each survivor that is
equivalent (a change no behaviour can show). `python scripts/mutants.py --only NAME` runs one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".mutants"
REPORT = ROOT / "coverage" / "gremlins" / "gremlins.json"


@dataclass(frozen=True)
class Group:
    name: str
    module: str  # under src/agent_rewind/
    tests: tuple[str, ...]
    select: str = ""  # a pytest -k expression, where a module's tests are a subset of the files


GROUPS = (
    Group("auth", "rpc/auth.py", ("tests/unit/rpc", "tests/integration/test_auth.py")),
    Group("forwarding", "rpc/forwarding.py", ("tests/unit/rpc/test_forwarding.py",)),
    Group("handlers", "rpc/handlers.py", ("tests/unit/rpc", "tests/integration/test_auth.py")),
    Group("engine", "rewind/engine.py", ("tests/unit/rewind",)),
    Group("undo", "rewind/undo.py", ("tests/unit/rewind", "tests/integration/test_history.py")),
    Group("intent", "rewind/intent.py", ("tests/unit/rewind",)),
    Group("side-effects", "rewind/side_effects.py", ("tests/unit/rewind/test_side_effects.py",)),
    # The session worker and the parts it delegates to, one group each. The worker is a facade:
    # what its delegations carry is asserted by every part's tests. Each part's group takes the
    # files whose tests drive it (together they reach every line of it the worker's tests reach).
    Group(
        "worker",
        "sessions/worker.py",
        (
            "tests/unit/sessions/test_worker.py",
            "tests/unit/sessions/test_running.py",
            "tests/unit/sessions/test_request_ids.py",
            "tests/unit/sessions/test_lifecycle_start.py",
            "tests/unit/sessions/test_lifecycle_stop.py",
            "tests/unit/sessions/test_conversation.py",
            "tests/unit/sessions/test_snapshot_taking.py",
        ),
    ),
    Group(
        "state",
        "sessions/state.py",
        (
            "tests/unit/sessions/test_worker.py",
            "tests/unit/sessions/test_running.py",
            "tests/unit/sessions/test_lifecycle_stop.py",
        ),
    ),
    Group(
        "running",
        "sessions/running.py",
        (
            "tests/unit/sessions/test_running.py",
            "tests/unit/sessions/test_request_ids.py",
            "tests/unit/sessions/test_lifecycle_stop.py",
            "tests/unit/sessions/test_snapshot_taking.py",
        ),
    ),
    Group(
        "lifecycle",
        "sessions/lifecycle.py",
        (
            "tests/unit/sessions/test_lifecycle_start.py",
            "tests/unit/sessions/test_lifecycle_stop.py",
        ),
    ),
    Group(
        "conversation",
        "sessions/conversation.py",
        (
            "tests/unit/sessions/test_conversation.py",
            "tests/unit/sessions/test_lifecycle_start.py",
        ),
    ),
    Group(
        "status",
        "sessions/status.py",
        (
            "tests/unit/sessions/test_status.py",
            "tests/unit/sessions/test_worker.py",
            "tests/unit/sessions/test_running.py",
            "tests/unit/sessions/test_lifecycle_stop.py",
        ),
    ),
    Group("compaction", "transcript/compaction.py", ("tests/unit/transcript",)),
    Group(
        "turns",
        "sessions/turns.py",
        (
            "tests/unit/sessions/test_turns.py",
            "tests/unit/sessions/test_running.py",
            "tests/unit/sessions/test_request_ids.py",
        ),
    ),
    # The ledger contract tests run on both ledgers; each dialect's group takes its own half, and
    # the SQL core both run is mutated under SQLite's (the faster to start).
    # The SQL stores, one per concern (store/sql/), mutated as one group.
    Group("store-core", "store/sql", ("tests/unit/store",), select="not postgres"),
    Group("store-dialect", "store/dialect.py", ("tests/unit/store",), select="not postgres"),
    Group("store-postgres", "store/postgres.py", ("tests/unit/store",), select="not sqlite"),
    Group("store-sqlite", "store/sqlite.py", ("tests/unit/store",), select="not postgres"),
    Group("replicas", "replicas.py", ("tests/unit/test_replicas.py", "tests/unit/store")),
    Group("policy", "sessions/policy.py", ("tests/unit/sessions/test_policy.py",)),
    Group("options", "sessions/options.py", ("tests/unit/sessions/test_options.py",)),
    Group(
        "urls",
        "sessions/urls.py",
        (
            "tests/unit/sessions/test_urls.py",
            "tests/unit/sessions/test_options.py",
            "tests/unit/test_hostile_input.py",
        ),
    ),
    Group(
        "tools",
        "sessions/tools.py",
        ("tests/unit/sessions/test_tools.py", "tests/unit/sessions/test_options.py"),
    ),
    # Round 3's and round 4's security and durability modules (issue 37). The launcher runs in
    # processes of its own (the CLI's and the door's), where no coverage reaches: its guards are
    # mutated by hand (docs/reliability.md), not here.
    Group(
        "sandbox-environment",
        "sandbox/environment.py",
        ("tests/unit/sandbox/test_environment.py", "tests/unit/test_server.py"),
    ),
    Group("sandbox-proxy", "sandbox/proxy.py", ("tests/unit/sandbox/test_proxy.py",)),
    Group("sandbox-commands", "sandbox/commands.py", ("tests/unit/sandbox/test_commands.py",)),
    Group("sandbox-cli", "sandbox/cli.py", ("tests/unit/sandbox/test_cli.py",)),
    Group(
        "access",
        "access.py",
        ("tests/unit/test_access.py", "tests/unit/rpc", "tests/integration/test_auth.py"),
    ),
    Group("webhooks-subscriptions", "webhooks/subscriptions.py", ("tests/unit/webhooks",)),
    Group("webhooks-delivery", "webhooks/delivery.py", ("tests/unit/webhooks/test_delivery.py",)),
    Group(
        "points",
        "sessions/points.py",
        (
            "tests/unit/sessions/test_points_from_the_tail.py",
            "tests/unit/sessions/test_running.py",
            "tests/unit/sessions/test_lifecycle_start.py",
            "tests/unit/sessions/test_lifecycle_stop.py",
        ),
    ),
    Group("checkpoints", "rewind/checkpoints.py", ("tests/unit/rewind",)),
    Group(
        "gitindex",
        "snapshots/gitindex.py",
        ("tests/unit/snapshots/test_gitindex.py", "tests/unit/snapshots/test_seed.py"),
    ),
    Group("seed", "snapshots/seed.py", ("tests/unit/snapshots/test_seed.py",)),
    # The one safe open of a workspace's file (issue 38 wrote it once).
    Group(
        "files",
        "snapshots/files.py",
        ("tests/unit/snapshots/test_files.py", "tests/unit/rewind/test_checkpoints.py"),
    ),
    Group(
        "forking",
        "sessions/forking.py",
        ("tests/unit/sessions/test_forking.py", "tests/integration/test_history.py"),
        select="fork",
    ),
    # Round 4's narrowing and reverting (issue 39): what a path may name, the merge, the plan.
    Group("rewind-paths", "rewind/paths.py", ("tests/unit/rewind/test_paths.py",)),
    Group("merge", "snapshots/merge.py", ("tests/unit/snapshots/test_merge.py",)),
    Group(
        "revert", "rewind/revert.py", ("tests/unit/rewind/test_revert.py", "tests/integration/test_revert.py")
    ),
    Group("rpc-caches", "rpc/caches.py", ("tests/unit/rpc/test_caches.py", "tests/unit/events/test_hub.py")),
    # The servicer's own logic (pages of points, capabilities, the watch) is driven through the
    # real server in the test's process.
    Group(
        "rewind-service",
        "rpc/rewind_service.py",
        ("tests/unit/rpc", "tests/integration/test_auth.py", "tests/integration/test_rewind.py"),
        select="not postgres",
    ),
)

# The most a group's mutants may survive, in percent of those that ran, as its last recorded run
# found it (docs/reliability.md): `make mutants` fails when a group does worse. A group with no
# floor yet is reported, not judged.
FLOORS = ROOT / "scripts" / "mutants-floors.json"


def _run(group: Group, workers: int) -> dict[str, object]:
    shutil.rmtree(REPORT.parent, ignore_errors=True)
    started = time.monotonic()
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        *group.tests,
        *(("-k", group.select) if group.select else ()),
        "--gremlins",
        f"--gremlin-targets=src/agent_rewind/{group.module}",
        "--gremlin-parallel",
        f"--gremlin-workers={workers}",
        "--gremlin-mutant-timeout=120",
        "--gremlin-report=console,json",
    ]
    # The gremlins' subprocesses import the tests' helpers (`tests.*`) from the tree's root, and
    # this tree's sources first (a worktree's, not those the venv was installed from).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(ROOT / "src"), str(ROOT)))}
    with (WORK / f"{group.name}.log").open("w") as log:
        subprocess.run(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    found = json.loads(REPORT.read_text()) if REPORT.exists() else {"summary": {}, "results": []}
    survivors = [
        f"{Path(r['file_path']).relative_to(ROOT)}:{r['line_number']} {r['description']} ({r['operator']})"
        for r in found["results"]
        if r["status"] == "survived"
    ]
    errors = [
        f"{Path(r['file_path']).relative_to(ROOT)}:{r['line_number']} {r['description']}"
        for r in found["results"]
        if r["status"] in ("error", "timeout")
    ]
    return {
        "summary": found["summary"],
        "survivors": survivors,
        "errors": errors,
        "seconds": round(time.monotonic() - started),
    }


def _report(results: dict[str, dict[str, object]]) -> str:
    lines = [
        "# make mutants",
        "",
        "| group | module | mutants | killed | survived | errors | killed of those that ran | seconds |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    total = killed = survived = 0
    for group in GROUPS:
        got = results.get(group.name)
        if got is None:
            continue
        summary = got["summary"]
        assert isinstance(summary, dict)
        n, k = int(summary.get("total", 0)), int(summary.get("zapped", 0))
        s = int(summary.get("survived", 0))
        e = int(summary.get("error", 0)) + int(summary.get("timeout", 0))
        total, killed, survived = total + n, killed + k, survived + s
        ran = k + s
        lines.append(
            f"| {group.name} | `{group.module}` | {n} | {k} | {s} | {e} | "
            f"{100 * k / ran:.1f}% | {got['seconds']} |"
            if ran
            else f"| {group.name} | `{group.module}` | {n} | {k} | {s} | {e} | - | {got['seconds']} |"
        )
    if killed + survived:
        lines += [
            "",
            f"All: {total} mutants, {killed} killed, {survived} survived: "
            f"{100 * survived / (killed + survived):.1f}% of those that ran survived.",
        ]
    for group in GROUPS:
        got = results.get(group.name)
        if not got:
            continue
        for title, key in (
            ("survivors", "survivors"),
            ("errors (the test run failed or timed out)", "errors"),
        ):
            listed = got[key]
            assert isinstance(listed, list)
            if listed:
                lines += ["", f"## {group.name}: {title}", "", *(f"- `{item}`" for item in listed)]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(prog="make mutants", description=__doc__)
    parser.add_argument(
        "--only", action="append", choices=[g.name for g in GROUPS], help="run only this group"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 2,
        help="mutants run at once (default: one per core)",
    )
    args = parser.parse_args()
    WORK.mkdir(exist_ok=True)
    results_file = WORK / "results.json"
    results: dict[str, dict[str, object]] = (
        json.loads(results_file.read_text()) if results_file.exists() else {}
    )
    for group in GROUPS:
        if args.only and group.name not in args.only:
            continue
        print(f"mutants: {group.name} ({group.module})", flush=True)
        results[group.name] = _run(group, args.workers)
        results_file.write_text(json.dumps(results, indent=2))
        print(
            f"mutants: {group.name}: {results[group.name]['summary']} in {results[group.name]['seconds']} s",
            flush=True,
        )
    shutil.rmtree(REPORT.parent.parent, ignore_errors=True)
    report = _report(results)
    (WORK / "report.md").write_text(report)
    print(report)
    worse = _below_floor(results, args.only)
    for line in worse:
        print(f"mutants: {line}", file=sys.stderr)
    return 1 if worse else 0


def _survived(result: dict[str, object]) -> float | None:
    summary = result["summary"]
    assert isinstance(summary, dict)
    killed, survived = int(summary.get("zapped", 0)), int(summary.get("survived", 0))
    return 100 * survived / (killed + survived) if killed + survived else None


def _below_floor(results: dict[str, dict[str, object]], only: list[str] | None) -> list[str]:
    """The groups of this run whose survivors exceed the share recorded for them."""
    floors: dict[str, float] = json.loads(FLOORS.read_text()) if FLOORS.exists() else {}
    worse = []
    for name, result in results.items():
        if (only and name not in only) or name not in floors:
            continue
        share = _survived(result)
        if share is not None and share > floors[name] + 1e-9:
            worse.append(f"{name}: {share:.1f}% survived, more than the {floors[name]:.1f}% recorded")
    return worse


if __name__ == "__main__":
    sys.exit(main())
