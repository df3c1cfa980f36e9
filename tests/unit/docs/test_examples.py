"""What the docs quote from runnable examples is what the examples say (the examples themselves
run in integration tests)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _blocks(doc: Path, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", doc.read_text(), flags=re.DOTALL)


def test_the_python_consumer_in_events_md_is_the_tested_example() -> None:
    quoted = [b for b in _blocks(ROOT / "docs" / "events.md", "python") if "def follow" in b]
    assert len(quoted) == 1
    assert quoted[0] in (ROOT / "docs" / "examples" / "watch_events.py").read_text()


def test_the_node_consumer_in_events_md_is_the_tested_example() -> None:
    [quoted] = [b for b in _blocks(ROOT / "docs" / "events.md", "javascript") if "watchRewindEvents" in b]
    assert quoted == (ROOT / "clients" / "node" / "examples" / "watch-events.mjs").read_text()


def test_the_webhook_receivers_in_events_md_are_the_tested_examples() -> None:
    doc = ROOT / "docs" / "events.md"
    [python] = [b for b in _blocks(doc, "python") if "class Receiver" in b]
    assert python == (ROOT / "docs" / "examples" / "webhook_receiver.py").read_text()
    [node] = [b for b in _blocks(doc, "javascript") if "standardwebhooks" in b]
    assert node == (ROOT / "docs" / "examples" / "webhook-receiver" / "receiver.mjs").read_text()


def test_the_typescript_example_in_generating_clients_md_is_the_tested_example() -> None:
    doc = ROOT / "docs" / "generating-clients.md"
    example = ROOT / "docs" / "examples" / "typescript-client"
    [config] = [b for b in _blocks(doc, "yaml") if "local: protoc-gen-es" in b]
    assert config == (example / "buf.gen.yaml").read_text()
    [client] = [b for b in _blocks(doc, "javascript") if "createGrpcTransport" in b]
    assert client == (example / "client.mjs").read_text()
