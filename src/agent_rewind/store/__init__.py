"""Durable state: the ledger interface (ledger.py), its SQL core (sql.py over dialect.py), and
its two implementations: SQLite, embedded (sqlite.py), and PostgreSQL, shared by replicas
(postgres.py, imported only where `--database-url` asks for it, so psycopg stays unloaded)."""

from agent_rewind.store.ledger import Anchor, Ledger, RewindRecord, SessionRecord
from agent_rewind.store.sqlite import SqliteLedger

__all__ = ["Anchor", "Ledger", "RewindRecord", "SessionRecord", "SqliteLedger"]
