"""The model backend choice and the environment every CLI process gets."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agent_rewind import server
from agent_rewind.config import Config, check_files_readable
from agent_rewind.server import choose_backend, cli_environment, default_factory

SCRIPTED_URL = "http://127.0.0.1:43210"


@pytest.fixture(autouse=True)
def no_anthropic_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("ANTHROPIC_"):
            monkeypatch.delenv(key)


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return Config(state_dir=tmp_path / "state").resolved()


def scripted_model() -> Any:
    # Only base_url is read; a real ScriptedModel would start an HTTP server.
    return SimpleNamespace(base_url=SCRIPTED_URL)


# choose_backend


def test_auto_picks_anthropic_when_an_api_key_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    assert choose_backend(Config(model="auto")) == "anthropic"


def test_auto_picks_offline_without_an_api_key() -> None:
    assert choose_backend(Config(model="auto")) == "offline"


def test_auto_treats_an_empty_api_key_as_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "")
    assert choose_backend(Config(model="auto")) == "offline"


def test_explicit_offline_wins_over_an_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    assert choose_backend(Config(model="offline")) == "offline"


# cli_environment


def test_offline_blanks_every_anthropic_variable_and_points_at_the_scripted_model(
    monkeypatch: pytest.MonkeyPatch, config: Config
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-real-key")
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", "real-token")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "https://gateway.example")
    monkeypatch.setenv("ANTHROPIC_MODEL", "claude-real")
    monkeypatch.setenv("ANTHROPIC_CUSTOM_HEADERS", "x-team: a")

    env = cli_environment(config, scripted_model())

    assert env["ANTHROPIC_BASE_URL"] == SCRIPTED_URL
    # The key the CLI sends is a placeholder, never the service's real one.
    assert env["ANTHROPIC_API_KEY"] not in ("", "sk-ant-real-key")
    for key in ("ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_MODEL", "ANTHROPIC_CUSTOM_HEADERS"):
        assert env[key] == "", key
    # What the CLI would actually see (the SDK lays env over the service's environment).
    seen = {**os.environ, **env}
    real = {"sk-ant-real-key", "real-token", "https://gateway.example", "claude-real", "x-team: a"}
    assert not real & {v for k, v in seen.items() if k.startswith("ANTHROPIC_")}


def test_offline_without_anthropic_variables_still_points_at_the_scripted_model(config: Config) -> None:
    env = cli_environment(config, scripted_model())
    assert env["ANTHROPIC_BASE_URL"] == SCRIPTED_URL
    assert env["ANTHROPIC_API_KEY"]


def test_anthropic_keeps_the_environment_base_url(monkeypatch: pytest.MonkeyPatch, config: Config) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-real-key")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "https://gateway.example")

    env = cli_environment(config, None)

    assert not any(k.startswith("ANTHROPIC_") and v == "" for k, v in env.items())
    seen = {**os.environ, **env}
    assert seen["ANTHROPIC_BASE_URL"] == "https://gateway.example"
    assert seen["ANTHROPIC_API_KEY"] == "sk-ant-real-key"


@pytest.mark.parametrize("offline", [True, False], ids=["offline", "anthropic"])
def test_cli_gets_its_config_dir_and_home_under_the_state_dir(config: Config, offline: bool) -> None:
    env = cli_environment(config, scripted_model() if offline else None)
    assert env["CLAUDE_CONFIG_DIR"] == str(config.state_dir / "claude")
    assert Path(env["CLAUDE_CONFIG_DIR"]).is_relative_to(config.state_dir)
    assert env["HOME"] == str(config.state_dir / "home")
    assert Path(env["HOME"]).is_relative_to(config.state_dir)


@pytest.mark.parametrize("offline", [True, False], ids=["offline", "anthropic"])
def test_no_otel_variable_of_the_service_reaches_the_cli(
    monkeypatch: pytest.MonkeyPatch, config: Config, offline: bool
) -> None:
    """The service's trace settings are its own: the collector's credentials (headers, client
    key) and where it is must not reach the CLI, nor switch on the CLI's own telemetry."""
    otel = {
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer collector-token",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "x-api-key=collector-key",
        "OTEL_EXPORTER_OTLP_CLIENT_KEY": "/etc/otel/client.key",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector.internal:4317",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_SERVICE_NAME": "agent-rewind",
    }
    for name, value in otel.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-real-key")

    env = cli_environment(config, scripted_model() if offline else None)

    # Present by name and empty: the SDK starts the CLI with the service's environment under it.
    assert {name: env[name] for name in otel} == dict.fromkeys(otel, "")
    assert not [v for v in env.values() if "collector" in v]


def test_extra_env_is_passed_to_the_cli(tmp_path: Path) -> None:
    config = Config(state_dir=tmp_path / "state", extra_env={"FOO": "bar"}).resolved()
    assert cli_environment(config, None)["FOO"] == "bar"


# The model backend: never the scripted model by accident


@pytest.mark.parametrize("variable", server.CREDENTIAL_VARIABLES)
def test_auto_uses_the_real_api_with_any_credential_the_cli_accepts(variable: str) -> None:
    assert server.choose_backend(Config(model="auto"), {variable: "x"}) == "anthropic"


def test_auto_without_a_credential_is_the_scripted_model_and_says_so() -> None:
    assert server.choose_backend(Config(model="auto"), {"ANTHROPIC_BASE_URL": "http://gw"}) == "offline"


