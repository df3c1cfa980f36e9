"""Checks every servicer applies to request fields, in one place: required fields, UUIDs, paging.

Page tokens (AIP-158) are opaque: a keyset position, bound to the list it came from (its name
and whatever narrows it, such as the session and the caller), signed with the deployment's key.
A token that was altered, forged or made for another list is INVALID_ARGUMENT, and its bytes are
never parsed before the signature holds, so no crafted token reaches the JSON decoder.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import uuid
from typing import Any

from agent_rewind.errors import InvalidArgument

# A token is a few dozen bytes; anything much longer was not made here.
_MAX_TOKEN_CHARS = 512
_MAC_BYTES = 16
MAX_PAGE_SIZE = 1000


def required(field: str, value: str) -> str:
    if not value:
        raise InvalidArgument(field, "is required")
    return value


def session_id(value: str, field: str = "session_id") -> str:
    """A session id: required, and a UUID (the SDK's session ids are)."""
    return uuid_field(field, required(field, value))


def uuid_field(field: str, value: str) -> str:
    """A UUID in its canonical form; INVALID_ARGUMENT naming the field otherwise."""
    try:
        return str(uuid.UUID(value))
    except (ValueError, AttributeError, TypeError):
        raise InvalidArgument(field, f"must be a UUID, got {value[:64]!r}") from None


def optional_uuid(field: str, value: str) -> str | None:
    return uuid_field(field, value) if value else None


def page_size(requested: int, default: int, maximum: int = MAX_PAGE_SIZE) -> int:
    """AIP-158: 0 means the default, larger than the maximum means the maximum."""
    if requested < 0:
        raise InvalidArgument("page_size", "must not be negative")
    return min(requested or default, maximum)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class PageTokens:
    """Issues and checks page tokens for every list the service serves."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError("a page token key needs at least 16 bytes")
        self._key = key

    def _mac(self, scope: str, body: bytes) -> bytes:
        return hmac.new(self._key, scope.encode() + b"\0" + body, hashlib.sha256).digest()[:_MAC_BYTES]

    def issue(self, scope: str, position: dict[str, Any]) -> str:
        """A token for the page after `position` of the list named by `scope`."""
        body = json.dumps(position, separators=(",", ":"), sort_keys=True).encode()
        return f"{_b64(body)}.{_b64(self._mac(scope, body))}"

    def position(self, token: str, scope: str) -> dict[str, Any] | None:
        """The position a token of this list carries; None for the first page (no token)."""
        if not token:
            return None
        try:
            if len(token) > _MAX_TOKEN_CHARS:
                raise ValueError
            body_text, mac_text = token.split(".")
            body, mac = _unb64(body_text), _unb64(mac_text)
            if not hmac.compare_digest(mac, self._mac(scope, body)):
                raise ValueError
            position = json.loads(body)
            if not isinstance(position, dict):
                raise ValueError
        except (ValueError, binascii.Error, UnicodeDecodeError):
            raise InvalidArgument(
                "page_token", "is not a token this service issued for this list; list again without it"
            ) from None
        return position


# A prompt's text, at most this many characters (a few hundred pages): beyond it is a mistake,
# or an attempt to fill the server's memory.
MAX_PROMPT_CHARS = 512 * 1024


def prompt_text(text: str) -> str:
    if not text.strip():
        raise InvalidArgument("text", "must not be empty")
    if len(text) > MAX_PROMPT_CHARS:
        raise InvalidArgument("text", f"must be at most {MAX_PROMPT_CHARS} characters")
    if "\x00" in text:
        raise InvalidArgument("text", "must not contain NUL characters")
    return text
