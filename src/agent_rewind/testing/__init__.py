"""Reusable test support: the scripted model server; a fake agent client (`fake_agent`, imported on its own)."""

from agent_rewind.testing.scripted_model import RECALL_PREFIX, ScriptedModel, answer, visible_prompts

__all__ = ["RECALL_PREFIX", "ScriptedModel", "answer", "visible_prompts"]
