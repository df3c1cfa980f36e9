"""What a database supplies to the ledger's SQL (`store/sql/`, one store per concern).

The stores in `store/sql/` write each statement once, spelled with the `Spelling` of the dialect
they hold (its placeholder, its row locks, its clock, its JSON columns' names), when the ledger is
made; where the two databases need different statements altogether, the dialect holds its own
text (`SCHEMA_VERSION`, `BLANK_FILES`, `append_event`), and it names the columns only its older
schema has (`legacy_columns`). The two dialects are `store/sqlite.py` and `store/postgres.py`.

A write is a generator of statements (`Work`): the dialect runs it in one transaction and sends
each statement's result back in, so the same body runs in SQLite's writer thread and on
PostgreSQL's async connections.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Protocol, TypeVar

from agent_rewind.store.records import NewEvent, NewRequest

T = TypeVar("T")


class Row(Protocol):
    """A row as either database returns it: its columns by name."""

    def __getitem__(self, key: str, /) -> Any: ...


@dataclass(frozen=True)
class Result:
    """What a statement gave back: its rows (none for most writes) and how many it changed."""

    rows: Sequence[Row]
    rowcount: int

    def one(self) -> Row | None:
        return self.rows[0] if self.rows else None


# A statement and its arguments.
Statement = tuple[str, tuple[Any, ...]]
# A write's body: yields each statement, is sent its result, returns the write's answer.
Work = Generator[Statement, Result, T]


@dataclass(frozen=True)
class Spelling:
    """How a dialect spells what the stores' statements share."""

    p: str  # an argument's placeholder
    # Appended to a read of a row: holds off its change (a registration) until the transaction ends.
    share: str
    # Appended to the read of a row the transaction is about to change.
    lock: str
    # The time leases are measured by, and that time some seconds on: expressions whose
    # arguments `Dialect.clock_args` and `Dialect.lease_args` give.
    clock: str
    lease_end: str
    # The JSON columns' names (SQLite's first schema named them `*_json`).
    options: str
    plan: str
    result: str
    data: str
    erasure: str

    def marks(self, count: int) -> str:
        """`count` placeholders, for a row's values."""
        return ", ".join([self.p] * count)


class Dialect(ABC):
    """A database, as the stores of `store/sql/` use it: its transactions and reads, its errors,
    how it stores times and JSON, its spelling, and the few statements that differ."""

    SPELLING: ClassVar[Spelling]
    # Reads the schema's version (the column `version` of its one row).
    SCHEMA_VERSION: ClassVar[str]
    # Blanks the file paths of a session's earlier events (one argument: the session id).
    BLANK_FILES: ClassVar[str]

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def wait_for_events(self, seconds: float) -> None: ...

    @abstractmethod
    async def transact(self, work: Callable[[], Work[T]], durable: bool) -> T:
        """Runs `work()` in one transaction, durable once this returns (a dialect that tries a
        transaction again calls `work` again). Not `durable`: derived data that a crash may lose
        (`PointIndex.record_points`), committed without waiting for the disk where the dialect
        can lose it only with this process (see the dialects)."""

    @abstractmethod
    async def read(self, statement: str, args: tuple[Any, ...]) -> Sequence[Row]: ...

    @abstractmethod
    def unavailable(self, err: BaseException) -> bool:
        """Whether `err` means the database cannot be used now (retryable): StorageUnavailable."""

    @abstractmethod
    def encode_time(self, value: datetime) -> Any: ...

    @abstractmethod
    def decode_time(self, value: Any) -> datetime: ...

    @abstractmethod
    def encode_json(self, value: Any, *, text: bool = False) -> Any:
        """A JSON column's value (None for None); `text`: a column that keeps the text as given."""

    @abstractmethod
    def decode_json(self, value: Any) -> Any: ...

    @abstractmethod
    def clock_args(self) -> tuple[Any, ...]:
        """The arguments of `SPELLING.clock`."""

    @abstractmethod
    def lease_args(self, seconds: float) -> tuple[Any, ...]:
        """The arguments of `SPELLING.lease_end`, `seconds` from now."""

    @abstractmethod
    def legacy_columns(self, table: str, request: NewRequest | None) -> dict[str, Any]:
        """Columns an older schema of the dialect has and still fills, for a new row of `table`
        (the same names whatever `request` is)."""

    @abstractmethod
    def append_event(self, event: NewEvent, stamp: datetime, rewind_id: str | None) -> Work[int]:
        """Appends `event` under the next cursor (recording it on rewind `rewind_id`, if given),
        the last lock the transaction takes; returns the cursor."""

    @abstractmethod
    async def erased(self, tables: Sequence[str], changed: bool) -> None:
        """After an erasure commits (`changed`: it changed rows): what deleted must not linger."""
