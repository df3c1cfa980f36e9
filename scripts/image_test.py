"""`make image-test`: builds the image from the Dockerfile as it is, measures it, and runs it as
deploy/README.md ("Run the image by hand") says, with the pod's settings.

No Docker engine is needed: buildah builds, podman runs (both from Debian's packages, installed
here as root when missing). Both work on a container store of this test's own (--store; the vfs
driver), so neither a store made by a plain `podman images` with another driver nor anything else
in the machine's own store can get in its way. Where no registry image can be pulled, the
Dockerfile's base (`debian:bookworm-slim`) is made from Debian packages with debootstrap, slimmed
as the registry's is, with this machine's CA bundle in it so that pip works inside the build, and
kept in the test's store for the next run.

The image's size (the sum of its layers: what `podman images` shows for it freshly built) and its
layers are printed, and the image must be at most --max-size MB, with no pip, compiler, Node.js,
apt lists or packaged test suites in it. The container then runs by the documented recipe: uid
10001 (which must read the mounted secrets, so they are owned by the host uid it maps to, mode
0600), a read-only root, every capability dropped, no-new-privileges, a tmpfs /tmp, the seccomp
profile of deploy/seccomp/, a user namespace of its own with an unmasked /proc, the state dir on a
volume, the access file and the TLS files mounted read-only, the port published, and the image's
own entrypoint (TLS and a token required) with the offline model. Then, over TLS with a bearer token: capabilities (snapshots and the sandbox on), a
prompt, a Bash edit, a files rewind served from a workspace snapshot, an undo, the events, and a
SIGTERM that stops the server within its grace. Last, a key the image's user cannot read must stop
the server with a start error naming the flag, its variable and the uid. Exit status 0 when all
of it holds, 1 with a one-line reason when not.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import hashlib
import json
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

IMAGE = "localhost/agent-rewind:image-test"
BASE = "docker.io/library/debian:bookworm-slim"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEFAULT_STORE = Path("/var/lib/agent-rewind-image-test")
# Run state on tmpfs, as podman's own is: a reboot must clear it.
RUN_STATE = Path("/run/agent-rewind-image-test")
RUNTIME = ["--runtime", "runc"]  # crun cannot set rlimits here (MACHINE-FACTS.md)
MAX_SIZE_MB = 750
GRACE = 10  # --shutdown-grace inside the container
UID = 10001  # the image's user
# The recipe's user namespace: the container's uids 0..65535 are the host's 100000..165535, so the
# image's user is the host's uid 110001, which must be able to read the mounted secrets.
USERNS_BASE = 100000
SITE_PACKAGES = "opt/venv/lib/python3.11/site-packages"
BUNDLED_CLI = f"{SITE_PACKAGES}/claude_agent_sdk/_bundled/claude"

# As the registry's debian:*-slim images are made (debuerreotype's slimify): no documentation or
# translations, and apt keeps no downloaded package or cache.
DPKG_SLIM = """\
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/man/*
"""
APT_CLEAN = """\
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
Acquire::Languages "none";
"""


class Failed(Exception):
    """A step failed; the message says which and why, in a line or a few."""


def say(text: str) -> None:
    print(f"image-test: {text}", flush=True)


def run(
    *args: str, check: bool = True, capture: bool = False, **kw: object
) -> subprocess.CompletedProcess[str]:
    """Runs a command; a failure is a Failed naming it and its last words, not a traceback."""
    try:
        return subprocess.run(list(args), check=check, text=True, capture_output=capture, **kw)  # type: ignore[call-overload,no-any-return]
    except FileNotFoundError:
        raise Failed(f"{args[0]} is not installed") from None
    except subprocess.CalledProcessError as err:
        said = ((err.stderr or "").strip() or (err.stdout or "").strip()).splitlines()[-6:]
        detail = "".join(f"\n  {line}" for line in said) if said else " (its output is above)"
        raise Failed(f"`{shlex.join(args)}` exited with status {err.returncode}:{detail}") from None


class Store:
    """podman and buildah on the test's own container store: its own storage.conf (the vfs driver,
    its own graph root), its own run root and libpod state, whatever the machine's are."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf = root / "storage.conf"
        # A run root and libpod state of this store's own: two stores never share them.
        self.run_state = RUN_STATE / hashlib.sha256(str(root).encode()).hexdigest()[:12]
        self.flags = [
            "--root",
            str(root / "storage"),
            "--runroot",
            str(self.run_state / "storage"),
            "--storage-driver",
            "vfs",
        ]

    def prepare(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.conf.write_text(
            "# The image test's own store (scripts/image_test.py); not the machine's.\n"
            "[storage]\n"
            'driver = "vfs"\n'
            f'graphroot = "{self.root / "storage"}"\n'
            f'runroot = "{self.run_state / "storage"}"\n'
        )

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "CONTAINERS_STORAGE_CONF": str(self.conf)}

    def podman(self, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
        libpod = ["--tmpdir", str(self.run_state / "libpod")]
        try:
            return run("podman", *self.flags, *libpod, *args, env=self.env, **kw)
        except Failed as err:
            if "database configuration mismatch" not in str(err):
                raise
            raise Failed(
                f"{err}\n  The store {self.root} was set up with other settings: remove that "
                "directory (it is only a cache), or pass --store with another"
            ) from None

    def buildah(self, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
        return run("buildah", *self.flags, *args, env=self.env, **kw)

    def have_image(self, name: str) -> bool:
        return self.podman("image", "exists", name, check=False).returncode == 0


def ensure_tools() -> None:
    missing = [cmd for cmd in ("buildah", "podman", "runc", "debootstrap") if not shutil.which(cmd)]
    if not missing:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise Failed(f"install {' '.join(missing)} (Debian: apt-get install {' '.join(missing)})")
    say(f"installing {' '.join(missing)} from Debian packages")
    run("apt-get", "update", "-qq")
    run(
        "apt-get",
        "install",
        "-y",
        "-qq",
        "--no-install-recommends",
        *missing,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )


def ensure_base(store: Store) -> None:
    """The Dockerfile's FROM, pulled if a registry answers, else made from Debian packages."""
    if store.have_image(BASE):
        return
    if store.podman("pull", "-q", BASE, check=False, capture=True).returncode == 0:
        return
    say(f"no registry answers: making {BASE} from Debian bookworm packages (a minute or two)")
    with tempfile.TemporaryDirectory(prefix="agent-rewind-base-", dir="/var/tmp") as scratch:
        rootfs = Path(scratch) / "rootfs"
        run("debootstrap", "--variant=minbase", "bookworm", str(rootfs), DEBIAN_MIRROR, capture=True)
        _slim(rootfs)
        bundle = Path("/etc/ssl/certs/ca-certificates.crt")
        if bundle.exists():  # a proxy's CA, say: pip inside the build must trust what this host trusts
            (rootfs / "usr/local/share/ca-certificates").mkdir(parents=True, exist_ok=True)
            shutil.copy(bundle, rootfs / "usr/local/share/ca-certificates/host-bundle.crt")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        store.podman("import", "--change", 'CMD ["bash"]', "-", BASE, stdin=tar.stdout, capture=True)
        tar.wait()


def _slim(rootfs: Path) -> None:
    """What makes the registry's debian:bookworm-slim slim: dpkg leaves documentation and
    translations out (of what is installed later too), apt keeps no package or cache."""
    (rootfs / "etc/dpkg/dpkg.cfg.d/slim").write_text(DPKG_SLIM)
    (rootfs / "etc/apt/apt.conf.d/docker-clean").write_text(APT_CLEAN)
    share = rootfs / "usr/share"
    for name in ("groff", "info", "linda", "lintian", "locale", "man"):
        for entry in (share / name).glob("*"):
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    for package in (share / "doc").glob("*"):
        if package.is_dir() and not package.is_symlink():
            for entry in package.iterdir():
                if entry.name != "copyright":
                    shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        else:
            package.unlink()
    for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for entry in (rootfs / leftover).glob("*"):
            if entry.is_file():
                entry.unlink()
    for cache in (rootfs / "var/cache/apt").glob("*.bin"):
        cache.unlink()
    for log in (rootfs / "var/log").rglob("*"):
        if log.is_file():
            log.unlink()


def build(store: Store) -> None:
    """Builds IMAGE; the image it replaces goes (the vfs driver keeps a full copy of each layer,
    so every rebuilt image left behind would hold a gigabyte or more)."""
    before = _image_id(store)
    say("building the image from the Dockerfile (minutes the first time)")
    started = time.monotonic()
    store.buildah(
        "bud",
        "--isolation",
        "chroot",
        "--pull=never",
        "--layers",
        "-t",
        IMAGE,
        "-f",
        str(ROOT / "Dockerfile"),
        str(ROOT),
    )
    say(f"built in {time.monotonic() - started:.0f} s")
    if before is not None and before != _image_id(store):
        store.podman("rmi", before, check=False, capture=True)


def _image_id(store: Store) -> str | None:
    found = store.podman("image", "inspect", "--format", "{{.Id}}", IMAGE, check=False, capture=True)
    return found.stdout.strip() if found.returncode == 0 else None


def _mb(size: int) -> str:
    return f"{size / 1e6:.0f} MB" if size >= 1e6 else f"{size / 1e3:.0f} kB"  # decimal, as podman counts


def _tree_bytes(top: Path) -> int:
    return sum(p.lstat().st_size for p in top.rglob("*") if p.is_file() and not p.is_symlink())


def measure(store: Store, max_mb: int) -> None:
    """The image's size and its layers, and what must not be in it.

    The size is the sum of its layers, what a registry stores and a node unpacks: what `podman
    images` shows for an image just built or pulled. Once a container of it has run with
    --uidmap, `podman images` adds the copy of the layers podman keeps with their owners shifted
    for that user namespace (the vfs driver cannot shift them as it mounts): local, never pushed.
    """
    layers = json.loads(store.podman("history", "--format", "json", IMAGE, capture=True).stdout)
    size = sum(int(layer["size"]) for layer in layers)
    shown = store.podman("images", "--format", "{{.Size}}", IMAGE, capture=True).stdout.strip()
    say(f"size {_mb(size)}, the sum of its layers (`podman images` shows {shown}); bottom up:")
    for layer in reversed(layers):
        if layer["size"]:
            made = " ".join(layer["CreatedBy"].replace("/bin/sh -c #(nop) ", "").split())
            made = made.removeprefix("|1 UID=10001 /bin/sh -c ").removeprefix("/bin/sh -c ")
            say(f"  {_mb(layer['size']):>7}  {made[:100]}")
    mounted = Path(store.podman("image", "mount", IMAGE, capture=True).stdout.strip())
    try:
        venv, cli = _tree_bytes(mounted / "opt/venv"), (mounted / BUNDLED_CLI).stat().st_size
        say(f"  the venv holds {_mb(venv)}, {_mb(cli)} of it the bundled Claude Code CLI")
        found = [
            str(p.relative_to(mounted))
            for pattern in ("opt/venv/bin/pip*", "usr/bin/gcc*", "usr/bin/cc", "usr/bin/npm", "usr/bin/node")
            for p in mounted.glob(pattern)
        ]
        found += [str(p.relative_to(mounted)) for p in (mounted / "var/lib/apt/lists").glob("*_*")]
        found += [str(p.relative_to(mounted)) for p in (mounted / SITE_PACKAGES).glob("*/tests")]
        found += [str(p.relative_to(mounted)) for p in (mounted / "var/cache/apt").rglob("*.deb")]
    finally:
        store.podman("image", "unmount", IMAGE, check=False, capture=True)
    if found:
        raise Failed(f"the image carries what it should not: {', '.join(sorted(found)[:10])}")
    if size > max_mb * 1_000_000:
        raise Failed(f"the image is {_mb(size)}, over the {max_mb} MB budget (--max-size)")


