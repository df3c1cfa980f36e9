"""The webhook secret file: its keys in order, and every way it can be wrong, each said with the
line number and never the line."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from agent_rewind.webhooks.secrets import SecretFileError, new_key, read_secret_file


def _file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "webhook-keys"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_every_key_in_order_comments_and_blank_lines_skipped(tmp_path: Path) -> None:
    old, new = new_key(), new_key()
    path = _file(tmp_path, f"# rotating: new first\n\n  {new}  \n{old}\n", 0o640)
    assert read_secret_file(path) == [new, old]


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0", "starts with 'whsec_'"),
        ("whsec_not base64 at all!", "not base64"),
        ("whsec_" + base64.b64encode(b"short-secret").decode(), "24 to 64 random bytes"),
        ("whsec_" + base64.b64encode(b"x" * 65).decode(), "24 to 64 random bytes"),
    ],
)
def test_a_bad_line_is_named_by_its_number_never_its_text(tmp_path: Path, line: str, says: str) -> None:
    path = _file(tmp_path, f"{new_key()}\n# a comment\n{line}\n")
    with pytest.raises(SecretFileError) as refused:
        read_secret_file(path)
    assert "line 3" in str(refused.value) and says in str(refused.value)
    assert line.removeprefix("whsec_")[:12] not in str(refused.value)


def test_a_file_others_may_read_is_refused(tmp_path: Path) -> None:
    path = _file(tmp_path, new_key() + "\n", 0o644)
    with pytest.raises(SecretFileError, match="other users may read"):
        read_secret_file(path)


def test_no_key_a_missing_file_or_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SecretFileError, match="holds no key"):
        read_secret_file(_file(tmp_path, "# nothing yet\n"))
    with pytest.raises(SecretFileError, match="No such file"):
        read_secret_file(tmp_path / "absent")
    with pytest.raises(SecretFileError, match="not a regular file"):
        read_secret_file(tmp_path)
