"""The access file: what it accepts, what it refuses (and where), and how it is read again.

A typo in the file must neither lock every caller out nor let anyone in; a token is revoked by
editing the file, without a restart, within the file's check interval."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from agent_rewind.access import AccessFile, AccessFileError, Permission, hash_token, new_token, parse
from agent_rewind.errors import Unauthenticated

ALICE, BOB = "alice-token", "bob-token"


def _entry(name: str, token: str, *permissions: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "permissions": list(permissions), "token_sha256": [hash_token(token)], **extra}


def _write(path: Path, *principals: dict[str, Any]) -> None:
    # A new inode each time, as an editor or a mounted Secret's update makes it.
    staged = path.with_suffix(".new")
    staged.write_text(json.dumps({"principals": list(principals)}))
    os.replace(staged, path)


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ([], "needs"),
        ({"principals": "alice"}, "needs"),
        ({"principals": [["alice"]]}, r"principals\[0\]: needs a name"),
        ({"principals": [{"name": 7}]}, "needs a name"),
        ({"principals": [{"name": "  "}]}, "needs a name"),
        ({"principals": [{"name": "a"}, {"name": "a"}]}, r"principals\[1\]: 'a' is named twice"),
        ({"principals": [{"name": "a", "permissions": ["root"]}]}, "permissions are"),
        ({"principals": [{"name": "a", "token_sha256": [7]}]}, "lowercase hex"),
        ({"principals": [{"name": "a", "token_sha256": ["ab" * 31]}]}, "lowercase hex"),
        ({"principals": [{"name": "a", "token_sha256": ["AB" * 32]}]}, "lowercase hex"),
        (
            {"principals": [{"name": "a", "token_sha256": [hash_token("t"), hash_token("t")]}]},
            "listed twice",
        ),
        ({"principals": [{"name": "a", "certificate_subjects": [7]}]}, "common names"),
        ({"principals": [{"name": "a", "certificate_subjects": [""]}]}, "common names"),
    ],
    ids=[
        "not_an_object",
        "principals_not_a_list",
        "principal_not_an_object",
        "name_not_a_string",
        "blank_name",
        "name_twice",
        "unknown_permission",
        "digest_not_a_string",
        "digest_too_short",
        "digest_upper_case",
        "digest_twice",
        "subject_not_a_string",
        "empty_subject",
    ],
)
def test_a_malformed_file_is_refused_saying_where(data: Any, says: str) -> None:
    with pytest.raises(AccessFileError, match=says):
        parse(data)


def test_a_well_formed_file_maps_tokens_and_subjects_to_their_principal() -> None:
    by_token, by_subject = parse(
        {"principals": [_entry("alice", ALICE, "rewind", certificate_subjects=["alice.svc"])]}
    )
    assert by_token[hash_token(ALICE)] is by_subject["alice.svc"]
    assert by_subject["alice.svc"].name == "alice"
    assert by_subject["alice.svc"].permissions == frozenset({Permission.REWIND})


def test_a_new_token_is_256_random_bits_with_the_service_s_prefix() -> None:
    tokens = {new_token() for _ in range(100)}
    assert len(tokens) == 100
    for token in tokens:
        assert token.startswith("arw_") and len(token) == len("arw_") + 43


def test_a_file_malformed_at_the_start_stops_the_start(tmp_path: Path) -> None:
    path = tmp_path / "access.json"
    path.write_text('{"principals": [{"name": ""}]}')
    with pytest.raises(AccessFileError, match="needs a name"):
        AccessFile(path)


def test_a_file_broken_later_keeps_the_last_good_version_in_force(tmp_path: Path) -> None:
    path = tmp_path / "access.json"
    _write(path, _entry("alice", ALICE, "rewind"))
    access = AccessFile(path, check_every=0)
    path.write_text('{"principals": [')  # a half-written edit
    assert access.by_token(ALICE).name == "alice", "a typo locks nobody out"
    path.unlink()
    assert access.by_token(ALICE).name == "alice"
    with pytest.raises(Unauthenticated):
        access.by_token(BOB)


def test_a_revoked_token_is_refused_once_the_file_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "access.json"
    _write(path, _entry("alice", ALICE), _entry("bob", BOB))
    access = AccessFile(path, check_every=0)
    assert access.by_token(BOB).name == "bob"
    _write(path, _entry("alice", ALICE))
    with pytest.raises(Unauthenticated):
        access.by_token(BOB)


def test_the_file_is_looked_at_no_more_than_once_per_interval(tmp_path: Path) -> None:
    path = tmp_path / "access.json"
    _write(path, _entry("alice", ALICE), _entry("bob", BOB))
    access = AccessFile(path, check_every=3600)
    _write(path, _entry("alice", ALICE))
    assert access.by_token(BOB).name == "bob", "not read again within the interval"
    access.reload(force=True)
    with pytest.raises(Unauthenticated):
        access.by_token(BOB)


def test_an_unchanged_file_is_not_parsed_again(tmp_path: Path) -> None:
    path = tmp_path / "access.json"
    _write(path, _entry("alice", ALICE))
    access = AccessFile(path, check_every=0)
    with capture_logs() as logs:
        for _ in range(5):
            access.by_token(ALICE)
    assert [e for e in logs if e["event"] == "access file loaded"] == []
    _write(path, _entry("alice", ALICE), _entry("bob", BOB))
    with capture_logs() as logs:
        assert access.by_token(BOB).name == "bob"
    assert [e["principals"] for e in logs if e["event"] == "access file loaded"] == [2]


def test_a_principal_without_a_token_or_certificate_is_named_with_its_permissions(tmp_path: Path) -> None:
    """A webhook's principal needs no credential; it is known by name, and only by name."""
    path = tmp_path / "access.json"
    _write(path, _entry("alice", ALICE), {"name": "hooks", "permissions": ["events.read"]})
    access = AccessFile(path)
    hooks = access.named("hooks")
    assert hooks is not None and hooks.permissions == frozenset({Permission.EVENTS_READ})
    assert access.named("nobody") is None
    with pytest.raises(Unauthenticated):
        access.by_name("hooks")
    assert access.by_name("alice").name == "alice"
