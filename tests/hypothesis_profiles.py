"""Hypothesis profiles: a bounded number of examples in `make test`, many in `make fuzz`.

`AGENT_REWIND_FUZZ=1` (set by `make fuzz`) runs every property with at least 10,000 examples.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "test", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "fuzz",
    max_examples=10_000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("fuzz" if os.environ.get("AGENT_REWIND_FUZZ") else "test")
FUZZING = bool(os.environ.get("AGENT_REWIND_FUZZ"))
