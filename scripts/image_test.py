"""`make image-test`: builds the image from the Dockerfile as it is and runs it as the pod does.

No Docker engine is needed: buildah builds, podman runs (both from Debian's packages, installed
here as root when missing). Where no registry image can be pulled, the Dockerfile's base
(`python:3.11-slim`) is made from Debian packages with debootstrap, with this machine's CA bundle
in it so pip works inside the build, and kept in the local image store for the next run.

The container runs with the pod's own settings (deploy/base/statefulset.yaml): uid 10001, a
read-only root, every capability dropped, no-new-privileges, a tmpfs /tmp, the seccomp profile of
deploy/seccomp/, the state dir on a volume, the access file and the TLS files mounted read-only,
and the image's own entrypoint (TLS and a token required) with the offline model. Then, over TLS
with a bearer token: capabilities (snapshots and the sandbox on), a prompt, a Bash edit, a files
rewind served from a workspace snapshot, an undo, the events, and a SIGTERM that stops the
server within its grace. Exit status 0 when all of it holds.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import secrets
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
BASE = "docker.io/library/python:3.11-slim"
STORAGE = ["--storage-driver", "vfs"]
RUNTIME = ["--runtime", "runc"]
GRACE = 10  # --shutdown-grace inside the container


def say(text: str) -> None:
    print(f"image-test: {text}", flush=True)


def run(
    *args: str, check: bool = True, capture: bool = False, **kw: object
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), check=check, text=True, capture_output=capture, **kw)  # type: ignore[call-overload]


def ensure_tools() -> None:
    missing = [
        p
        for p, cmd in (
            ("buildah", "buildah"),
            ("podman", "podman"),
            ("runc", "runc"),
            ("debootstrap", "debootstrap"),
        )
        if not shutil.which(cmd)
    ]
    if not missing:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise SystemExit(
            f"image-test: install {' '.join(missing)} (Debian: apt-get install {' '.join(missing)})"
        )
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


def podman(*args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return run("podman", *STORAGE, *args, **kw)


def have_image(name: str) -> bool:
    return podman("image", "exists", name, check=False).returncode == 0


def ensure_base() -> None:
    """The Dockerfile's FROM, pulled if a registry answers, else made from Debian packages."""
    if have_image(BASE):
        return
    if podman("pull", "-q", BASE, check=False, capture=True).returncode == 0:
        return
    say(f"no registry answers: making {BASE} from Debian bookworm packages (a minute)")
    with tempfile.TemporaryDirectory(prefix="agent-rewind-base-") as scratch:
        rootfs = Path(scratch) / "rootfs"
        run(
            "debootstrap",
            "--variant=minbase",
            "bookworm",
            str(rootfs),
            "http://deb.debian.org/debian",
            capture=True,
        )
        bundle = Path("/etc/ssl/certs/ca-certificates.crt")
        if bundle.exists():  # a proxy's CA, say: pip inside the build must trust what this host trusts
            (rootfs / "usr/local/share/ca-certificates").mkdir(parents=True, exist_ok=True)
            shutil.copy(bundle, rootfs / "usr/local/share/ca-certificates/host-bundle.crt")
        chroot = ["chroot", str(rootfs), "/usr/bin/env", "DEBIAN_FRONTEND=noninteractive"]
        run(*chroot, "apt-get", "update", "-qq", capture=True)
        run(
            *chroot,
            "apt-get",
            "install",
            "-y",
            "-qq",
            "--no-install-recommends",
            "ca-certificates",
            "netbase",
            "tzdata",
            "python3.11",
            "python3.11-venv",
            "python-is-python3",
            capture=True,
        )
        run(*chroot, "update-ca-certificates", capture=True)
        shutil.rmtree(rootfs / "var/lib/apt/lists", ignore_errors=True)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        podman(
            "import",
            "--change",
            "ENV LANG=C.UTF-8",
            "--change",
            'CMD ["python3"]',
            "-",
            BASE,
            stdin=tar.stdout,
            capture=True,
        )
        tar.wait()


def build() -> None:
    say("building the image from the Dockerfile (a few minutes)")
    started = time.monotonic()
    run(
        "buildah",
        "bud",
        "--isolation",
        "chroot",
        *STORAGE,
        "--pull=never",
        "--layers",
        "-t",
        IMAGE,
        "-f",
        str(ROOT / "Dockerfile"),
        str(ROOT),
    )
    say(f"built in {time.monotonic() - started:.0f} s")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


