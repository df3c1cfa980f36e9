"""The agent's next turn after the service restored files itself: real server, real Claude Code
processes, the scripted model.

A files rewind served by workspace snapshots (and a revert of one turn, which writes files the
same way) changes files under the live CLI without asking it. The CLI holds the state of every
file it read or wrote, and its Edit refuses a file changed since then ("File has been modified
since read..."). Measured with CLI 2.1.332: it need not, because before each prompt the CLI
checks the files it holds against the disk, tells the model of each one changed ("... changed on
disk since you last read it ...", with the current lines) and holds them as they now are. So the
service needs to do nothing, and must keep it that way: its writes must leave a newer mtime (a
restore that put back the old one would go unnoticed, the model still believing the edited
content), and it must not replace the live process after a restore (a resumed CLI rebuilds its
state from the transcript and says nothing of the change; its Edit still works on the file as
it is).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent_rewind.api.v1 import rewind_pb2, session_pb2, session_service_pb2
from tests.integration.harness import FILES, Client, prompt_id, read, serve

_STALE_STATE = ("has been modified since read", "has not been read yet")


def _edit(path: Path, old: str, new: str) -> str:
    """A scripted Edit with no Read before it (the `edit` verb always reads first)."""
    return "tool Edit " + json.dumps({"file_path": str(path), "old_string": old, "new_string": new})


def _tool_results(events: list[session_pb2.TurnEvent]) -> list[session_pb2.ToolResult]:
    return [e.tool_result for e in events if e.HasField("tool_result")]


async def _edited_then_restored(c: Client) -> tuple[str, Path]:
    """A session whose agent wrote f.txt, then edited it in a second turn, and whose files were
    then rewound from the snapshots to the second prompt: the live CLI holds f.txt as its edit
    left it, the disk has it as it was before."""
    session = await c.create()
    sid, f = session.session_id, Path(session.cwd) / "f.txt"
    await c.prompt(sid, "write f.txt alpha one")
    second = prompt_id(await c.prompt(sid, _edit(f, "one", "two")))
    assert read(f) == "alpha two\n"
    result = await c.rewind(sid, second, FILES)
    assert result.files.source == rewind_pb2.FILES_SOURCE_SNAPSHOT, "the service wrote it, not the CLI"
    assert read(f) == "alpha one\n"
    return sid, f


async def _edits_after_restore(c: Client, sid: str, f: Path) -> None:
    """The next turn edits f.txt with no Read: an edit of what the agent last saw fails because
    that text is gone, not for stale state; an edit of the content as it is now works."""
    results = _tool_results(await c.prompt(sid, f"{_edit(f, 'two', 'gone')}\n{_edit(f, 'one', 'three')}"))
    assert len(results) == 2, results
    stale, current = results
    assert stale.is_error and "String to replace not found" in stale.content, stale
    assert not any(words in stale.content for words in _STALE_STATE), stale
    assert not current.is_error, current
    assert read(f) == "alpha three\n"


def _texts(request: dict[str, Any]) -> list[str]:
    texts = []
    for message in request.get("messages") or []:
        content = message.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        texts += [str(b.get("text")) for b in blocks if isinstance(b, dict) and b.get("type") == "text"]
    return texts


async def test_the_next_turn_is_told_of_a_restored_file_and_edits_it_as_it_is(tmp_path: Path) -> None:
    async with serve(tmp_path, workspace_snapshots=True) as c:
        assert c.running is not None and c.running.model is not None
        model = c.running.model.record()
        sid, f = await _edited_then_restored(c)
        before = len(model.requests)
        await _edits_after_restore(c, sid, f)
        # Not misled: the CLI put the file as it now is before the model, and the model
        # edited it without a Read. A text naming f.txt with its restored line, that is not the
        # prompt (which names it without that line), is the CLI's note.
        told = [t for r in model.requests[before:] for t in _texts(r) if str(f) in t and "alpha one" in t]
        assert told, "the model was never shown f.txt as the restore left it"


async def test_a_resumed_process_edits_a_restored_file_as_it_is(tmp_path: Path) -> None:
    async with serve(tmp_path, workspace_snapshots=True) as c:
        sid, f = await _edited_then_restored(c)
        # Hibernated after the restore: the next prompt resumes a new CLI from the transcript.
        await c.sessions.CloseSession(session_service_pb2.CloseSessionRequest(session_id=sid))
        await _edits_after_restore(c, sid, f)
