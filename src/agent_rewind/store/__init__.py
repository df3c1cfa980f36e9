"""Durable state: the ledger interface (ledger.py) and its embedded SQLite implementation."""

from agent_rewind.store.ledger import Anchor, Ledger, RewindRecord, SessionRecord
from agent_rewind.store.sqlite import SqliteLedger

__all__ = ["Anchor", "Ledger", "RewindRecord", "SessionRecord", "SqliteLedger"]
