"""Speed targets of agent-rewind, run by `make bench` (`python -m benchmarks`).

Each benchmark measures the things it compares side by side in one run (interleaved, so the
noise of a shared machine falls on both sides alike), reports medians and their ratios, and
checks its targets. The run prints a table per benchmark and PASS or FAIL per target, and exits
non-zero when a target fails. Results and how to read them: docs/benchmarks.md.

- `points`: listing rewind points costs O(page), not O(session) (TranscriptIndex against the
  SDK's `get_session_messages`, on transcripts of 50 and 5,000 turns made from a real recording).
- `rewind`: a conversation rewind through the real gRPC server returns long before a CLI
  process could start, since the service defers the rebuild to the next use.
- `memory`: what a live session's CLI process holds, and that a hibernated one holds nothing.
"""