def test_anthropic_without_a_credential_refuses_to_start() -> None:
    with pytest.raises(server.StartError) as err:
        server.choose_backend(Config(model="anthropic"), {})
    assert "ANTHROPIC_API_KEY" in str(err.value)
    assert server.choose_backend(Config(model="anthropic"), {"ANTHROPIC_AUTH_TOKEN": "t"}) == "anthropic"
    assert server.choose_backend(Config(model="offline"), {"ANTHROPIC_API_KEY": "k"}) == "offline"


# The client factory


async def test_the_default_factory_gives_each_client_its_sessions_tool_policy(tmp_path: Path) -> None:
    """A session's allowed_tools decide its other tools; its workspace bounds the file tools."""
    from claude_agent_sdk import PermissionResultAllow, PermissionResultDeny, ToolPermissionContext

    from agent_rewind.sessions.adapter import ClientSpec, SdkAgentClient

    workspace = tmp_path / "ws"
    workspace.mkdir()
    factory = default_factory(Config(state_dir=tmp_path / "state").resolved())

    async def ask(options: dict[str, Any], tool: str, tool_input: dict[str, Any]) -> Any:
        spec = ClientSpec("0b7f3c1e-5a8d-4d6e-9f10-2a3b4c5d6e7f", workspace, options, True, {}, False)
        client = factory(spec)
        assert isinstance(client, SdkAgentClient)
        can_use_tool = client._client.options.can_use_tool
        assert can_use_tool is not None
        return await can_use_tool(tool, tool_input, ToolPermissionContext())

    bash = {"allowed_tools": ["Bash"]}
    assert isinstance(await ask(bash, "Bash", {"command": "ls"}), PermissionResultAllow)
    assert isinstance(await ask(bash, "Write", {"file_path": "/etc/passwd"}), PermissionResultDeny)
    assert isinstance(await ask({}, "Bash", {"command": "ls"}), PermissionResultDeny)
    assert isinstance(await ask({}, "Write", {"file_path": str(workspace / "a.txt")}), PermissionResultAllow)


def test_shared_storage_is_refused_without_a_shared_database(tmp_path: Path) -> None:
    with pytest.raises(server.StartError, match="needs --database-url"):
        server.check_replicas(Config(state_dir=tmp_path, shared_storage=True).resolved())
    server.check_replicas(
        Config(state_dir=tmp_path, shared_storage=True, database_url="postgresql://db/x").resolved()
    )


# the files the flags name, checked at start


def _check_files_as(uid: int, config: Config) -> str:
    """check_files_readable's StartError message ("" when none) in a child process running as
    `uid`: root reads every file, so a test run as root drops to another user to meet a file
    that user cannot read, as the image's uid 10001 meets a Secret mounted for root."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.close(read)
            if os.getuid() != uid:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            try:
                check_files_readable(config)
                message = ""
            except server.StartError as err:
                message = str(err)
            except BaseException as err:  # never a silent "" for a check that did not run
                message = f"unexpected {err!r}"
            os.write(write, message.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read().decode()
    os.waitpid(pid, 0)
    return said


@pytest.fixture
def secrets_dir() -> Any:
    # Not under tmp_path, whose parents only root may enter: the other user must reach the files.
    with tempfile.TemporaryDirectory(dir="/tmp") as directory:
        Path(directory).chmod(0o755)
        yield Path(directory)


def test_a_key_the_service_user_cannot_read_is_a_start_error_naming_the_flag_variable_and_uid(
    secrets_dir: Path, tmp_path: Path
) -> None:
    cert, key = secrets_dir / "tls.crt", secrets_dir / "tls.key"
    cert.write_text("cert")
    key.write_text("key")
    cert.chmod(0o644)
    key.chmod(0o644)
    uid = 65534 if os.getuid() == 0 else os.getuid()
    config = Config(state_dir=tmp_path, tls_cert=cert, tls_key=key).resolved()
    assert _check_files_as(uid, config) == ""  # the same files, readable: the user reaches them
    key.chmod(0o600 if os.getuid() == 0 else 0o000)
    assert _check_files_as(uid, config) == (
        f"--tls-key (or AGENT_REWIND_TLS_KEY) {key}: permission denied; the server runs as "
        f"uid {uid}, gid {uid if os.getuid() == 0 else os.getgid()}, which must be able to read it"
    )


def test_a_missing_access_file_and_a_directory_are_start_errors_naming_their_flags(tmp_path: Path) -> None:
    missing = tmp_path / "access.json"
    with pytest.raises(server.StartError) as err:
        check_files_readable(Config(state_dir=tmp_path, access_file=missing).resolved())
    assert str(err.value).startswith(
        f"--access-file (or AGENT_REWIND_ACCESS_FILE) {missing}: no such file or directory; "
        f"the server runs as uid {os.getuid()}"
    )
    with pytest.raises(
        server.StartError, match=r"^--tls-client-ca \(or AGENT_REWIND_TLS_CLIENT_CA\) .*: is a directory;"
    ):
        check_files_readable(Config(state_dir=tmp_path, tls_client_ca=tmp_path).resolved())


async def test_the_start_checks_the_files_before_reading_them(tmp_path: Path) -> None:
    cert = tmp_path / "tls.crt"
    cert.write_text("cert")
    config = Config(
        state_dir=tmp_path / "state", listen="127.0.0.1:0", tls_cert=cert, tls_key=tmp_path / "tls.key"
    ).resolved()
    with pytest.raises(
        server.StartError, match=r"^--tls-key \(or AGENT_REWIND_TLS_KEY\) .*tls\.key: no such file"
    ):
        await server.start(config)
    assert not (tmp_path / "state").exists(), "refused before anything was made"
