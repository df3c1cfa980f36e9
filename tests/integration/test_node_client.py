"""The Node.js client (clients/node) against real servers: its `node --test` suite and its flow example.

Node.js 20+ and npm must be on PATH: without them these tests fail (they do not skip), so `make test`
proves the Node client works. `npm ci` runs only when clients/node/node_modules is missing or was
installed from another package-lock.json (a stamp in node_modules records which).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path

import pytest

from agent_rewind.access import Permission, hash_token
from agent_rewind.testing.server_process import ServerProcess

NODE_DIR = Path(__file__).resolve().parents[2] / "clients" / "node"
TOKENS = {"node": "arw_node-client-secret", "reader": "arw_node-reader-secret"}
PERMISSIONS = {
    "node": [p.value for p in Permission if p is not Permission.ADMIN],
    "reader": [Permission.SESSIONS_READ.value],
}
MIN_NODE = 20


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"`{name}` is not on PATH: the Node client's tests (clients/node) need Node.js {MIN_NODE}+ "
            "and npm; install them (e.g. `apt-get install nodejs npm`) and run again",
            pytrace=False,
        )
    return path


@contextlib.contextmanager
def _install_lock() -> Iterator[None]:
    """One `npm ci` at a time for this checkout, whichever test run starts it."""
    key = hashlib.sha256(str(NODE_DIR).encode()).hexdigest()[:12]
    with open(Path(tempfile.gettempdir()) / f"agent-rewind-npm-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="module")
def node() -> str:
    """The node binary, with clients/node's dependencies installed as package-lock.json pins them."""
    node, npm = _tool("node"), _tool("npm")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    match = re.match(r"v(\d+)\.", version)
    if not match or int(match.group(1)) < MIN_NODE:
        pytest.fail(f"node {version} is too old: the Node client needs Node.js {MIN_NODE}+", pytrace=False)
    lock_digest = hashlib.sha256((NODE_DIR / "package-lock.json").read_bytes()).hexdigest()[:16]
    stamp = NODE_DIR / "node_modules" / f".agent-rewind-lock-{lock_digest}"
    with _install_lock():
        if not stamp.exists():
            # npm ci starts from an empty node_modules, so an old stamp goes with it.
            done = subprocess.run(
                [npm, "ci", "--no-audit", "--no-fund"],
                cwd=NODE_DIR,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            if done.returncode != 0:
                pytest.fail(
                    f"`npm ci` in {NODE_DIR} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}",
                    pytrace=False,
                )
            stamp.touch()
    return node


def _access_file(path: Path) -> Path:
    principals = [
        {"name": name, "permissions": PERMISSIONS[name], "token_sha256": [hash_token(token)]}
        for name, token in TOKENS.items()
    ]
    path.write_text(json.dumps({"principals": principals}))
    return path


@pytest.fixture(scope="module")
async def servers(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, ServerProcess]]:
    """An open server, one with an access file, one whose cursors expire within a second or two."""
    root = tmp_path_factory.mktemp("node-client")
    processes = {
        "open": ServerProcess(root / "open"),
        "auth": ServerProcess(root / "auth", args=["--access-file", str(_access_file(root / "access.json"))]),
        # Keeps only the newest event, trimmed every second (a tenth of --event-retention).
        "short": ServerProcess(
            root / "short", args=["--event-retention-count", "1", "--event-retention", "10"]
        ),
    }
    try:
        await asyncio.gather(*(p.start() for p in processes.values()))
        yield processes
    finally:
        await asyncio.gather(*(p.close() for p in processes.values()))


