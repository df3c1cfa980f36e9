"""Reading the Claude Code CLI's transcripts: which entries are prompts, and the visible conversation.

Lower-level than both sessions/ and rewind/, which build on it; it imports neither."""

from agent_rewind.transcript.entries import (
    FILE_CHECKPOINT_WINDOW,
    PREVIEW_CHARS,
    EntryKind,
    RewindPoint,
    classify,
)
from agent_rewind.transcript.index import ConversationView, Entry, IndexStats, TranscriptIndex

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
