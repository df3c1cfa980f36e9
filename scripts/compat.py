"""`make compat`: the integration suite against the newest claude-agent-sdk (and the Claude Code
CLI inside it) in a venv of its own, and what differs from the pinned version.

The SDK and its bundled CLI ship every few days, and the service leans on them closely (the
transcript format, control requests, the tools the CLI offers). This builds `.compat/venv-VERSION`
from the locked dev set with the SDK swapped for VERSION (the newest on the index unless
`--version` names one), runs the integration suite and the SDK-facing unit tests there, runs every
test that failed again on the pinned venv, and writes `.compat/report-VERSION.md`: the versions,
the tests that fail only on VERSION (what moving the pin would break), and those failing on both.
Tests marked `version_bound` assert the pinned version itself; they are left out (their marker
says what they depend on). docs/operations.md ("Upgrading the SDK") says how to move the pin.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".compat"
PACKAGE = "claude-agent-sdk"
SUITE = ("tests/integration", "tests/unit/sessions", "tests/unit/transcript")


def pinned() -> str:
    found = re.search(rf'"{PACKAGE}==([^"]+)"', (ROOT / "pyproject.toml").read_text())
    assert found, f"pyproject.toml pins no {PACKAGE}"
    return found.group(1)


def newest() -> str:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", PACKAGE, "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        check=True,
    )
    found = re.search(rf"^{PACKAGE} \(([^)]+)\)", done.stdout, re.MULTILINE)
    assert found, done.stdout
    return found.group(1)


def _without(lock: Path, package: str, out: Path) -> None:
    """The lock file without `package`'s entry (its pin and hashes)."""
    blocks = re.split(r"\n(?=[A-Za-z0-9])", lock.read_text())
    kept = [b for b in blocks if not re.match(rf"{re.escape(package)}==", b, re.IGNORECASE)]
    out.write_text("\n".join(kept))


def venv(version: str) -> Path:
    """A venv with the locked dev set and `version` of the SDK (made once per version)."""
    where = WORK / f"venv-{version}"
    python = where / "bin" / "python"
    stamp = where / ".installed"
    if stamp.exists():
        return python
    print(f"compat: making {where.relative_to(ROOT)} with {PACKAGE}=={version}", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(where)], check=True)
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off", "-q"]
    rest = WORK / "dev-without-sdk.txt"
    _without(ROOT / "requirements" / "dev.txt", PACKAGE, rest)
    subprocess.run([*pip, "--require-hashes", "-r", str(rest)], check=True)
    subprocess.run([*pip, f"{PACKAGE}=={version}"], check=True)
    subprocess.run([*pip, "--no-deps", "-e", str(ROOT)], check=True)
    stamp.touch()
    return python


def run_tests(python: Path, tests: list[str], junit: Path, extra: list[str]) -> dict[str, str]:
    """Runs `tests`; test id -> "passed", "failed" or "skipped"."""
    subprocess.run(
        [
            str(python),
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-m",
            "not version_bound",
            f"--junitxml={junit}",
            *extra,
            *tests,
        ],
        cwd=ROOT,
        check=False,
    )
    outcomes: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        kinds = {child.tag for child in case}
        outcomes[name] = (
            "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
        )
    return outcomes


def versions(python: Path) -> dict[str, str]:
    probe = (
        "import json; from agent_rewind.sessions import adapter; "
        "print(json.dumps({'sdk': adapter.sdk_version(), 'cli': adapter.cli_version()}))"
    )
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    found: dict[str, str] = json.loads(done.stdout)
    return found


def _node_id(name: str) -> str:
    """`tests/integration/test_x.py::test_y[param]` from a junit name (classname dotted)."""
    path, _, test = name.partition(".py::")
    return f"{path}.py::{test}"


def main() -> int:
    parser = argparse.ArgumentParser(prog="make compat", description=__doc__)
    parser.add_argument("--version", help=f"the {PACKAGE} version to try (default: the newest)")
    parser.add_argument("pytest_args", nargs="*", help="passed on to pytest (say, -k rewind)")
    args = parser.parse_args()
    WORK.mkdir(exist_ok=True)
    target, pin = args.version or newest(), pinned()
    started = time.monotonic()
    python = venv(target)
    found = versions(python)
    print(f"compat: {PACKAGE} {found['sdk']} (CLI {found['cli']}) against the pin {pin}", flush=True)
    outcomes = run_tests(python, list(SUITE), WORK / f"junit-{target}.xml", args.pytest_args)
    failed = sorted(name for name, outcome in outcomes.items() if outcome == "failed")
    both: list[str] = []
    if failed:
        print(f"compat: {len(failed)} failed on {target}; running them on the pin {pin}", flush=True)
        again = run_tests(
            ROOT / ".venv" / "bin" / "python", [_node_id(n) for n in failed], WORK / f"junit-{pin}.xml", []
        )
        both = sorted(n for n in failed if again.get(n) == "failed")
    only = [n for n in failed if n not in both]
    passed = sum(1 for outcome in outcomes.values() if outcome == "passed")
    pinned_cli = versions(ROOT / ".venv" / "bin" / "python")["cli"]
    lines = [
        f"# make compat: {PACKAGE} {target}",
        "",
        f"- tried: {PACKAGE} {found['sdk']}, Claude Code CLI {found['cli']}",
        f"- pinned: {PACKAGE} {pin}, Claude Code CLI {pinned_cli}",
        f"- {len(outcomes)} tests ({', '.join(SUITE)}; `version_bound` ones left out): {passed} passed, "
        f"{len(failed)} failed, in {time.monotonic() - started:.0f} s",
        "",
        f"## Failing on {target} only ({len(only)}): what moving the pin would break",
        "",
        *(f"- `{n}`" for n in only),
        "",
        f"## Failing on both ({len(both)}): not the new version's doing",
        "",
        *(f"- `{n}`" for n in both),
        "",
    ]
    report = WORK / f"report-{target}.md"
    report.write_text("\n".join(lines))
    print("\n".join(lines))
    print(f"compat: written to {report.relative_to(ROOT)}")
    return 1 if only else 0


if __name__ == "__main__":
    sys.exit(main())
