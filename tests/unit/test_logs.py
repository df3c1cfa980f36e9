"""Secrets never reach a log line: registered values and anything shaped like a credential."""

from __future__ import annotations

from agent_rewind import logs


def test_registered_secrets_and_credential_shapes_are_masked() -> None:
    logs.secret("hunter2-correct-horse")
    assert logs.redact("key=hunter2-correct-horse!") == f"key={logs.REDACTED}!"
    assert logs.redact("Authorization: Bearer abc.def") == f"Authorization: {logs.REDACTED}"
    assert logs.redact("sk-ant-api03-XYZ and arw_Zk9 here") == f"{logs.REDACTED} and {logs.REDACTED} here"
    assert logs.redact("nothing secret") == "nothing secret"


def test_short_values_are_not_registered_as_secrets() -> None:
    logs.secret("abc")  # would mask every "abc" in every line
    assert logs.redact("abcdef") == "abcdef"


def test_the_processor_masks_every_field_nested_ones_included() -> None:
    logs.secret("nested-secret-value")
    event = {"event": "x", "error": "got nested-secret-value", "details": {"list": ["arw_tok", 3]}}
    out = logs.redact_secrets(None, "info", event)
    assert out == {"event": "x", "error": f"got {logs.REDACTED}", "details": {"list": [logs.REDACTED, 3]}}
