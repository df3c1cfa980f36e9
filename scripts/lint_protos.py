"""Lints protos/ with buf (run by `make lint`).

buf comes from npm (@bufbuild/buf, pinned below) and is installed into ./.tools the first
time, or again when the pinned version changes; nothing else is needed than Node.js and npm.
The rules and every exception, each with its reason, are in buf.yaml at the repo root.
Checks: `buf lint` (the STANDARD rules), `buf format` (no diff allowed), and `buf breaking`
against the protos as the last round shipped them (BASELINE below), so what has shipped stays
compatible (the FILE rules; buf.yaml lists the exemptions and why). Before buf, every .proto must
carry the file options other languages' generators read (FILE_OPTIONS below), with these values.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

BUF_VERSION = "1.75.0"
# The commit whose protos the last round shipped: the contract clients were built against.
BASELINE = "daee753b414b4565f812add25306611ee162c254"
ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / ".tools"
BUF = TOOLS / "node_modules" / ".bin" / "buf"
PROTOS = ROOT / "protos"

# The file options every .proto carries, so Go, Java, C#, PHP, Ruby and Objective-C users generate
# from the files as they are (docs/generating-clients.md). Values are pinned: changing one moves
# every generated type in that language, and `buf breaking` skips these options until BASELINE
# includes them (buf.yaml says why).
FILE_OPTIONS: dict[str, str | bool] = {
    "csharp_namespace": "AgentRewind.V1",
    "go_package": "github.com/agent-rewind/agent-rewind/gen/go/agent_rewind/v1;agentrewindv1",
    "java_multiple_files": True,
    "java_package": "io.github.agentrewind.v1",
    "objc_class_prefix": "ARW",
    "php_namespace": "AgentRewind\\V1",
    "ruby_package": "AgentRewind::V1",
}
# A top-level option as `buf format` writes it: at the start of a line; its value a string literal
# (which may hold a `;`) or a bare word.
_OPTION = re.compile(r'^option\s+(\w+)\s*=\s*("(?:[^"\\]|\\.)*"|[\w.+-]+)\s*;', re.MULTILINE)


def _literal(value: str | bool) -> str:
    """A value as a .proto writes it: `true`, or a string in double quotes with `\\` escaped."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def expected_options(proto: Path) -> dict[str, str]:
    """The options `proto` must carry, as .proto literals. java_outer_classname follows the file
    name (session_service.proto: SessionServiceProto), as buf's managed mode would name it."""
    outer = "".join(part.capitalize() for part in proto.stem.split("_")) + "Proto"
    wanted = {name: _literal(value) for name, value in FILE_OPTIONS.items()}
    wanted["java_outer_classname"] = _literal(outer)
    return dict(sorted(wanted.items()))


def file_option_problems(protos: Path) -> list[str]:
    """One line per option missing from a .proto under `protos`, or set to another value."""
    problems = []
    for proto in sorted(protos.rglob("*.proto")):
        found = dict(_OPTION.findall(proto.read_text()))
        name = proto.relative_to(protos.parent)
        for option, want in expected_options(proto).items():
            if option not in found:
                problems.append(f"{name}: option {option} is missing (want `option {option} = {want};`)")
            elif found[option] != want:
                problems.append(f"{name}: option {option} is {found[option]}, want {want}")
    return problems


def _installed_version() -> str | None:
    if not BUF.exists():
        return None
    done = subprocess.run([str(BUF), "--version"], capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else None


def ensure_buf() -> Path:
    """The path of the pinned buf, installing it into ./.tools when missing or outdated."""
    if _installed_version() == BUF_VERSION:
        return BUF
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit("lint_protos: npm not found; install Node.js (>= 18) so buf can be installed")
    print(f"lint_protos: installing @bufbuild/buf@{BUF_VERSION} into {TOOLS.relative_to(ROOT)}/", flush=True)
    TOOLS.mkdir(exist_ok=True)
    # --ignore-scripts: the package's postinstall only swaps its node launcher for the native
    # binary, and newer npm versions skip it anyway; the launcher works either way.
    subprocess.run(
        [
            npm,
            "install",
            "--prefix",
            str(TOOLS),
            "--save-exact",
            "--ignore-scripts",
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
            f"@bufbuild/buf@{BUF_VERSION}",
        ],
        check=True,
    )
    found = _installed_version()
    if found != BUF_VERSION:
        raise SystemExit(f"lint_protos: expected buf {BUF_VERSION} in {BUF}, found {found}")
    return BUF


def main() -> int:
    options = file_option_problems(PROTOS)
    for problem in options:
        print(f"lint_protos: {problem}", file=sys.stderr)
    buf = str(ensure_buf())
    lint = subprocess.run([buf, "lint"], cwd=ROOT, check=False).returncode
    if lint != 0:
        print("lint_protos: buf lint failed (rules and exceptions: buf.yaml)", file=sys.stderr)
    fmt = subprocess.run([buf, "format", "--diff", "--exit-code"], cwd=ROOT, check=False).returncode
    if fmt != 0:
        print(
            "lint_protos: buf format failed; `.tools/node_modules/.bin/buf format -w` fixes it",
            file=sys.stderr,
        )
    breaking = 0
    if (ROOT / ".git").exists():
        breaking = subprocess.run(
            [buf, "breaking", "--against", f".git#ref={BASELINE}"], cwd=ROOT, check=False
        ).returncode
        if breaking != 0:
            print(f"lint_protos: buf breaking against {BASELINE[:12]} failed", file=sys.stderr)
    else:
        print("lint_protos: no .git here; buf breaking skipped", file=sys.stderr)
    if options or lint or fmt or breaking:
        return 1
    print(f"lint_protos: file options; buf {BUF_VERSION} lint, format and breaking: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
