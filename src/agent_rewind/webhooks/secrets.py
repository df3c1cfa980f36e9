"""The webhook secret file (`--webhook-secret-file`): one Standard Webhooks key a line.

Each line is a key in the specification's form, `whsec_` and the base64 of 24 to 64 random
bytes. Every key in the file signs every delivery (`webhook-signature` holds one signature per
key), so a key rotates without a gap: add the new key, let receivers learn it, remove the old
one (each step a restart). Blank lines and lines starting with `#` are skipped.

The file is read once, at start. It must be a regular file no one but its owner and group may
read or write (a Kubernetes Secret mounted with `defaultMode: 0440` or tighter); a bad line is a
usage error naming its line number, never its text.
"""

from __future__ import annotations

import base64
import binascii
import os
import stat
from pathlib import Path

PREFIX = "whsec_"
# The specification's bounds on a key's size, in bytes.
MIN_KEY_BYTES = 24
MAX_KEY_BYTES = 64


class SecretFileError(ValueError):
    """The secret file cannot be used; the message says why (never what a line holds)."""


def read_secret_file(path: Path) -> list[str]:
    """The keys of the file, in its order (each `whsec_...`), checked."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise SecretFileError(f"{path}: not a regular file")
        if info.st_mode & 0o007:
            raise SecretFileError(
                f"{path}: other users may read or write it (mode {stat.S_IMODE(info.st_mode):04o}); "
                "make it readable by its owner (and group) only: chmod o-rwx"
            )
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise SecretFileError(f"{path}: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise SecretFileError(f"{path}: not UTF-8 text") from None
    keys = []
    for number, line in enumerate(text.splitlines(), start=1):
        key = line.strip()
        if not key or key.startswith("#"):
            continue
        problem = _problem(key)
        if problem:
            raise SecretFileError(f"{path}, line {number}: {problem}")
        keys.append(key)
    if not keys:
        raise SecretFileError(f"{path}: holds no key (one whsec_... key a line)")
    return keys


def _problem(key: str) -> str:
    """What is wrong with a line as a key ("" when nothing is); never quotes it."""
    if not key.startswith(PREFIX):
        return f"a key starts with {PREFIX!r} (the Standard Webhooks form)"
    encoded = key.removeprefix(PREFIX)
    try:
        raw = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (binascii.Error, ValueError):
        return f"what follows {PREFIX!r} is not base64"
    if not MIN_KEY_BYTES <= len(raw) <= MAX_KEY_BYTES:
        return f"a key is {MIN_KEY_BYTES} to {MAX_KEY_BYTES} random bytes; this one is {len(raw)}"
    return ""


def new_key() -> str:
    """A fresh key in the file's form (32 random bytes)."""
    return PREFIX + base64.b64encode(os.urandom(32)).decode()
