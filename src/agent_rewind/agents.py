"""How the agents' Claude Code processes are started, each part opened by one function that puts
its close on the start's exit stack (`made`): their environment, the offline model, the command
sandbox and its egress proxy, the CLI's own confinement, and the factory of their clients.
`components.py` holds the rest of what the server is made of."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil

import structlog

from agent_rewind.config import Config, StartError, service_files
from agent_rewind.sandbox import CommandLimits, CommandSandbox, SandboxUnavailable, environment
from agent_rewind.sandbox.cli import PROGRAMS, CliConfinement, niced
from agent_rewind.sandbox.commands import private_directories, session_dir
from agent_rewind.sandbox.proxy import EgressProxy, HostPattern, HostPatternError, Reached
from agent_rewind.sessions import adapter
from agent_rewind.sessions import options as session_options
from agent_rewind.sessions.adapter import AgentClient, ClientSpec, SdkAgentClient
from agent_rewind.sessions.policy import ToolPolicy
from agent_rewind.sessions.process import ClientFactory
from agent_rewind.testing.scripted_model import ScriptedModel
from agent_rewind.transcript.paths import project_dir

log = structlog.get_logger(__name__)

Made = contextlib.AsyncExitStack


def cli_environment(config: Config, model: ScriptedModel | None) -> dict[str, str]:
    """The environment of every CLI process: an allowlist of the service's (sandbox/environment.py).

    With the offline model, no ANTHROPIC_* variable of the service's environment is passed on,
    so a stray key or gateway can never change where the CLI sends requests.
    """
    return environment.cli_environment(
        os.environ,
        config_dir=str(config.claude_config_dir),
        home=str(config.state_dir / "home"),
        offline_model_url=model.base_url if model is not None else None,
        extra=config.extra_env,
    )


async def open_sandbox(
    made: Made, config: Config, *, reached: Reached | None = None
) -> tuple[CommandSandbox | None, EgressProxy | None]:
    """The command sandbox (and, with allowed hosts, its egress proxy, which tells `reached` of
    every connection it opens), checked to work here."""
    if config.sandbox == "off":
        log.warning(
            "sandbox off (--sandbox off): the agent's commands run unconfined, as the service's "
            "user, with its files and network"
        )
        return None, None
    try:
        patterns = [HostPattern.parse(h) for h in config.sandbox_allow_hosts]
    except HostPatternError as err:
        raise StartError(f"--sandbox-allow-host: {err}", usage=True) from err
    root = config.sessions_dir
    try:
        sandbox = CommandSandbox.find(root, need_socat=bool(patterns), hidden=service_files(config))
        limits = CommandLimits(processes=config.sandbox_max_processes, memory=config.sandbox_max_memory)
        sandbox = dataclasses.replace(sandbox, limits=limits)
        await asyncio.to_thread(sandbox.probe)
    except SandboxUnavailable as err:
        raise StartError(str(err), usage=True) from err
    if not patterns:
        log.info("sandbox on: commands confined, no network")
        return sandbox, None
    proxy = EgressProxy(config.state_dir / "proxy.sock", patterns, reached=reached)
    made.push_async_callback(proxy.close)
    await proxy.start()
    log.info(
        "sandbox on: commands confined, network only to the allowed hosts", hosts=[str(p) for p in patterns]
    )
    return dataclasses.replace(sandbox, proxy_socket=proxy.socket_path), proxy


async def open_cli_confinement(config: Config) -> CliConfinement | None:
    """The CLI process's own confinement (sandbox/cli.py), checked to work here."""
    if config.cli_confinement == "off":
        log.warning(
            "cli confinement off (--cli-confinement off): the CLI's file tools are confined by the "
            "service's checks alone, which a command racing them can pass"
        )
        return None
    root = config.sessions_dir
    try:
        confinement = CliConfinement.find(
            root,
            config.claude_config_dir,
            adapter.cli_binary(),
            hidden=service_files(config),
            nice=config.cli_nice,
        )
        probe = root / "probe-cli-check"
        workspace, outside = probe / "workspace", probe / "outside"
        workspace.mkdir(parents=True, exist_ok=True)
        outside.write_text("not for the CLI\n")
        try:
            await asyncio.to_thread(confinement.probe, workspace, outside)
        finally:
            shutil.rmtree(probe, ignore_errors=True)
            shutil.rmtree(root / "probe-cli", ignore_errors=True)
    except SandboxUnavailable as err:
        raise StartError(str(err), usage=True) from err
    log.info("cli confined", confinement="landlock", abi=confinement.abi)
    return confinement


def start_model(made: Made, backend: str) -> ScriptedModel | None:
    """The offline scripted model, when it is the backend."""
    if backend != "offline":
        log.info("model backend", backend=backend)
        return None
    model = ScriptedModel().start()
    made.callback(model.stop)
    log.warning(
        "model backend: the offline SCRIPTED model, not Claude; for the real API pass --model anthropic"
        " with a credential",
        scripted_model=model.base_url,
    )
    return model


def default_factory(
    config: Config,
    sandbox: CommandSandbox | None = None,
    proxy: EgressProxy | None = None,
    cli: CliConfinement | None = None,
) -> ClientFactory:
    def make(spec: ClientSpec) -> AgentClient:
        policy = ToolPolicy(spec.cwd, spec.options.get("allowed_tools") or ())
        if proxy is not None:
            proxy.narrow(spec.session_id, session_options.sandbox_hosts(spec.options))
        base = session_dir(config.sessions_dir, spec.session_id)
        # Its own temporary, scratch and runtime directories (erased with it), and with the
        # sandbox on, the program that confines its commands (where a confined CLI cannot write).
        own = (
            sandbox.prepare(
                spec.session_id,
                spec.cwd,
                proxy=proxy is not None,
                proxy_url=proxy.url(spec.session_id) if proxy is not None else "",
                programs=base / PROGRAMS if cli is not None else None,
            )
            if sandbox is not None
            else private_directories(base)
        )
        env = {**spec.env, **own.environment()}
        if cli is not None:
            transcripts = project_dir(config.claude_config_dir, str(spec.cwd), spec.session_id)
            confined = cli.prepare(spec.session_id, spec.cwd, own, transcript_dir=transcripts, base=base)
            env.update(confined.env)
            spec = dataclasses.replace(spec, cli_path=confined.path)
        elif config.cli_nice:
            binary = spec.cli_path or adapter.cli_binary()
            spec = dataclasses.replace(spec, cli_path=niced(base, binary, config.cli_nice))
        spec = dataclasses.replace(spec, env=env)
        return SdkAgentClient(spec, policy, connect_timeout=config.connect_timeout)

    return make
