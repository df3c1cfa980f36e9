"""The ledger over SQL, one store per concern, each holding the dialect (`store/dialect.py`) it
runs on: `sessions.py` (sessions, egress), `request_ids.py`, `rewinds.py` (rewinds, their intents
and cuts), `point_index.py`, `event_log.py`, `erasure.py`, `snapshot_order.py`,
`replica_directory.py` (with the fence), `webhook_cursors.py`; `database.py`, what they share
(one error mapping, the write metrics, fenced writes); and `ledger.py`, `SqlLedger`, the stores
composed into one `Ledger`. Each store spells its statements once, with the dialect's
`Spelling`, when the ledger is made."""
