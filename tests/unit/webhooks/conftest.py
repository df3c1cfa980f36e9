"""Tests here run `serve`'s start checks and `agent-rewind webhooks`, both of which configure the
logs (on the stderr pytest captures for that test): the configuration is put back after each."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog


@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)
