"""Speed and memory targets of agent-rewind, run by `make bench` (`python -m benchmarks`).

Each benchmark measures the things it compares side by side in one run (interleaved round by
round, so the noise of a shared machine falls on both sides alike), reports medians and their
ratios, and checks its targets. The run prints a table per benchmark and PASS or FAIL per target,
and exits non-zero when a target fails. What each row measures and why each target is what it
is: docs/benchmarks.md, whose results block `--update-docs` rewrites from a run.

- `points`: a page of `ListRewindPoints` through the real server costs O(page), not O(session),
  against the SDK's `get_session_messages`, on sessions of 50 and 5,000 turns.
- `rewind`: a conversation rewind costs milliseconds, and the prompt right after it finds the CLI
  process ready (the service cuts the live process in place).
- `memory`: what a session's CLI processes hold, as /proc reports it: live, hibernated, and right
  after a conversation rewind.
- `storage`: a prompt with `--max-session-storage` and `--max-principal-storage` on costs at most
  1.05x one with them off, on a session whose workspace holds 400 files.
"""
