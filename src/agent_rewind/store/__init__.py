"""Durable state: the SQLite ledger of sessions, pending conversation cuts and rewinds."""

from agent_rewind.store.ledger import Anchor, Ledger, RewindRecord, SessionRecord

__all__ = ["Anchor", "Ledger", "RewindRecord", "SessionRecord"]
