"""Turning command-line text into request values: SDK options, rewind modes and scopes, prompt text."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

from google.protobuf import struct_pb2

from agent_rewind.api.v1 import rewind_pb2

MODES: Mapping[str, rewind_pb2.RewindMode.ValueType] = {
    "files": rewind_pb2.REWIND_MODE_FILES,
    "conversation": rewind_pb2.REWIND_MODE_CONVERSATION,
    "both": rewind_pb2.REWIND_MODE_BOTH,
}

# `since`: everything since the point (every rewind until round 4); `turn`: only what the turn at
# the point changed, merged with what changed since (a revert, files mode only).
SCOPES: Mapping[str, rewind_pb2.RewindScope.ValueType] = {
    "since": rewind_pb2.REWIND_SCOPE_SINCE,
    "turn": rewind_pb2.REWIND_SCOPE_TURN,
}


class UsageError(ValueError):
    """A value on the command line that cannot be used. The CLI exits 2 with its message."""


def parse_option(text: str) -> tuple[str, Any]:
    """`KEY=VALUE` -> (KEY, value). VALUE is read as JSON, else kept as the plain string.

    So `max_turns=5` gives 5, `allowed_tools=["Read"]` a list, `model=claude-x` the string.
    """
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise UsageError(f"--option expects KEY=VALUE, got {text!r}")
    try:
        value: Any = json.loads(raw)
    except ValueError:
        value = raw
    return key, value


def build_options(options: Iterable[str] = (), options_json: str | None = None) -> struct_pb2.Struct:
    """The CreateSessionRequest.options Struct: `--options-json` first, then each `--option` over it."""
    merged: dict[str, Any] = {}
    if options_json:
        try:
            base = json.loads(options_json)
        except ValueError as err:
            raise UsageError(f"--options-json is not valid JSON: {err}") from None
        if not isinstance(base, dict):
            raise UsageError("--options-json must be a JSON object")
        merged.update(base)
    for text in options:
        key, value = parse_option(text)
        merged[key] = value
    struct = struct_pb2.Struct()
    try:
        struct.update(merged)
    except (ValueError, TypeError) as err:
        raise UsageError(f"options cannot be sent: {err}") from None
    return struct


def parse_mode(text: str) -> rewind_pb2.RewindMode.ValueType:
    """`files`, `conversation` or `both` (any case) -> the RewindMode value."""
    try:
        return MODES[text.strip().lower()]
    except KeyError:
        raise UsageError(f"mode must be one of {', '.join(MODES)}, got {text!r}") from None


def mode_name(mode: rewind_pb2.RewindMode.ValueType) -> str:
    """The short name of a mode; REWIND_MODE_UNSPECIFIED means files."""
    for name, value in MODES.items():
        if value == mode:
            return name
    return "files" if mode == rewind_pb2.REWIND_MODE_UNSPECIFIED else f"mode {int(mode)}"


def parse_scope(text: str) -> rewind_pb2.RewindScope.ValueType:
    """`since` or `turn` (any case) -> the RewindScope value."""
    try:
        return SCOPES[text.strip().lower()]
    except KeyError:
        raise UsageError(f"scope must be one of {', '.join(SCOPES)}, got {text!r}") from None


def scope_name(scope: rewind_pb2.RewindScope.ValueType) -> str:
    """The short name of a scope (REWIND_SCOPE_UNSPECIFIED means since); the number of one this
    client does not know."""
    for name, value in SCOPES.items():
        if value == scope:
            return name
    return "since" if scope == rewind_pb2.REWIND_SCOPE_UNSPECIFIED else str(int(scope))


def read_prompt_text(text: str, stdin: TextIO | None = None) -> str:
    """The prompt itself, or stdin's whole content for `-`. A trailing newline from a pipe is dropped."""
    if text != "-":
        return text
    data = (stdin or sys.stdin).read()
    return data[:-1] if data.endswith("\n") else data
