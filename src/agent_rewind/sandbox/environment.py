"""The Claude Code CLI's environment, built from an allowlist of the service's.

The service's environment holds what no agent should see (a database URL or PGPASSWORD, cloud
credentials of the node, the access file's path, anything a platform injects). The CLI gets
only what it needs to run and reach its model: where it keeps state (set by the service), the
locale, the CA bundle and proxy the operator set for outbound HTTPS, and the credential and
endpoint of the model backend in use, nothing of the others. The SDK starts the CLI with the
service's whole environment under the options' `env`, so every other variable is set empty
there: present by name, empty in value. Commands the agent runs see none of this either: the
command sandbox starts them with an environment of their own (sandbox/commands.py).
"""

from __future__ import annotations

from collections.abc import Mapping

# Always passed on as the operator set them.
_GENERAL = frozenset(
    {
        "PATH",
        "LANG",
        "LANGUAGE",
        "TZ",
        "USER",
        "LOGNAME",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "NODE_EXTRA_CA_CERTS",
        # The CLI's own outbound proxy (a corporate proxy in front of the model's API).
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "NO_PROXY",
        "no_proxy",
    }
)
_GENERAL_PREFIXES = ("LC_",)

# The real model: the Anthropic API (or a gateway at ANTHROPIC_BASE_URL) and its credential.
_ANTHROPIC_PREFIXES = ("ANTHROPIC_",)
_ANTHROPIC = frozenset({"CLAUDE_CODE_OAUTH_TOKEN", "CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX"})
_ANTHROPIC |= {"CLAUDE_CODE_USE_FOUNDRY", "CLAUDE_CODE_SKIP_BEDROCK_AUTH", "CLAUDE_CODE_SKIP_VERTEX_AUTH"}
# A cloud provider's credentials, only when that provider is the backend.
_BEDROCK_PREFIXES = ("AWS_",)
_VERTEX = frozenset({"GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT", "CLOUD_ML_REGION"})
_VERTEX_PREFIXES = ("VERTEX_REGION_",)

# What the service sets for every CLI process.
FIXED = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_AUTOUPDATER": "1",
}


def _kept(name: str, environ: Mapping[str, str], real_model: bool) -> bool:
    if name in _GENERAL or name.startswith(_GENERAL_PREFIXES):
        return True
    if not real_model:
        return False
    if name in _ANTHROPIC or name.startswith(_ANTHROPIC_PREFIXES):
        return True
    if environ.get("CLAUDE_CODE_USE_BEDROCK") and name.startswith(_BEDROCK_PREFIXES):
        return True
    return bool(environ.get("CLAUDE_CODE_USE_VERTEX")) and (
        name in _VERTEX or name.startswith(_VERTEX_PREFIXES)
    )


def cli_environment(
    environ: Mapping[str, str],
    *,
    config_dir: str,
    home: str,
    offline_model_url: str | None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The options' `env` for every CLI process: the allowlisted variables of `environ`, every
    other one empty, and the service's own settings. `offline_model_url`: the scripted model's
    address (then no credential of `environ` is passed on, so none can be used by accident)."""
    real_model = offline_model_url is None
    env = {name: (value if _kept(name, environ, real_model) else "") for name, value in environ.items()}
    env.update(FIXED)
    env.update(CLAUDE_CONFIG_DIR=config_dir, HOME=home)
    if offline_model_url is not None:
        env.update(ANTHROPIC_BASE_URL=offline_model_url, ANTHROPIC_API_KEY="offline-scripted-model")
    env.update(extra or {})
    return env
