"""Authentication, permissions and ownership through the real server (API.md, "Identity and
ownership"): bearer tokens from an access file that holds only their hashes, mutual TLS, every
RPC's permission, sessions a foreign principal never sees, per-principal limits."""

from __future__ import annotations

import datetime
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from agent_rewind.access import Permission, hash_token
from agent_rewind.api.v1 import (
    rewind_service_pb2,
    rewind_service_pb2_grpc,
    session_service_pb2,
    session_service_pb2_grpc,
)
from agent_rewind.rpc.auth import METHOD_PERMISSIONS
from agent_rewind.testing.server_process import ServerProcess
from tests.integration.harness import FILES, Client, error_info, prompt_id, serve

ALL = [p.value for p in Permission if p is not Permission.ADMIN]
TOKENS = {"alice": "arw_alice-secret", "bob": "arw_bob-secret", "admin": "arw_admin-secret"}


def _access(
    path: Path,
    principals: dict[str, list[str]],
    tokens: dict[str, str],
    subjects: dict[str, str] | None = None,
) -> Path:
    entries = []
    for name, permissions in principals.items():
        entry: dict[str, Any] = {"name": name, "permissions": permissions}
        if name in tokens:
            entry["token_sha256"] = [hash_token(tokens[name])]
        if subjects and name in subjects:
            entry["certificate_subjects"] = [subjects[name]]
        entries.append(entry)
    path.write_text(json.dumps({"principals": entries}))
    return path


def _as(c: Client, token: str | None) -> Client:
    """The same server, called with another bearer token (or none)."""
    metadata = (("authorization", f"Bearer {token}"),) if token else ()

    class _Stub:
        def __init__(self, stub: Any) -> None:
            self._stub = stub

        def __getattr__(self, name: str) -> Any:
            method = getattr(self._stub, name)

            def call(request: Any, **kw: Any) -> Any:
                return method(request, metadata=metadata, **kw)

            return call

    return Client(c.running, c.channel, _Stub(c.sessions), _Stub(c.rewinds))  # type: ignore[arg-type]


@asynccontextmanager
async def _server(tmp_path: Path, **overrides: Any) -> AsyncIterator[Client]:
    access = _access(
        tmp_path / "access.json",
        {"alice": ALL, "bob": ALL, "admin": ["admin"]},
        TOKENS,
    )
    async with serve(tmp_path / "state", access_file=access, **overrides) as c:
        yield c