def _environment(servers: Mapping[str, ServerProcess]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_REWIND_")}
    env.update(
        AGENT_REWIND_SERVER=servers["open"].address,
        AGENT_REWIND_AUTH_SERVER=servers["auth"].address,
        AGENT_REWIND_AUTH_TOKEN=TOKENS["node"],
        AGENT_REWIND_READER_TOKEN=TOKENS["reader"],
        AGENT_REWIND_SHORT_RETENTION_SERVER=servers["short"].address,
        NO_COLOR="1",
    )
    return env


async def _run(command: list[str], env: Mapping[str, str], servers: Mapping[str, ServerProcess]) -> str:
    """Runs a node command in clients/node; its output, or a failure that shows it."""
    proc = await asyncio.create_subprocess_exec(
        *command,
        cwd=NODE_DIR,
        env=dict(env),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 120)
    except TimeoutError:
        proc.kill()
        out, _ = await proc.communicate()
        pytest.fail(f"`{' '.join(command)}` took over 120 s:\n{out.decode()}", pytrace=False)
    output = out.decode()
    if proc.returncode != 0:
        logs = ", ".join(str(p.log_path) for p in servers.values())
        pytest.fail(
            f"`{' '.join(command)}` exited with {proc.returncode}:\n{output}\n(server logs: {logs})",
            pytrace=False,
        )
    return output


async def test_the_node_test_suite_passes(node: str, servers: dict[str, ServerProcess]) -> None:
    output = await _run([node, "--test", "--test-reporter=spec", "test/"], _environment(servers), servers)
    summary = dict(
        re.findall(
            r"^\N{INFORMATION SOURCE} (tests|pass|fail|skipped|cancelled) (\d+)$", output, re.MULTILINE
        )
    )
    assert summary.get("fail") == "0" and summary.get("cancelled") == "0", output
    assert summary.get("skipped") == "0", f"every server was given, nothing may skip:\n{output}"
    assert int(summary.get("pass", "0")) >= 22, output


async def test_the_flow_example_runs(node: str, servers: dict[str, ServerProcess]) -> None:
    output = await _run([node, "examples/flow.mjs"], _environment(servers), servers)
    assert re.search(r"^event REWIND_EVENT_KIND_REWOUND cursor=\d+ ", output, re.MULTILINE), output
    assert output.rstrip().endswith("flow done"), output


# Lifecycle scripts npm runs when it installs a package (prepare: for one installed from a folder).
INSTALL_SCRIPTS = ("preinstall", "install", "postinstall", "prepare")


def _packed(npm: str, destination: Path) -> tuple[Path, list[str]]:
    """`npm pack` of clients/node: the tarball and the paths it holds."""
    done = subprocess.run(
        [npm, "pack", "--json", "--pack-destination", str(destination)],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [packed] = json.loads(done.stdout)
    return destination / packed["filename"], [f["path"] for f in packed["files"]]


def _script_warnings(output: str) -> list[str]:
    """The lines of npm's output about install scripts (npm 11: `npm warn install-scripts ...`,
    naming the packages whose scripts no `allowScripts` entry covers)."""
    return [line for line in output.splitlines() if re.search(r"install.?scripts?|allowScripts", line, re.I)]


def _locked_packages() -> set[str]:
    """The node_modules paths package-lock.json pins: the dependencies and theirs."""
    lock = json.loads((NODE_DIR / "package-lock.json").read_text())
    return {path for path in lock["packages"] if path}


@pytest.mark.parametrize("source", ["tarball", "folder"])
async def test_another_project_installs_the_client_with_no_script_and_calls_the_server(
    node: str, servers: dict[str, ServerProcess], tmp_path: Path, source: str
) -> None:
    """`npm install` of `npm pack`'s tarball, and `npm install --install-links /path/to/clients/node`
    (clients/node/README.md): the package carries its protos and its dependencies (bundled, so
    npm 11 names no dependency's install script either), has no install script of its own, and
    works from the other project's folder."""
    npm = _tool("npm")
    protos = sorted(
        f"protos/{p.relative_to(NODE_DIR / 'protos')}" for p in (NODE_DIR / "protos").rglob("*.proto")
    )
    assert protos, "clients/node/protos is empty; run `make proto`"
    if source == "tarball":
        tarball, paths = await asyncio.to_thread(_packed, npm, tmp_path)
        assert set(protos) <= set(paths), paths
        assert "src/index.js" in paths, paths
        assert {path.split("/")[0] for path in paths} <= {
            "package.json",
            "README.md",
            "src",
            "protos",
            "node_modules",
        }, paths
        # Every package the lock pins is in the tarball, and nothing else under node_modules.
        locked = _locked_packages()
        assert {f"{package}/package.json" for package in locked} <= set(paths), paths
        stray = [
            path
            for path in paths
            if path.startswith("node_modules/") and not any(path.startswith(f"{p}/") for p in locked)
        ]
        assert not stray, stray
        with tarfile.open(tarball) as packed:
            manifest = json.load(packed.extractfile("package/package.json"))  # type: ignore[arg-type]
        assert not set(manifest.get("scripts", {})) & set(INSTALL_SCRIPTS), manifest
        spec = str(tarball)
    else:
        spec = str(NODE_DIR)
    project = tmp_path / "other-project"
    project.mkdir()
    (project / "package.json").write_text(json.dumps({"name": "other", "private": True, "type": "module"}))
    done = await asyncio.to_thread(
        subprocess.run,
        [npm, "install", "--install-links", "--no-audit", "--no-fund", spec],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # npm 11 names here every package whose install script no allowScripts entry covers, and
    # protobufjs 7 (which @grpc/proto-loader needs) has one; bundled packages it leaves out.
    # The checks of what the package holds and where npm put it below hold with any npm.
    assert not _script_warnings(done.stdout + done.stderr), done.stdout + done.stderr
    installed = project / "node_modules" / "@agent-rewind" / "client"
    assert not installed.is_symlink(), "installed, not linked to the checkout"
    manifest = json.loads((installed / "package.json").read_text())
    assert not set(manifest.get("scripts", {})) & set(INSTALL_SCRIPTS), manifest
    # The dependencies came inside the client, not into the other project's tree.
    assert [p.name for p in (project / "node_modules").iterdir() if not p.name.startswith(".")] == [
        "@agent-rewind"
    ]
    for dependency in manifest["dependencies"]:
        assert (installed / "node_modules" / dependency / "package.json").is_file(), dependency
    assert (
        sorted(
            f"protos/{p.relative_to(installed / 'protos')}" for p in (installed / "protos").rglob("*.proto")
        )
        == protos
    )
    (project / "main.mjs").write_text(
        "import { connect, PROTO_DIR } from '@agent-rewind/client';\n"
        "const client = connect(process.env.AGENT_REWIND_SERVER);\n"
        "const caps = await client.getCapabilities();\n"
        "console.log(JSON.stringify({ protos: PROTO_DIR, backend: caps.model_backend }));\n"
        "client.close();\n"
    )
    ran = await asyncio.to_thread(
        subprocess.run,
        [node, "main.mjs"],
        cwd=project,
        env=_environment(servers),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    said = json.loads(ran.stdout.strip().splitlines()[-1])
    assert said == {"protos": f"{installed}/protos/", "backend": "offline"}
