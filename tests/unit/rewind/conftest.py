from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.rewind.fakes import MakeSetup, Setup


@pytest.fixture
async def make_setup(tmp_path: Path) -> AsyncIterator[MakeSetup]:
    """Makes the test's session (`Setup.create`'s options); closes it at the end."""
    made: list[Setup] = []

    async def make(**kw: Any) -> Setup:
        s = await Setup.create(tmp_path, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        await s.close()
