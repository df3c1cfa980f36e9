"""The stream of history changes: the hub that replays the event log and follows it live."""

from agent_rewind.events.hub import CaughtUp, EventHub

__all__ = ["CaughtUp", "EventHub"]
