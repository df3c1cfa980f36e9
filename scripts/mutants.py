"""`make mutants`: mutation testing (mutmut) of the modules where a silent bug costs most.

Each group below mutates one module (or the named functions of one) and runs, for each mutant,
only the tests of the group that execute the mutated function (mutmut's own per-function test
selection, from a first run that records which test calls what). The tests are chosen per module
so the whole run fits in an hour on two cores: the unit tests of the module and the fast
integration tests that drive it through the real server in this process (a server in a process
of its own runs unmutated code, so those tests are left out).

Each group runs in a scratch copy of the tree (`.mutants/<group>/`, not committed), so groups do
not share state and the working tree is never changed. The report (`.mutants/report.md`, printed
at the end) has the score per module and the diff of every surviving mutant; docs/reliability.md
records the last run and explains each survivor that is equivalent (a change no behaviour can
show). `python scripts/mutants.py --only NAME` runs one group.
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
MUTMUT = Path(sys.executable).parent / "mutmut"


@dataclass(frozen=True)
class Group:
    name: str
    module: str  # under src/agent_rewind/
    tests: tuple[str, ...]
    # Globs over mutmut's mutant names (module.x_function__mutmut_N, module.xǁClassǁmethod__...):
    # only these functions are mutated. Empty: the whole module.
    only: tuple[str, ...] = ()


GROUPS = (
    Group(
        "auth",
        "rpc/auth.py",
        ("tests/unit/rpc", "tests/integration/test_auth.py"),
    ),
    Group("forwarding", "rpc/forwarding.py", ("tests/unit/rpc/test_forwarding.py",)),
    Group(
        "handlers",
        "rpc/handlers.py",
        ("tests/unit/rpc", "tests/integration/test_auth.py", "tests/integration/test_fuzz.py"),
    ),
    Group("engine", "rewind/engine.py", ("tests/unit/rewind", "tests/unit/sessions/test_worker.py")),
    Group("undo", "rewind/undo.py", ("tests/unit/rewind", "tests/integration/test_history.py")),
    Group(
        "worker-cut-and-request-ids",
        "sessions/worker.py",
        ("tests/unit/sessions/test_worker.py",),
        only=(
            "*xǁSessionWorkerǁview__*",
            "*xǁSessionWorkerǁ_cut_is_in_transcript__*",
            "*xǁSessionWorkerǁcut_conversation__*",
            "*xǁSessionWorkerǁ_known_turn__*",
            "*xǁSessionWorkerǁstart_turn__*",
        ),
    ),
    Group(
        "store-fencing-postgres",
        "store/postgres.py",
        ("tests/unit/store",),
        only=(
            "*xǁPostgresLedgerǁ_write__*",
            "*xǁPostgresLedgerǁregister_replica__*",
            "*xǁPostgresLedgerǁrenew_replica__*",
            "*xǁPostgresLedgerǁretire_replica__*",
            "*xǁPostgresLedgerǁtake_over__*",
            "*xǁPostgresLedgerǁfence__*",
        ),
    ),
    Group(
        "store-fencing-sqlite",
        "store/sqlite.py",
        ("tests/unit/store",),
        only=(
            "*xǁSqliteLedgerǁ_write__*",
            "*xǁSqliteLedgerǁregister_replica__*",
            "*xǁSqliteLedgerǁrenew_replica__*",
            "*xǁSqliteLedgerǁretire_replica__*",
            "*xǁSqliteLedgerǁtake_over__*",
            "*xǁSqliteLedgerǁfence__*",
        ),
    ),
    Group("replicas", "replicas.py", ("tests/unit/test_replicas.py", "tests/unit/store")),
    Group("policy", "sessions/policy.py", ("tests/unit/sessions/test_policy.py",)),
    Group(
        "options",
        "sessions/options.py",
        ("tests/unit/sessions/test_options.py", "tests/unit/test_hostile_input.py"),
    ),
)


def _copy_tree(target: Path) -> None:
    """The committed tree and the generated code, as they are now (uncommitted changes included)."""
    if target.exists():
        shutil.rmtree(target)
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, files):
        source = ROOT / name.decode()
        if source.is_file():
            dest = target / name.decode()
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest)


def _configure(target: Path, group: Group) -> None:
    pyproject = target / "pyproject.toml"
    tests = ", ".join(json.dumps(t) for t in group.tests)
    pyproject.write_text(
        pyproject.read_text()
        + "\n[tool.mutmut]\n"
        + 'source_paths = ["src/"]\n'
        + f'only_mutate = ["src/agent_rewind/{group.module}"]\n'
        + f"pytest_add_cli_args_test_selection = [{tests}]\n"
        + 'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q", "-x"]\n'
        # grpc and asyncio are not fork-safe: every mutant's process comes from a clean server.
        + 'process_isolation = "forkserver"\n'
    )


def _run(group: Group) -> dict[str, object]:
    target = WORK / group.name
    _copy_tree(target)
    _configure(target, group)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    started = time.monotonic()
    log = (WORK / f"{group.name}.log").open("w")
    subprocess.run([str(MUTMUT), "run", *group.only], cwd=target, env=env, stdout=log, stderr=subprocess.STDOUT)
    subprocess.run([str(MUTMUT), "export-cicd-stats"], cwd=target, env=env, capture_output=True)
    stats_file = target / "mutants" / "mutmut-cicd-stats.json"
    stats = json.loads(stats_file.read_text()) if stats_file.exists() else {}
    listed = subprocess.run(
        [str(MUTMUT), "results"], cwd=target, env=env, capture_output=True, text=True
    ).stdout.splitlines()
    survivors = [line.strip().rsplit(":", 1)[0] for line in listed if line.strip().endswith(": survived")]
    diffs = {}
    for name in survivors:
        shown = subprocess.run(
            [str(MUTMUT), "show", name], cwd=target, env=env, capture_output=True, text=True
        ).stdout
        diffs[name] = "\n".join(line for line in shown.splitlines() if line[:2] in ("- ", "+ ", "@@"))
    return {"stats": stats, "survivors": diffs, "seconds": round(time.monotonic() - started)}


def _report(results: dict[str, dict[str, object]]) -> str:
    lines = [
        "# make mutants",
        "",
        "| group | module | mutants | killed | survived | timeout | no tests | score | seconds |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    total = killed = survived = 0
    for group in GROUPS:
        got = results.get(group.name)
        if got is None:
            continue
        stats = got["stats"]
        assert isinstance(stats, dict)
        n = int(stats.get("total", 0)) - int(stats.get("skipped", 0))
        k = int(stats.get("killed", 0)) + int(stats.get("timeout", 0))
        s = int(stats.get("survived", 0))
        total, killed, survived = total + n, killed + k, survived + s
        score = f"{100 * k / n:.1f}%" if n else "-"
        lines.append(
            f"| {group.name} | `{group.module}` | {n} | {stats.get('killed', 0)} | {s} | "
            f"{stats.get('timeout', 0)} | {stats.get('no_tests', 0)} | {score} | {got['seconds']} |"
        )
    if total:
        lines += ["", f"All: {total} mutants, {killed} killed, {survived} survived ({100 * survived / total:.1f}%)."]
    for group in GROUPS:
        got = results.get(group.name)
        survivors = got["survivors"] if got else {}
        assert isinstance(survivors, dict)
        if survivors:
            lines += ["", f"## {group.name}: survivors", ""]
            for name, diff in survivors.items():
                lines += [f"- `{name}`", "", "```diff", diff, "```", ""]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(prog="make mutants", description=__doc__)
    parser.add_argument("--only", action="append", choices=[g.name for g in GROUPS], help="run only this group")
    args = parser.parse_args()
    WORK.mkdir(exist_ok=True)
    results_file = WORK / "results.json"
    results: dict[str, dict[str, object]] = json.loads(results_file.read_text()) if results_file.exists() else {}
    for group in GROUPS:
        if args.only and group.name not in args.only:
            continue
        print(f"mutants: {group.name} ({group.module})", flush=True)
        results[group.name] = _run(group)
        results_file.write_text(json.dumps(results, indent=2))
        stats = results[group.name]["stats"]
        print(f"mutants: {group.name}: {stats} in {results[group.name]['seconds']} s", flush=True)
    report = _report(results)
    (WORK / "report.md").write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
