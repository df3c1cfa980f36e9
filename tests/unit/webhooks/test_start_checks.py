"""What `serve` checks of its webhook flags before it opens anything: each mistake is a usage
error (exit 2) that says what is wrong, and never shows a key or a URL's query."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agent_rewind.config import parse_args
from agent_rewind.server import run
from agent_rewind.webhooks.secrets import new_key

URL = "https://hooks.example/in?token=s3cret"


def _serve(tmp_path: Path, *flags: str) -> list[str]:
    return ["--state-dir", str(tmp_path / "state"), "--listen", "127.0.0.1:0", "--model", "offline", *flags]


def _keys(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "keys"
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("no secret file", "--webhook-url needs --webhook-secret-file"),
        ("a bad line", "line 2: a key starts with 'whsec_'"),
        ("open to others", "other users may read or write it"),
        ("not a URL", "needs an http:// or https:// URL"),
        ("a principal of no URL", "that URL is not a --webhook-url"),
    ],
)
def test_a_bad_webhook_flag_stops_the_start_with_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, says: str
) -> None:
    secret = "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3JldA"
    flags = {
        "no secret file": lambda: ["--webhook-url", URL],
        "a bad line": lambda: [
            "--webhook-url",
            URL,
            "--webhook-secret-file",
            str(_keys(tmp_path, f"{new_key()}\n{secret}\n")),
        ],
        "open to others": lambda: [
            "--webhook-url",
            URL,
            "--webhook-secret-file",
            str(_keys(tmp_path, new_key() + "\n", 0o604)),
        ],
        "not a URL": lambda: ["--webhook-url", "ftp://hooks.example/?token=s3cret"],
        "a principal of no URL": lambda: [
            "--webhook-url",
            URL,
            "--webhook-principal",
            "alice=https://elsewhere/?token=s3cret",
        ],
    }[case]()
    assert run(parse_args(_serve(tmp_path, *flags))) == 2
    said = capsys.readouterr().err
    assert says in said
    assert secret not in said and "s3cret" not in said
    assert not (tmp_path / "state" / "ledger.sqlite3").exists(), "checked before anything is opened"


def test_urls_and_principals_come_from_the_environment_separated_by_spaces(tmp_path: Path) -> None:
    env = {
        "AGENT_REWIND_WEBHOOK_URLS": "https://a.example/x?y=1,2 http://127.0.0.1:9/b",
        "AGENT_REWIND_WEBHOOK_PRINCIPALS": "alice=http://127.0.0.1:9/b",
        "AGENT_REWIND_WEBHOOK_MAX_ATTEMPTS": "3",
        "AGENT_REWIND_WEBHOOK_TIMEOUT": "2.5",
    }
    config = parse_args(_serve(tmp_path), environ=env)
    assert config.webhook_urls == ("https://a.example/x?y=1,2", "http://127.0.0.1:9/b")
    assert config.webhook_principals == ("alice=http://127.0.0.1:9/b",)
    assert (config.webhook_max_attempts, config.webhook_timeout) == (3, 2.5)
    with pytest.raises(SystemExit):
        parse_args(_serve(tmp_path, "--webhook-timeout", "0"))


def test_a_principal_the_access_file_lacks_is_warned_of_at_start(tmp_path: Path) -> None:
    import json

    from structlog.testing import capture_logs

    from agent_rewind import components
    from agent_rewind.access import AccessFile
    from agent_rewind.config import Config
    from agent_rewind.rpc.convert import rewind_event_json
    from agent_rewind.webhooks import Subscription

    access_path = tmp_path / "access.json"
    access_path.write_text(json.dumps({"principals": [{"name": "alice", "permissions": ["events.read"]}]}))
    config = Config(state_dir=tmp_path).resolved()
    subscriptions = [Subscription("http://127.0.0.1:9/a", "alice"), Subscription(URL, "ghost")]
    with capture_logs() as logged:
        components.make_webhooks(
            config,
            None,
            subscriptions,
            [new_key()],
            rewind_event_json,
            AccessFile(access_path),  # type: ignore[arg-type]
        )
    warned = [e for e in logged if e["log_level"] == "warning"]
    assert [(e["principal"], e["webhook"]) for e in warned] == [("ghost", "https://hooks.example/in")]
    # alice has no token: a principal that only receives webhooks needs none.
    from datetime import UTC, datetime

    from agent_rewind.store.ledger import EventRecord
    from agent_rewind.webhooks.subscriptions import visibility

    visible = visibility(subscriptions[0], AccessFile(access_path))
    events = [
        EventRecord(1, "REWOUND", "s", "r", owner, datetime.now(UTC), {"owner": owner})
        for owner in ("alice", "bob")
    ]
    assert [visible(e) for e in events] == [True, False]


def test_a_server_without_webhooks_never_loads_the_http_client() -> None:
    """aiohttp is about half a second of a start: it is imported only where a URL is served."""
    code = "import sys, agent_rewind.server, agent_rewind.webhooks; print('aiohttp' in sys.modules)"
    said = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert said.stdout.strip() == "False"
