"""One `serve` flag, declared once: its argparse argument, its environment fallback and its help;
and the value checks the flags share (durations, counts).

A Flag reads its default from the Config record, so the help shows what an absent flag means.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agent_rewind.config.record import Config

ENV_PREFIX = "AGENT_REWIND_"
# How a yes/no flag's variable may say yes or no (any case).
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def seconds(text: str) -> float:
    """A duration flag's value: a finite number of seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds, 0 or more: {text!r}")
    return value


def positive_seconds(text: str) -> float:
    """A timeout's value: a finite number of seconds, more than 0."""
    value = seconds(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds: {text!r}")
    return value


def lease(text: str) -> float:
    """A lease's length: a duration of at least one second (renewed every third of it)."""
    value = seconds(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 second: {text!r}")
    return value


def count(text: str) -> int:
    """A bound's value: an integer of 0 (no bound) or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more: {text!r}")
    return value


def niceness(text: str) -> int:
    """What is added to a process's niceness: an integer from 0 (none) to 19 (the least priority)."""
    value = count(text)
    if value > 19:
        raise argparse.ArgumentTypeError(f"must be 19 or less: {text!r}")
    return value


def positive_int(text: str) -> int:
    """A count flag's value: an integer of 1 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more: {text!r}")
    return value


@dataclass(frozen=True)
class Flag:
    """One `serve` flag, declared once: its argparse argument, its environment fallback and its help.

    The flag sets the Config field `config_field`. When the flag is not given, its environment
    variable (AGENT_REWIND_ + the flag's name, unless `env` says otherwise) is read and checked by
    the flag's own argparse argument, so it gets the same conversion, the same choices and the same
    messages; an empty variable counts as unset. Without either, the Config field keeps its default,
    which the help shows (or `default_help`, when that reads better).
    """

    name: str
    config_field: str
    help: str
    convert: Callable[[str], Any] = str
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    # action="append"; the environment form holds several values separated by `separator`.
    repeatable: bool = False
    separator: str = os.pathsep
    # A yes/no flag: --name and --no-name, taking no value; its variable says true or false.
    switch: bool = False
    env: str = ""
    default_help: str = ""

    @property
    def dest(self) -> str:
        return self.name.removeprefix("--").replace("-", "_")

    @property
    def env_var(self) -> str:
        return self.env or ENV_PREFIX + self.dest.upper()

    def default_text(self) -> str:
        if self.default_help:
            return self.default_help
        value = getattr(Config(), self.config_field)
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, float):
            return str(int(value)) if value.is_integer() else f"{value:g}"
        return str(value)

    def help_text(self) -> str:
        form = f", several separated by {self.separator!r}" if self.repeatable else ""
        form += ", true or false" if self.switch else ""
        text = f"{self.help} (env {self.env_var}{form}, default {self.default_text()})"
        return text.replace("%", "%%")  # argparse formats help with %

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """The argparse argument. Its default is None, so an absent flag can fall back to the environment."""
        if self.switch:
            parser.add_argument(
                self.name,
                dest=self.dest,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=self.help_text(),
            )
            return
        parser.add_argument(
            self.name,
            dest=self.dest,
            action="append" if self.repeatable else "store",
            type=self.convert,
            choices=self.choices,
            metavar=self.metavar,
            default=None,
            help=self.help_text(),
        )

    def from_environment(self, environ: Mapping[str, str]) -> Any:
        """The environment variable's value as the flag would parse it; None when unset or empty.

        Raises argparse.ArgumentError naming the variable when the flag would refuse the value.
        """
        text = environ.get(self.env_var, "")
        if not text:
            return None
        if self.switch:
            if text.strip().lower() not in _TRUE + _FALSE:
                raise self._env_error(f"invalid boolean value: {text!r} (use true or false)")
            argv = [self.name if text.strip().lower() in _TRUE else "--no-" + self.name.removeprefix("--")]
        else:
            values = [v for v in text.split(self.separator) if v] if self.repeatable else [text]
            argv = [f"{self.name}={v}" for v in values]
        # The flag's own argument parses the value: nothing to keep in step with the command line.
        probe = argparse.ArgumentParser(add_help=False, exit_on_error=False)
        self.add_to(probe)
        try:
            parsed = probe.parse_args(argv)
        except argparse.ArgumentError as err:
            raise self._env_error(err.message) from None
        return getattr(parsed, self.dest)

    def _env_error(self, message: str) -> argparse.ArgumentError:
        return argparse.ArgumentError(None, f"environment variable {self.env_var} ({self.name}): {message}")
