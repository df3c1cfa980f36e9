"""The CLI's environment from an allowlist (sandbox/environment.py): a cloud provider's
credentials reach the CLI only when that provider is the model's backend (issue 37: a slip that
passed AWS_* without Bedrock let a node's cloud credentials reach the agent)."""

from __future__ import annotations

import pytest

from agent_rewind.sandbox.environment import cli_environment

NODE = {
    "AWS_ACCESS_KEY_ID": "AKIA-node",
    "AWS_SECRET_ACCESS_KEY": "node-secret",
    "AWS_SESSION_TOKEN": "node-token",
    "GOOGLE_APPLICATION_CREDENTIALS": "/var/run/node.json",
    "VERTEX_REGION_CLAUDE": "europe-west1",
    "CLOUD_ML_REGION": "us-east5",
    "PGPASSWORD": "database",
    "ANTHROPIC_API_KEY": "sk-ant-real",
    "PATH": "/usr/bin",
}


def _env(environ: dict[str, str], *, offline: bool = False) -> dict[str, str]:
    return cli_environment(
        environ, config_dir="/c", home="/h", offline_model_url="http://127.0.0.1:9" if offline else None
    )


def _given(env: dict[str, str]) -> set[str]:
    """The variables the CLI gets with a value (the others are set empty, present by name)."""
    return {k for k, v in env.items() if v}


def test_the_anthropic_backend_gets_no_cloud_credential() -> None:
    given = _given(_env(NODE))
    assert not {k for k in given if k.startswith(("AWS_", "GOOGLE_", "VERTEX_", "CLOUD_ML"))}, given
    assert "ANTHROPIC_API_KEY" in given and "PGPASSWORD" not in given


def test_bedrock_gets_aws_and_not_google() -> None:
    given = _given(_env({**NODE, "CLAUDE_CODE_USE_BEDROCK": "1"}))
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"} <= given
    assert not {k for k in given if k.startswith(("GOOGLE_", "VERTEX_", "CLOUD_ML"))}


def test_vertex_gets_google_and_not_aws() -> None:
    given = _given(_env({**NODE, "CLAUDE_CODE_USE_VERTEX": "1"}))
    assert {"GOOGLE_APPLICATION_CREDENTIALS", "VERTEX_REGION_CLAUDE", "CLOUD_ML_REGION"} <= given
    assert not {k for k in given if k.startswith("AWS_")}


@pytest.mark.parametrize("backend", ["CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX"])
def test_the_offline_model_gets_no_credential_whatever_the_backend_says(backend: str) -> None:
    given = _given(_env({**NODE, backend: "1"}, offline=True))
    assert not {k for k in given if k.startswith(("AWS_", "GOOGLE_", "VERTEX_", "CLOUD_ML"))}
    assert _env(NODE, offline=True)["ANTHROPIC_API_KEY"] != "sk-ant-real"


def test_trace_context_variables_of_the_service_never_reach_the_cli() -> None:
    env = _env({**NODE, "TRACEPARENT": "00-abc-def-01", "BAGGAGE": "tenant=a"})
    assert env["TRACEPARENT"] == "" and env["BAGGAGE"] == ""


@pytest.mark.parametrize("offline", [False, True])
def test_what_the_cli_needs_to_run_is_passed_on_as_the_operator_set_it(offline: bool) -> None:
    general = {
        "PATH": "/opt/bin:/usr/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HTTPS_PROXY": "http://p:3128",
    }
    env = _env({**NODE, **general}, offline=offline)
    assert {k: env[k] for k in general} == general
    assert env["PGPASSWORD"] == "" and env["CLAUDE_CONFIG_DIR"] == "/c" and env["HOME"] == "/h"