async def _refused(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    return err.value


async def test_calls_without_valid_credentials_are_unauthenticated(tmp_path: Path) -> None:
    async with _server(tmp_path) as c:
        for token in (None, "arw_wrong", ""):
            err = await _refused(
                _as(c, token).rewinds.GetCapabilities(rewind_service_pb2.GetCapabilitiesRequest())
            )
            assert (err.code(), error_info(err).reason) == (
                grpc.StatusCode.UNAUTHENTICATED,
                "UNAUTHENTICATED",
            )
        bad_scheme = c.rewinds.GetCapabilities(
            rewind_service_pb2.GetCapabilitiesRequest(), metadata=(("authorization", "Basic YWxpY2U="),)
        )
        assert (await _refused(bad_scheme)).code() == grpc.StatusCode.UNAUTHENTICATED
        caps = await _as(c, TOKENS["alice"]).rewinds.GetCapabilities(
            rewind_service_pb2.GetCapabilitiesRequest()
        )
        assert caps.authentication


async def test_a_foreign_principal_sees_nothing_of_a_session_and_admin_sees_it(tmp_path: Path) -> None:
    async with _server(tmp_path) as c:
        alice, bob, admin = (_as(c, TOKENS[n]) for n in ("alice", "bob", "admin"))
        session = await alice.create()
        sid = session.session_id
        assert session.principal == "alice"
        point = prompt_id(await alice.prompt(sid, "write a.txt one"))
        unknown = str(uuid.uuid4())
        for target in (sid, unknown):  # the same answer for a foreign session and no session
            for call in (
                bob.get(target),
                bob.prompt(target, "say hi"),
                bob.points(target),
                bob.rewind(target, point, FILES),
                bob.dry_run(target, point, FILES),
                bob.sessions.CloseSession(session_service_pb2.CloseSessionRequest(session_id=target)),
                bob.sessions.Interrupt(session_service_pb2.InterruptRequest(session_id=target)),
                bob.sessions.ForkSession(session_service_pb2.ForkSessionRequest(session_id=target)),
                bob.sessions.DeleteSession(session_service_pb2.DeleteSessionRequest(session_id=target)),
                bob.rewinds.UndoRewind(
                    rewind_service_pb2.UndoRewindRequest(session_id=target, rewind_id=str(uuid.uuid4()))
                ),
                _first(
                    bob.sessions.Prompt(
                        session_service_pb2.PromptRequest(
                            session_id=target,
                            text="say hi",
                            rewind=session_service_pb2.PromptRewind(message_id=point, mode=FILES),
                        )
                    )
                ),
            ):
                err = await _refused(call)
                assert (err.code(), error_info(err).reason) == (
                    grpc.StatusCode.NOT_FOUND,
                    "SESSION_NOT_FOUND",
                )
        listed = await bob.sessions.ListSessions(session_service_pb2.ListSessionsRequest())
        assert list(listed.sessions) == []
        assert [
            s.session_id
            for s in (await admin.sessions.ListSessions(session_service_pb2.ListSessionsRequest())).sessions
        ] == [sid]
        assert (await alice.get(sid)).turn_count == 1, "nothing bob asked reached it"
        assert (await admin.get(sid)).principal == "alice"
        assert (await admin.rewind(sid, point, FILES)).files.can_rewind


async def _events(c: Client, **request: Any) -> tuple[list[Any], int]:
    """A watch's replay (events, then the caught_up cursor)."""
    events = []
    call = c.rewinds.WatchRewindEvents(rewind_service_pb2.WatchRewindEventsRequest(**request), timeout=20)
    async for response in call:
        if response.HasField("caught_up"):
            call.cancel()
            return events, response.caught_up.cursor
        events.append(response.event)
    raise AssertionError("the watch ended before caught_up")


async def test_a_watcher_sees_the_events_of_its_own_sessions_and_admin_sees_all(tmp_path: Path) -> None:
    async with _server(tmp_path) as c:
        alice, bob, admin = (_as(c, TOKENS[n]) for n in ("alice", "bob", "admin"))
        mine = (await alice.create()).session_id
        point = prompt_id(await alice.prompt(mine, "write a.txt one"))
        theirs = (await bob.create()).session_id
        their_point = prompt_id(await bob.prompt(theirs, "write b.txt two"))
        await alice.rewind(mine, point, FILES)
        await bob.rewind(theirs, their_point, FILES)
        # An admin rewinding alice's session: the event is alice's to see, and names the admin.
        await admin.rewind(mine, point, FILES)
        seen, newest = await _events(alice, after_cursor=0)
        assert newest == 3, "caught_up names the deployment's newest cursor, whatever is visible"
        assert [(e.cursor, e.session_id) for e in seen] == [(1, mine), (3, mine)]
        assert [e.principal for e in seen] == ["alice", "admin"]
        seen, _ = await _events(bob, after_cursor=0)
        assert [(e.cursor, e.session_id) for e in seen] == [(2, theirs)]
        seen, _ = await _events(admin, after_cursor=0)
        assert [e.cursor for e in seen] == [1, 2, 3]
        # Watching a foreign session is watching no session.
        err = await _refused(_events(bob, session_id=mine, after_cursor=0))
        assert (err.code(), error_info(err).reason) == (grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND")


@pytest.mark.parametrize("method", sorted(m for m, p in METHOD_PERMISSIONS.items() if p is not None))
async def test_every_rpc_needs_its_permission(tmp_path: Path, method: str) -> None:
    needed = METHOD_PERMISSIONS[method]
    assert needed is not None
    others = [p for p in ALL if p != needed.value]
    access = _access(
        tmp_path / "access.json", {"owner": ALL, "lacking": others}, {"owner": "arw_o", "lacking": "arw_l"}
    )
    async with serve(tmp_path / "state", access_file=access) as c:
        owner, lacking = _as(c, "arw_o"), _as(c, "arw_l")
        sid = (await owner.create()).session_id
        point = prompt_id(await owner.prompt(sid, "say one"))
        requests = {
            "CreateSession": lambda s: s.sessions.CreateSession(session_service_pb2.CreateSessionRequest()),
            "GetSession": lambda s: s.get(sid),
            "ListSessions": lambda s: s.sessions.ListSessions(session_service_pb2.ListSessionsRequest()),
            "Prompt": lambda s: s.prompt(sid, "say two"),
            "Interrupt": lambda s: s.sessions.Interrupt(session_service_pb2.InterruptRequest(session_id=sid)),
            "CloseSession": lambda s: s.sessions.CloseSession(
                session_service_pb2.CloseSessionRequest(session_id=sid)
            ),
            "ForkSession": lambda s: s.sessions.ForkSession(
                session_service_pb2.ForkSessionRequest(session_id=sid)
            ),
            "DeleteSession": lambda s: s.sessions.DeleteSession(
                session_service_pb2.DeleteSessionRequest(session_id=sid)
            ),
            "ListRewindPoints": lambda s: s.points(sid),
            "DryRun": lambda s: s.dry_run(sid, point, FILES),
            "Rewind": lambda s: s.rewind(sid, point, FILES),
            "UndoRewind": lambda s: s.rewinds.UndoRewind(
                rewind_service_pb2.UndoRewindRequest(session_id=sid, rewind_id=str(uuid.uuid4()))
            ),
            "WatchRewindEvents": lambda s: _first(
                s.rewinds.WatchRewindEvents(rewind_service_pb2.WatchRewindEventsRequest())
            ),
        }
        err = await _refused(requests[method](lacking))
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED, method
        info = error_info(err)
        assert (info.reason, info.metadata["permission"]) == ("PERMISSION_DENIED", needed.value)


async def _first(stream: Any) -> Any:
    async for item in stream:
        return item
    return None


async def test_the_access_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    async with _server(tmp_path) as c:
        access = tmp_path / "access.json"
        caps = rewind_service_pb2.GetCapabilitiesRequest()
        assert await _as(c, TOKENS["alice"]).rewinds.GetCapabilities(caps)
        _access(access, {"carol": ALL}, {"carol": "arw_carol"})  # alice revoked, carol added
        await _wait_until_refused(c, TOKENS["alice"])
        assert await _as(c, "arw_carol").rewinds.GetCapabilities(caps)
        access.write_text("{not json")  # a broken edit keeps the last good version in force
        await _sleep(1.2)
        assert await _as(c, "arw_carol").rewinds.GetCapabilities(caps)


async def _wait_until_refused(c: Client, token: str) -> None:
    for _ in range(60):
        try:
            await _as(c, token).rewinds.GetCapabilities(rewind_service_pb2.GetCapabilitiesRequest())
        except grpc.aio.AioRpcError as err:
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED
            return
        await _sleep(0.1)
    raise AssertionError("the revoked token still works")


async def _sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)


async def test_per_principal_limits_are_quota_exceeded(tmp_path: Path) -> None:
    async with _server(tmp_path, max_sessions_per_principal=2, max_running_turns_per_principal=1) as c:
        alice, bob = _as(c, TOKENS["alice"]), _as(c, TOKENS["bob"])
        first = (await alice.create()).session_id
        second = (await alice.create()).session_id
        err = await _refused(alice.create())
        info = error_info(err)
        assert (err.code(), info.reason, info.metadata["limit"], info.metadata["max"]) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "QUOTA_EXCEEDED",
            "sessions",
            "2",
        )
        assert (await bob.create()).principal == "bob", "another principal's budget is its own"
        import asyncio

        running = asyncio.ensure_future(alice.prompt(first, "sleep 2\nsay slow"))
        await alice.wait_for_state(first, 2)
        err = await _refused(alice.prompt(second, "say now"))
        assert (error_info(err).reason, error_info(err).metadata["limit"]) == (
            "QUOTA_EXCEEDED",
            "running_turns",
        )
        await running
        assert (await alice.prompt(second, "say now"))[-1].result.subtype == "success"


