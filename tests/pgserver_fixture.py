"""A real PostgreSQL server for tests, from the `pgserver` wheel (PostgreSQL's binaries inside).

`pgserver` runs initdb and the server itself; PostgreSQL refuses to run as root, so when the tests
run as root (this sandbox, CI) `pgserver` runs them as a system user of its own, `pgserver`, made
with `useradd` on first use, and widens the permissions of the data directory's parent directories
and of its own binaries so that user can reach them. The data directory is therefore made under the
system's temporary directory (world-traversable already), not under pytest's (mode 0700).

The server listens on a Unix socket only (no TCP port to collide with), with `fsync` off: the tests
do not crash the machine, and a commit then costs no disk flush (the ledger's connections still
commit with `synchronous_commit` on). Each test gets a database of its own (`create_database`), a
copy of a template, which takes a few tens of milliseconds.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

with warnings.catch_warnings():
    # platformdirs warns when XDG_RUNTIME_DIR is unset (as root, in CI) as pgserver is imported.
    warnings.simplefilter("ignore")
    import pgserver

TEMPLATE = "ledger_template"


class PostgresServer:
    """One PostgreSQL server in a temporary directory, removed with it by `stop`."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="agent-rewind-pg-"))
        self._names = itertools.count(1)
        # The template a test's database is copied from when it wants the ledger's schema (the
        # store tests' conftest migrates one); the empty one until then.
        self.migrated = TEMPLATE
        try:
            # One start at a time on the machine (make test runs two workers): on first use each
            # would find the system user missing and run `useradd`, and the second would fail.
            with open(Path(tempfile.gettempdir()) / "agent-rewind-pgserver.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                self._server: Any = pgserver.get_server(self.root / "data", cleanup_mode="delete")
            with self._admin() as db:
                db.execute("ALTER SYSTEM SET fsync = off")
                db.execute("ALTER SYSTEM SET full_page_writes = off")
                db.execute("SELECT pg_reload_conf()")
                db.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(TEMPLATE)))
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise

    def url(self, database: str = "postgres") -> str:
        return str(self._server.get_uri(database))

    @contextlib.contextmanager
    def _admin(self, database: str = "postgres") -> Iterator[psycopg.Connection[Any]]:
        with psycopg.connect(self.url(database), autocommit=True) as db:
            yield db

    def execute(self, query: str, args: tuple[Any, ...] = (), database: str = "postgres") -> list[Any]:
        """Runs one statement as the superuser; its rows, if any."""
        with self._admin(database) as db:
            cursor = db.execute(query.encode(), args)
            return cursor.fetchall() if cursor.description else []

    def create_database(self, template: str = TEMPLATE) -> str:
        """A new database, a copy of `template` (by default, empty); its name."""
        name = f"ledger_{next(self._names)}"
        with self._admin() as db:
            db.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(template)
                )
            )
        return name

    def drop_database(self, name: str) -> None:
        with self._admin() as db:
            db.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    @contextlib.contextmanager
    def stopped(self) -> Iterator[None]:
        """The server stopped for the block (a fast shutdown: clients' connections are ended by
        the administrator; new ones are refused), then started again. Through pgserver's own
        pg_ctl wrapper, as the user it runs the server as."""
        pgserver.pg_ctl(
            ["-w", "-m", "fast", "stop"], pgdata=self._server.pgdata, user=self._server.system_user
        )
        try:
            yield
        finally:
            self._server.ensure_postgres_running()

    def stop(self) -> None:
        """Stops the server (clients' connections are ended) and deletes its files."""
        try:
            self._server.cleanup()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
