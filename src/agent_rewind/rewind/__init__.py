"""Rewind points from a session's transcript: which prompts the conversation and files can go back to."""

from agent_rewind.rewind.points import (
    FILE_CHECKPOINT_WINDOW,
    PREVIEW_CHARS,
    EntryKind,
    RewindPoint,
    classify,
)
from agent_rewind.rewind.transcript import ConversationView, Entry, IndexStats, TranscriptIndex

__all__ = [
    "FILE_CHECKPOINT_WINDOW",
    "PREVIEW_CHARS",
    "ConversationView",
    "Entry",
    "EntryKind",
    "IndexStats",
    "RewindPoint",
    "TranscriptIndex",
    "classify",
]