# Transport: TLS, mutual TLS, and where an unauthenticated server may listen


def _cert(
    name: str,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool = False,
    host: bool = False,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer[0].subject if issuer else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if host:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False
        )
    cert = builder.sign(issuer[1] if issuer else key, hashes.SHA256())
    return cert, key


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


async def test_mutual_tls_names_the_principal_and_refuses_clients_without_a_good_certificate(
    tmp_path: Path,
) -> None:
    ca = _cert("test ca", None, ca=True)
    server_cert = _cert("localhost", ca, host=True)
    alice_cert = _cert("alice.svc", ca)
    stranger = _cert("mallory.svc", ca)
    other_ca = _cert("other ca", None, ca=True)
    forged = _cert("alice.svc", other_ca)
    files = {}
    for name, content in {
        "ca.pem": _pem(ca[0]),
        "server.pem": _pem(server_cert[0]),
        "server.key": _key_pem(server_cert[1]),
    }.items():
        (tmp_path / name).write_bytes(content)
        files[name] = tmp_path / name
    access = _access(tmp_path / "access.json", {"alice": ALL}, {}, {"alice": "alice.svc"})
    async with serve(
        tmp_path / "state",
        access_file=access,
        tls_cert=files["server.pem"],
        tls_key=files["server.key"],
        tls_client_ca=files["ca.pem"],
    ) as c:
        port = c.running.port if c.running else 0

        def channel(client: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None) -> grpc.aio.Channel:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_pem(ca[0]),
                private_key=_key_pem(client[1]) if client else None,
                certificate_chain=_pem(client[0]) if client else None,
            )
            return grpc.aio.secure_channel(f"localhost:{port}", credentials)

        async with channel(alice_cert) as ch:
            stub = session_service_pb2_grpc.SessionServiceStub(ch)
            session = await stub.CreateSession(session_service_pb2.CreateSessionRequest())
            assert session.principal == "alice"
        async with channel(stranger) as ch:
            err = await _refused(
                rewind_service_pb2_grpc.RewindServiceStub(ch).GetCapabilities(
                    rewind_service_pb2.GetCapabilitiesRequest()
                )
            )
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED, (
                "a good certificate of nobody the service knows"
            )
        for client in (None, forged):  # no certificate, or one another CA signed: no connection
            async with channel(client) as ch:
                err = await _refused(
                    rewind_service_pb2_grpc.RewindServiceStub(ch).GetCapabilities(
                        rewind_service_pb2.GetCapabilitiesRequest(), timeout=10
                    )
                )
                assert err.code() == grpc.StatusCode.UNAVAILABLE


