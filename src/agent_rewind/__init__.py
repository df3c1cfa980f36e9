"""agent-rewind: a gRPC service that hosts Claude Agent SDK sessions and rewinds them."""

__version__ = "0.1.0"