def main() -> int:
    ensure_tools()
    ensure_base()
    build()
    name = f"agent-rewind-image-test-{secrets.token_hex(4)}"
    port = _free_port()
    token = "arw_" + secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory(prefix="agent-rewind-image-test-") as scratch:
        work = Path(scratch)
        (work / "access").mkdir()
        (work / "tls").mkdir()
        _tls(work / "tls")
        from agent_rewind.access import hash_token

        permissions = ["sessions.read", "sessions.write", "rewind", "rewind.preview", "events.read"]
        entry = {"name": "image-test", "permissions": permissions, "token_sha256": [hash_token(token)]}
        (work / "access" / "access.json").write_text(json.dumps({"principals": [entry]}))
        for path in work.rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        work.chmod(0o755)
        volume = f"{name}-state"
        podman("volume", "create", volume, capture=True)
        try:
            say("running it with the pod's settings")
            podman(
                *RUNTIME,
                "run",
                "-d",
                "--name",
                name,
                "--network",
                "host",
                "--read-only",
                "--cap-drop",
                "ALL",
                "--security-opt",
                "no-new-privileges",
                "--security-opt",
                f"seccomp={ROOT / 'deploy/seccomp/agent-rewind.json'}",
                "--user",
                "10001:10001",
                # hostUsers: false (a user namespace of the pod's own) and procMount: Unmasked,
                # without which the command sandbox cannot mount a /proc of its own.
                "--uidmap",
                "0:200000:65536",
                "--gidmap",
                "0:200000:65536",
                "--security-opt",
                "unmask=ALL",
                "--tmpfs",
                "/tmp",
                "--ulimit",
                "nofile=4096:4096",
                "--ulimit",
                "nproc=4096:4096",
                "-v",
                f"{volume}:/var/lib/agent-rewind",
                "-v",
                f"{work / 'access'}:/etc/agent-rewind/access:ro",
                "-v",
                f"{work / 'tls'}:/etc/agent-rewind/tls:ro",
                "-e",
                f"AGENT_REWIND_SHUTDOWN_GRACE={GRACE}",
                IMAGE,
                "--listen",
                f"127.0.0.1:{port}",
                "--model",
                "offline",
                capture=True,
            )
            _wait_serving(name, port)

            def read(path: str) -> str:
                return podman("exec", name, "cat", path, capture=True).stdout

            asyncio.run(drive(port, token, (work / "tls" / "tls.crt").read_bytes(), read))
            say("SIGTERM: the server stops within its grace")
            started = time.monotonic()
            podman("stop", "-t", str(GRACE + 30), name, capture=True)
            took = time.monotonic() - started
            code = podman("inspect", "-f", "{{.State.ExitCode}}", name, capture=True).stdout.strip()
            logs = podman("logs", name, check=False, capture=True)
            assert code == "0", f"exit code {code}: {logs.stdout[-2000:]}{logs.stderr[-2000:]}"
            assert took < GRACE + 5, f"stopping took {took:.1f} s, the grace is {GRACE} s"
            assert '"stopped"' in logs.stdout + logs.stderr, "the server said it stopped"
            say(f"stopped in {took:.1f} s (grace {GRACE} s)")
        except BaseException:
            logs = podman("logs", name, check=False, capture=True)
            print(logs.stdout[-4000:], logs.stderr[-4000:], file=sys.stderr)
            raise
        finally:
            podman("rm", "-f", name, check=False, capture=True)
            podman("volume", "rm", "-f", volume, check=False, capture=True)
    say("passed")
    return 0


def _wait_serving(name: str, port: int, within: float = 120.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        state = podman("inspect", "-f", "{{.State.Status}}", name, capture=True).stdout.strip()
        if state not in ("running", "created", "configured"):
            logs = podman("logs", name, check=False, capture=True)
            raise SystemExit(
                f"image-test: the container is {state}:\n{logs.stdout[-4000:]}{logs.stderr[-4000:]}"
            )
        logs = podman("logs", name, check=False, capture=True)
        if '"serving"' in logs.stdout + logs.stderr:
            return
        time.sleep(0.5)
    raise SystemExit("image-test: the server never started serving")


if __name__ == "__main__":
    sys.exit(main())
