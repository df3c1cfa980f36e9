"""Rewinding a session: planning both halves under API.md's rules, applying them, recovering."""
