"""Confinement of the agent: its commands in a sandbox, its network through an allowlist, the
CLI's environment from an allowlist (docs/security.md). A leaf package: it uses nothing of the
service but `errors`."""

from agent_rewind.sandbox.commands import CommandLimits, CommandSandbox, SandboxUnavailable, SessionSandbox

__all__ = ["CommandLimits", "CommandSandbox", "SandboxUnavailable", "SessionSandbox"]
