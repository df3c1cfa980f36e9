"""How long a failed delivery attempt waits before the next: exponential, with jitter.

The n-th retry waits a random time between half and all of `base * 2**(n-1)` seconds, at most
`cap`: receivers that failed together (one outage) are not all retried in step, and a receiver
that is down is asked less and less often until the event's attempts run out.
"""

from __future__ import annotations

import random

BASE = 0.5
CAP = 60.0


def delay(retry: int, *, base: float = BASE, cap: float = CAP, rng: random.Random | None = None) -> float:
    """Seconds to wait before retry number `retry` (1 for the first retry)."""
    if retry < 1:
        raise ValueError("retries count from 1")
    ceiling = min(cap, base * 2 ** min(retry - 1, 62))
    return (rng or random).uniform(ceiling / 2, ceiling)
