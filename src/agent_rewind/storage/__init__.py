"""What a session holds on the server's volumes: its usage measured (usage.py), the limits that
refuse a turn (limits.py), and retention of what files rewinds need (retention.py)."""
