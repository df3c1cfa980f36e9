"""Generated from protos/agent_rewind/v1 by `make proto`. Do not edit."""
