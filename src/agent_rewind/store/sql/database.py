"""A dialect with what every store of `store/sql/` shares: one error mapping for reads and writes
(a dialect's "unavailable" error is StorageUnavailable either way), the write metrics, and the
fence every write but the replica directory's passes first, in its transaction."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from agent_rewind import metrics
from agent_rewind.errors import StorageUnavailable
from agent_rewind.store.dialect import Dialect, Row, Work

T = TypeVar("T")


class Database:
    """`dialect`, as the stores use it. `fence`: the check a fenced write runs first
    (`replica_directory.Fence.check`)."""

    def __init__(self, dialect: Dialect, fence: Callable[[], Work[None]]) -> None:
        self.dialect = dialect
        self._fence = fence

    async def transaction(
        self, work: Callable[[], Work[T]], *, fenced: bool = True, durable: bool = True
    ) -> T:
        """Runs `work` in one transaction (after the fence's check, in it, if `fenced`)."""

        def guarded() -> Work[T]:
            yield from self._fence()
            return (yield from work())

        started = time.perf_counter()
        try:
            return await self.dialect.transact(guarded if fenced else work, durable)
        except BaseException as err:
            metrics.LEDGER_WRITE_FAILURES.inc()
            if self.dialect.unavailable(err):
                raise StorageUnavailable(str(err)) from err
            raise
        finally:
            metrics.LEDGER_WRITE_SECONDS.observe(time.perf_counter() - started)

    async def execute(self, statement: str, *args: Any, fenced: bool = True) -> int:
        """One statement as a write of its own; how many rows it changed."""

        def work() -> Work[int]:
            return (yield statement, args).rowcount

        return await self.transaction(work, fenced=fenced)

    async def rows(self, statement: str, *args: Any) -> Sequence[Row]:
        try:
            return await self.dialect.read(statement, args)
        except Exception as err:
            if self.dialect.unavailable(err):
                raise StorageUnavailable(str(err)) from err
            raise

    async def row(self, statement: str, *args: Any) -> Row | None:
        rows = await self.rows(statement, *args)
        return rows[0] if rows else None
