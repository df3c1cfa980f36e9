"""The subagent transcripts of a session, read only when a lookup misses the main file."""

from __future__ import annotations

import json
import os
from pathlib import Path

from agent_rewind.transcript.reading import IndexStats, LineReader, assistant_parts, parse_line


class Subagents:
    """The subagent transcripts in `<session_id>/subagents/`, read lazily and incrementally.

    Only needed to tell a subagent's message id (NOT_A_REWIND_POINT) from an unknown one
    (MESSAGE_NOT_FOUND), so they are read only when a lookup misses the main file.
    """

    def __init__(self, directory: Path, stats: IndexStats) -> None:
        self.directory = directory
        self._stats = stats
        self._readers: dict[str, LineReader] = {}
        self.agents: dict[str, str] = {}  # message uuid or msg id -> agent id
        self.spawned_by: dict[str, str] = {}  # agent id -> the tool_use id that started it
        self.nested_calls: dict[str, str] = {}  # tool_use id of a call made by a subagent -> its agent id

    def agent_of(self, message_id: str) -> str | None:
        if message_id not in self.agents:
            self._refresh()
        return self.agents.get(message_id)

    def _refresh(self) -> None:
        try:
            names = sorted(p.name for p in os.scandir(self.directory))
        except OSError:
            return
        for name in names:
            if not (name.startswith("agent-") and name.endswith(".jsonl")):
                continue
            agent = name[len("agent-") : -len(".jsonl")]
            reader = self._readers.setdefault(name, LineReader(self.directory / name, self._stats))
            for _, line in reader.read(on_reset=lambda: None):  # ids only ever get added
                raw = parse_line(line, self._stats)
                if raw is None:
                    continue
                agent_id = raw.get("agentId")
                entry_agent = agent_id if isinstance(agent_id, str) else agent
                if isinstance(raw.get("uuid"), str):
                    self.agents[raw["uuid"]] = entry_agent
                if raw.get("type") == "assistant":
                    api_id, calls = assistant_parts(raw)
                    if api_id:
                        self.agents[api_id] = entry_agent
                    for call in calls:
                        self.nested_calls[call] = entry_agent
            if agent not in self.spawned_by:
                self._read_meta(agent)

    def spawn_call_of(self, agent: str) -> str | None:
        if agent not in self.spawned_by:
            self._read_meta(agent)
        return self.spawned_by.get(agent)

    def _read_meta(self, agent: str) -> None:
        try:
            meta = json.loads((self.directory / f"agent-{agent}.meta.json").read_bytes())
        except (OSError, ValueError):
            return
        if isinstance(meta, dict) and isinstance(meta.get("toolUseId"), str):
            self.spawned_by[agent] = meta["toolUseId"]
