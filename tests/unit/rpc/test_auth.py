"""Who is calling (rpc/auth.py), with a real access file: each check tried as an attacker would,
where it alone stands between the call and a principal (the others would let it through)."""

from __future__ import annotations

import contextvars
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from agent_rewind.access import AccessFile, Permission, Principal, hash_token
from agent_rewind.errors import PermissionDenied, Unauthenticated
from agent_rewind.rpc import auth
from agent_rewind.rpc.auth import FORWARDED_BY, PRINCIPAL, REPLICA_SECRET, Authenticator

T = TypeVar("T")

SECRET = "the-replica-secret"
ALICE_TOKEN = "arw_alice-secret"
BOB_TOKEN = "arw_bob-secret"
# bob may read sessions and nothing more.
BOB = Principal("bob", frozenset({Permission.SESSIONS_READ}))


class _Context:
    """What the authenticator reads of a call: its metadata and its transport's auth context."""

    def __init__(
        self, *metadata: tuple[str, str], auth_context: dict[str, list[bytes]] | None = None
    ) -> None:
        self._metadata = metadata
        self._auth_context = auth_context or {}

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._auth_context


@pytest.fixture
def authenticator(tmp_path: Path) -> Authenticator:
    path = tmp_path / "access.json"
    path.write_text(
        json.dumps(
            {
                "principals": [
                    {
                        "name": "alice",
                        "permissions": [p.value for p in Permission if p is not Permission.ADMIN],
                        "token_sha256": [hash_token(ALICE_TOKEN)],
                    },
                    {
                        "name": "bob",
                        "permissions": ["sessions.read"],
                        "token_sha256": [hash_token(BOB_TOKEN)],
                    },
                ]
            }
        )
    )
    return Authenticator(AccessFile(path), replica_secret=SECRET)


def _in_a_call(fn: Callable[[], T]) -> T:
    """Runs `fn` in a context of its own, as gRPC runs each call: what it sets stays there."""
    return contextvars.copy_context().run(fn)


def _admit(a: Authenticator, method: str, *metadata: tuple[str, str]) -> Any:
    return _in_a_call(lambda: a.admit(method, _Context(*metadata)))


def test_a_valid_token_under_another_scheme_than_bearer_is_unauthenticated(
    authenticator: Authenticator,
) -> None:
    """The token is good: only the scheme check refuses the header."""
    for header in (f"Basic {ALICE_TOKEN}", f"Token {ALICE_TOKEN}", f"Bearer: {ALICE_TOKEN}"):
        with pytest.raises(Unauthenticated, match="the word Bearer"):
            _admit(authenticator, "GetCapabilities", ("authorization", header))
    for header in (f"Bearer {ALICE_TOKEN}", f"bearer {ALICE_TOKEN}", f"BEARER  {ALICE_TOKEN} "):
        assert _admit(authenticator, "GetCapabilities", ("authorization", header)).name == "alice", header


def test_admit_answers_the_principal_it_admitted_and_makes_it_the_calls(
    authenticator: Authenticator,
) -> None:
    def admitted() -> tuple[Principal, Principal, str]:
        context = _Context(("authorization", f"Bearer {BOB_TOKEN}"))
        got = authenticator.admit("GetSession", context)
        return got, auth.current(), auth.forwarded_by()

    got, current, forwarded_by = _in_a_call(admitted)
    assert got == current == BOB
    assert forwarded_by == "", "a client's call was forwarded by no replica"


def test_a_forwarded_call_with_the_replica_secret_is_the_principal_it_names_with_its_permissions(
    authenticator: Authenticator,
) -> None:
    """A replica vouches for who called; the permissions are still that principal's own, and a
    name the access file does not hold is no principal at all."""
    forwarded = ((FORWARDED_BY, "replica-2"), (REPLICA_SECRET, SECRET))

    def admitted() -> tuple[Principal, str]:
        context = _Context(*forwarded, (PRINCIPAL, "bob"))
        return authenticator.admit("GetSession", context), auth.forwarded_by()

    assert _in_a_call(admitted) == (BOB, "replica-2")
    with pytest.raises(PermissionDenied) as denied:
        _admit(authenticator, "Rewind", *forwarded, (PRINCIPAL, "bob"))
    assert denied.value.metadata == {"permission": Permission.REWIND.value}
    for name in ("mallory", "", "local"):
        with pytest.raises(Unauthenticated, match="names no principal"):
            _admit(authenticator, "GetCapabilities", *forwarded, (PRINCIPAL, name))
