"""Durable state: the ledger interface (ledger.py) and its records (records.py); its SQL, one
store per concern (sql/), each over a dialect (dialect.py says what one supplies); and the two
dialects with their ledgers: SQLite, embedded (sqlite.py), and PostgreSQL, shared by replicas
(postgres.py, imported only where `--database-url` asks for it, so psycopg stays unloaded)."""

from agent_rewind.store.ledger import Anchor, Ledger, RewindRecord, SessionRecord
from agent_rewind.store.sqlite import SqliteLedger

__all__ = ["Anchor", "Ledger", "RewindRecord", "SessionRecord", "SqliteLedger"]
