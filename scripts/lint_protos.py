"""Lints protos/ with buf (run by `make lint`).

buf comes from npm (@bufbuild/buf, pinned below) and is installed into ./.tools the first
time, or again when the pinned version changes; nothing else is needed than Node.js and npm.
The rules and every exception, each with its reason, are in buf.yaml at the repo root.
Checks: `buf lint` (the STANDARD rules), `buf format` (no diff allowed), and `buf breaking`
against the protos as the last round shipped them (BASELINE below), so what has shipped stays
compatible (the FILE rules; buf.yaml lists the one exemption and why).
"""

from __future__ import annotations

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
    if lint or fmt or breaking:
        return 1
    print(f"lint_protos: buf {BUF_VERSION} lint, format and breaking: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
