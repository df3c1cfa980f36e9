"""`agent-rewind webhooks`: each URL's cursor, lag, holder and failures, read from the ledger."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest

from agent_rewind.cli import main
from agent_rewind.store.ledger import NewEvent, NewSession, WebhookFailure, now
from agent_rewind.store.sqlite import SqliteLedger

URL = "https://hooks.example/in?token=s3cret"


async def _ledger_with_a_failure(state: Path) -> None:
    ledger = await SqliteLedger.open(state / "ledger.sqlite3")
    try:
        lease = await ledger.claim_webhook(URL, "pod-0", 30)
        assert lease is not None
        for _ in range(3):
            sid = str(uuid.uuid4())
            await ledger.add_session(NewSession(sid, "/ws", {}, True))
            await ledger.erase_session(sid, NewEvent("SESSION_DELETED", sid))
        assert await ledger.advance_webhook(lease, 1, delivered=1)
        assert await ledger.advance_webhook(lease, 2, failure=WebhookFailure(URL, 2, 8, "HTTP 503", now()))
    finally:
        await ledger.close()


def test_it_lists_each_url_with_its_cursor_lag_and_failures_never_its_query(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(_ledger_with_a_failure(tmp_path))
    assert main(["webhooks", "--state-dir", str(tmp_path), "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["webhooks"]
    assert {k: row[k] for k in ("url", "cursor", "lag", "holder", "held", "delivered", "failed")} == {
        "url": "https://hooks.example/in",
        "cursor": 2,
        "lag": 1,
        "holder": "pod-0",
        "held": True,
        "delivered": 1,
        "failed": 1,
    }
    assert (row["last_error"], row["recent_failures"]) == ("HTTP 503", [2])
    assert main(["webhooks", "--state-dir", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "cursor 2, lag 1, delivered 1, failed 1 (newest: 2; last error: HTTP 503)" in text
    assert "held by pod-0 (delivering)" in text and "s3cret" not in text


def test_no_ledger_there_is_a_usage_error_and_none_is_made(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["webhooks", "--state-dir", str(tmp_path / "nowhere")])
    assert exited.value.code == 2
    assert not (tmp_path / "nowhere").exists()