async def test_listening_beyond_loopback_needs_authentication_and_tls_or_insecure(tmp_path: Path) -> None:
    refused = ServerProcess(tmp_path / "a", args=["--listen", "0.0.0.0:0"])
    try:
        with pytest.raises(RuntimeError, match="exited with 1"):
            await refused.start(ready_within=30)
        assert any("--insecure" in str(line.get("error", "")) for line in refused.log_lines())
    finally:
        await refused.close()
    insecure = ServerProcess(tmp_path / "b", args=["--listen", "0.0.0.0:0", "--insecure"])
    try:
        await insecure.start()
        assert any(
            line.get("level") == "warning" and "insecure" in str(line.get("event", ""))
            for line in insecure.log_lines()
        )
    finally:
        await insecure.close()


async def test_a_prompt_that_rewinds_needs_the_rewind_permission_too(tmp_path: Path) -> None:
    prompt_only = [p for p in ALL if p != Permission.REWIND.value]
    access = _access(tmp_path / "access.json", {"owner": prompt_only}, {"owner": "arw_o"})
    async with serve(tmp_path / "state", access_file=access) as c:
        owner = _as(c, "arw_o")
        sid = (await owner.create()).session_id
        point = prompt_id(await owner.prompt(sid, "say one"))
        request = session_service_pb2.PromptRequest(
            session_id=sid,
            text="say two",
            rewind=session_service_pb2.PromptRewind(message_id=point, mode=FILES),
        )
        err = await _refused(_first(owner.sessions.Prompt(request)))
        assert (err.code(), error_info(err).reason) == (
            grpc.StatusCode.PERMISSION_DENIED,
            "PERMISSION_DENIED",
        )
        assert error_info(err).metadata["permission"] == Permission.REWIND.value
        assert [p.message_id for p in (await owner.points(sid)).points] == [point], "nothing ran"
