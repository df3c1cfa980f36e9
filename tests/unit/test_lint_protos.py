"""scripts/lint_protos.py: the file options every .proto must carry for other languages' generators."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _lint_protos() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lint_protos", ROOT / "scripts" / "lint_protos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lint_protos = _lint_protos()


def _tree(tmp_path: Path, options: dict[str, str]) -> Path:
    """protos/agent_rewind/v1/rewind_service.proto with these top-level options."""
    proto = tmp_path / "protos" / "agent_rewind" / "v1" / "rewind_service.proto"
    proto.parent.mkdir(parents=True)
    lines = [f"option {name} = {value};" for name, value in options.items()]
    proto.write_text('syntax = "proto3";\n\npackage agent_rewind.v1;\n\n' + "\n".join(lines) + "\n")
    return tmp_path / "protos"


def _all_options(name: str = "rewind_service.proto") -> dict[str, str]:
    options: dict[str, str] = lint_protos.expected_options(Path(name))
    return options


def test_the_repository_protos_carry_every_option() -> None:
    assert lint_protos.file_option_problems(ROOT / "protos") == []


def test_every_proto_is_checked() -> None:
    # A file the check would not see could lack every option and still pass.
    assert len(list((ROOT / "protos").rglob("*.proto"))) >= 5


def test_a_missing_option_is_named_with_its_file_and_the_line_to_add(tmp_path: Path) -> None:
    options = _all_options()
    del options["go_package"]
    problems = lint_protos.file_option_problems(_tree(tmp_path, options))
    assert problems == [
        "protos/agent_rewind/v1/rewind_service.proto: option go_package is missing (want "
        '`option go_package = "github.com/agent-rewind/agent-rewind/gen/go/agent_rewind/v1;agentrewindv1";`)'
    ]


def test_another_value_is_named_with_both_values(tmp_path: Path) -> None:
    options = {**_all_options(), "java_multiple_files": "false", "php_namespace": '"AgentRewind\\\\V2"'}
    problems = lint_protos.file_option_problems(_tree(tmp_path, options))
    assert problems == [
        "protos/agent_rewind/v1/rewind_service.proto: option java_multiple_files is false, want true",
        'protos/agent_rewind/v1/rewind_service.proto: option php_namespace is "AgentRewind\\\\V2", '
        'want "AgentRewind\\\\V1"',
    ]


def test_an_option_inside_a_message_does_not_count_for_the_file(tmp_path: Path) -> None:
    options = _all_options()
    del options["ruby_package"]
    protos = _tree(tmp_path, options)
    proto = next(protos.rglob("*.proto"))
    proto.write_text(proto.read_text() + 'message M {\n  option ruby_package = "AgentRewind::V1";\n}\n')
    assert [p.split(": ", 1)[1] for p in lint_protos.file_option_problems(protos)] == [
        'option ruby_package is missing (want `option ruby_package = "AgentRewind::V1";`)'
    ]


@pytest.mark.parametrize(
    ("name", "outer"),
    [("session_service.proto", '"SessionServiceProto"'), ("rewind.proto", '"RewindProto"')],
)
def test_the_java_outer_class_is_named_after_the_file(name: str, outer: str) -> None:
    assert _all_options(name)["java_outer_classname"] == outer


def test_make_lint_fails_on_a_missing_option_before_buf_says_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    options = _all_options()
    del options["csharp_namespace"]
    monkeypatch.setattr(lint_protos, "PROTOS", _tree(tmp_path, options))
    fake_buf = tmp_path / "buf"
    fake_buf.write_text("#!/bin/sh\nexit 0\n")  # every buf check passes
    fake_buf.chmod(0o755)
    monkeypatch.setattr(lint_protos, "ensure_buf", lambda: fake_buf)
    assert lint_protos.main() == 1
    assert "rewind_service.proto: option csharp_namespace is missing" in capsys.readouterr().err


def test_generating_clients_md_shows_the_pinned_values() -> None:
    # Its table of options: | `go_package` | `github.com/...` | ... (java_outer_classname is described).
    table = (ROOT / "docs" / "generating-clients.md").read_text()
    shown = dict(re.findall(r"^\| `(\w+)` \| `([^`]+)` \|", table, re.MULTILINE))
    pinned = {name: "true" if value is True else value for name, value in lint_protos.FILE_OPTIONS.items()}
    assert shown == pinned