def _tls(directory: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    (directory / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "tls.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )


async def drive(port: int, token: str, ca: bytes, read: Callable[[str], str]) -> None:
    """The flow, over TLS with the token; `read` gives a file's content inside the container."""
    import grpc
    from google.protobuf import struct_pb2

    from agent_rewind.api.v1 import (
        rewind_pb2,
        rewind_service_pb2,
        rewind_service_pb2_grpc,
        session_service_pb2,
        session_service_pb2_grpc,
    )

    credentials = grpc.ssl_channel_credentials(root_certificates=ca)
    channel = grpc.aio.secure_channel(f"localhost:{port}", credentials)
    auth = (("authorization", f"Bearer {token}"),)
    sessions = session_service_pb2_grpc.SessionServiceStub(channel)
    rewinds = rewind_service_pb2_grpc.RewindServiceStub(channel)

    async def prompt(sid: str, text: str) -> list[object]:
        call = sessions.Prompt(session_service_pb2.PromptRequest(session_id=sid, text=text), metadata=auth)
        return [e async for e in call]

    def prompt_id(events: list[object]) -> str:
        return next(e.message_id for e in events if e.HasField("user_prompt") and not e.parent_tool_use_id)  # type: ignore[attr-defined]

    def tool_output(events: list[object]) -> str:
        return "".join(e.tool_result.content for e in events if e.HasField("tool_result"))  # type: ignore[attr-defined]

    caps = await rewinds.GetCapabilities(rewind_service_pb2.GetCapabilitiesRequest(), metadata=auth)
    assert caps.authentication, "the image serves with authentication"
    assert caps.workspace_snapshots, "workspace snapshots work in the image (git is in it)"
    assert caps.sandbox.enabled, "commands are confined in the image, under the pod's settings"
    assert caps.sandbox.cli_confinement == "landlock", "the CLI is confined by the kernel in the image"
    say(
        f"capabilities: snapshots {caps.workspace_snapshots}, sandbox {caps.sandbox.enabled}, "
        f"cli confinement {caps.sandbox.cli_confinement} (Landlock ABI {caps.sandbox.landlock_abi}), "
        f"cli {caps.cli_version}"
    )
    try:
        await sessions.ListSessions(session_service_pb2.ListSessionsRequest())
        raise AssertionError("a call without a token was answered")
    except grpc.aio.AioRpcError as err:
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    options = struct_pb2.Struct()
    options.update({"allowed_tools": ["Bash"]})
    session = await sessions.CreateSession(
        session_service_pb2.CreateSessionRequest(options=options), metadata=auth
    )
    sid = session.session_id
    await prompt(sid, "say hello from the image")
    await prompt(sid, "bash echo one > notes.txt")
    second = prompt_id(await prompt(sid, "bash echo two > notes.txt"))
    assert tool_output(await prompt(sid, "bash cat notes.txt")).strip() == "two", (
        "the command ran in the sandbox"
    )
    # The CLI's own Read of a file outside its workspace, through a link a command planted: the
    # hook refuses it; were the hook raced, the kernel would (tests/unit/sandbox/test_cli.py).
    await prompt(sid, "bash ln -sfn /etc/agent-rewind link")
    assert "BEGIN" not in tool_output(await prompt(sid, "read link/tls/tls.key")), "no key through a link"
    notes = f"{session.cwd}/notes.txt"
    rewound = await rewinds.Rewind(
        rewind_service_pb2.RewindRequest(
            session_id=sid, message_id=second, mode=rewind_pb2.REWIND_MODE_FILES
        ),
        metadata=auth,
    )
    assert rewound.files.source == rewind_pb2.FILES_SOURCE_SNAPSHOT, (
        "a Bash edit is rewound from the snapshot"
    )
    assert read(notes).strip() == "one", read(notes)
    say("a Bash edit rewound from a workspace snapshot")
    undone = await rewinds.UndoRewind(
        rewind_service_pb2.UndoRewindRequest(session_id=sid, rewind_id=rewound.rewind_id), metadata=auth
    )
    assert undone.files.can_rewind
    assert read(notes).strip() == "two", read(notes)
    say("the rewind undone")
    kinds = []
    stream = rewinds.WatchRewindEvents(
        rewind_service_pb2.WatchRewindEventsRequest(after_cursor=0), metadata=auth
    )
    async for item in stream:
        if item.HasField("caught_up"):
            break
        kinds.append(rewind_pb2.RewindEventKind.Name(item.event.kind))
    stream.cancel()
    assert kinds == ["REWIND_EVENT_KIND_REWOUND", "REWIND_EVENT_KIND_UNDONE"], kinds
    say(f"events: {kinds}")
    await channel.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _own(directory: Path, uid: int) -> None:
    """The recipe's ownership: only the image's user (the host uid it maps to) reads the secrets."""
    for path in [directory, *directory.rglob("*")]:
        os.chown(path, uid, uid)
        path.chmod(0o700 if path.is_dir() else 0o600)


def make_secrets(directory: Path, token: str) -> None:
    """The access file admitting `token` and a certificate for localhost, as the recipe makes them."""
    from agent_rewind.access import hash_token

    (directory / "access").mkdir()
    (directory / "tls").mkdir()
    _tls(directory / "tls")
    permissions = ["sessions.read", "sessions.write", "rewind", "rewind.preview", "events.read"]
    entry = {"name": "image-test", "permissions": permissions, "token_sha256": [hash_token(token)]}
    (directory / "access" / "access.json").write_text(json.dumps({"principals": [entry]}))
    for part in ("access", "tls"):
        _own(directory / part, USERNS_BASE + UID)


def recipe(volume: str, secrets_dir: Path) -> list[str]:
    """deploy/README.md's `podman run` flags ("Run the image by hand"), flag for flag; the
    runtime and the ulimits are this machine's (MACHINE-FACTS.md), the published port the caller's."""
    return [
        "--read-only",
        "--tmpfs",
        "/tmp",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--security-opt",
        f"seccomp={ROOT / 'deploy/seccomp/agent-rewind.json'}",
        # hostUsers: false (a user namespace of its own) and procMount: Unmasked, without which
        # the command sandbox cannot mount a /proc of its own.
        "--uidmap",
        f"0:{USERNS_BASE}:65536",
        "--gidmap",
        f"0:{USERNS_BASE}:65536",
        "--security-opt",
        "unmask=ALL",
        "-v",
        f"{volume}:/var/lib/agent-rewind",
        "-v",
        f"{secrets_dir / 'access'}:/etc/agent-rewind/access:ro",
        "-v",
        f"{secrets_dir / 'tls'}:/etc/agent-rewind/tls:ro",
        "--ulimit",
        "nofile=4096:4096",
        "--ulimit",
        "nproc=4096:4096",
    ]


def check_service(store: Store, secrets_dir: Path, token: str) -> None:
    """The image run by the recipe, driven over TLS, and stopped by SIGTERM within its grace."""
    name = f"agent-rewind-image-test-{secrets.token_hex(4)}"
    volume = f"{name}-state"
    port = _free_port()
    store.podman("volume", "create", volume, capture=True)
    try:
        say(f"running it as deploy/README.md says, published on 127.0.0.1:{port}")
        store.podman(
            *RUNTIME,
            "run",
            "-d",
            "--name",
            name,
            *recipe(volume, secrets_dir),
            "-p",
            f"127.0.0.1:{port}:50051",
            "-e",
            f"AGENT_REWIND_SHUTDOWN_GRACE={GRACE}",
            IMAGE,
            "--model",
            "offline",
            capture=True,
        )
        _wait_serving(store, name)

        def read(path: str) -> str:
            return store.podman("exec", name, "cat", path, capture=True).stdout

        asyncio.run(drive(port, token, (secrets_dir / "tls" / "tls.crt").read_bytes(), read))
        say("SIGTERM: the server stops within its grace")
        started = time.monotonic()
        store.podman("stop", "-t", str(GRACE + 30), name, capture=True)
        took = time.monotonic() - started
        code = store.podman("inspect", "-f", "{{.State.ExitCode}}", name, capture=True).stdout.strip()
        logs = _logs(store, name)
        assert code == "0", f"exit code {code}: {logs[-2000:]}"
        assert took < GRACE + 5, f"stopping took {took:.1f} s, the grace is {GRACE} s"
        assert '"stopped"' in logs, "the server said it stopped"
        say(f"stopped in {took:.1f} s (grace {GRACE} s)")
    except BaseException:
        print(_logs(store, name)[-4000:], file=sys.stderr)
        raise
    finally:
        store.podman("rm", "-f", name, check=False, capture=True)
        store.podman("volume", "rm", "-f", volume, check=False, capture=True)


def check_unreadable_key(store: Store, secrets_dir: Path) -> None:
    """A key the image's user cannot read (root's, mode 0600): a one-line start error naming the
    flag, its variable and the uid, and the container exits."""
    os.chown(secrets_dir / "tls" / "tls.key", 0, 0)
    volume = f"agent-rewind-image-test-{secrets.token_hex(4)}-state"
    store.podman("volume", "create", volume, capture=True)
    try:
        ran = store.podman(
            *RUNTIME,
            "run",
            "--rm",
            *recipe(volume, secrets_dir),
            IMAGE,
            "--model",
            "offline",
            check=False,
            capture=True,
        )
    finally:
        store.podman("volume", "rm", "-f", volume, check=False, capture=True)
    said = ran.stdout + ran.stderr
    line = next((x for x in said.splitlines() if '"cannot start"' in x), "")
    assert ran.returncode != 0, f"the server started with a key it cannot read:\n{said[-2000:]}"
    for part in ("--tls-key", "AGENT_REWIND_TLS_KEY", "/etc/agent-rewind/tls/tls.key", f"uid {UID}"):
        assert part in line, f"the start error does not name {part}: {line or said[-2000:]}"
    say(f"a key uid {UID} cannot read: {json.loads(line)['error']}")


def _logs(store: Store, name: str) -> str:
    logs = store.podman("logs", name, check=False, capture=True)
    return logs.stdout + logs.stderr


def _wait_serving(store: Store, name: str, within: float = 120.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        state = store.podman("inspect", "-f", "{{.State.Status}}", name, capture=True).stdout.strip()
        if state not in ("running", "created", "configured"):
            raise Failed(f"the container is {state}:\n{_logs(store, name)[-4000:]}")
        if '"serving"' in _logs(store, name):
            return
        time.sleep(0.5)
    raise Failed("the server never started serving")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="image_test.py",
        description=(
            "Build the image from the Dockerfile (buildah), measure it, and run it as "
            "deploy/README.md says (podman, the pod's settings), on a container store of its own. "
            "Root; installs buildah, podman, runc and debootstrap from Debian's packages when missing."
        ),
    )
    parser.add_argument(
        "--store",
        type=Path,
        default=DEFAULT_STORE,
        metavar="DIR",
        help=f"the container store it keeps its base and layers in, between runs (default {DEFAULT_STORE}; "
        "remove the directory to start afresh)",
    )
    parser.add_argument(
        "--max-size",
        type=int,
        default=MAX_SIZE_MB,
        metavar="MB",
        help=f"fail when the image's layers add up to more, in MB of 10^6 bytes as podman counts "
        f"(default {MAX_SIZE_MB})",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("image-test: needs root (buildah, podman and debootstrap as root)", file=sys.stderr)
        return 1
    store = Store(args.store.resolve())
    try:
        ensure_tools()
        store.prepare()
        say(f"container store {store.root} (its own: the machine's is left alone)")
        ensure_base(store)
        build(store)
        measure(store, args.max_size)
        token = "arw_" + secrets.token_urlsafe(24)
        with tempfile.TemporaryDirectory(prefix="agent-rewind-image-test-") as scratch:
            secrets_dir = Path(scratch)
            make_secrets(secrets_dir, token)
            check_service(store, secrets_dir, token)
            check_unreadable_key(store, secrets_dir)
    except Failed as err:
        print(f"image-test: failed: {err}", file=sys.stderr)
        return 1
    except AssertionError as err:
        print(f"image-test: failed: {err}", file=sys.stderr)
        return 1
    say("passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
