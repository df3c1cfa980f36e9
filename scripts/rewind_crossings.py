"""How often one `Rewind` call crosses between `rewind/` and `sessions/` (issue 38's measure of
whether a rewind stays in its room).

Starts the real server in this process (the integration harness's), runs three turns through the
real CLI against the scripted model, with workspace snapshots, then profiles one BOTH rewind: every call whose caller's
package differs from its callee's, among `agent_rewind.rewind` and `agent_rewind.sessions`, is
counted, once per call (a coroutine resumed is not a new call), with the pair of functions.

    .venv/bin/python scripts/rewind_crossings.py
"""

from __future__ import annotations

import asyncio
import collections
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.integration.harness import BOTH, prompt_id, serve  # noqa: E402

ROOMS = ("agent_rewind.rewind", "agent_rewind.sessions")
_PROLOGUE = 8


def _room(frame: FrameType) -> str | None:
    name = frame.f_globals.get("__name__", "")
    for room in ROOMS:
        if name == room or name.startswith(room + "."):
            return room
    return None


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with serve(Path(tmp), workspace_snapshots=True) as c:
            session = await c.create()
            sid = session.session_id
            ids = []
            for n in range(3):
                ids.append(prompt_id(await c.prompt(sid, f"write f{n}.txt v{n}\nsay made {n}")))
            crossings: collections.Counter[tuple[str, str]] = collections.Counter()
            entries: collections.Counter[str] = collections.Counter()

            def profile(frame: FrameType, event: str, arg: Any) -> None:
                # A coroutine resumed is a call event too, at the instruction it stopped at; a new
                # frame starts within its prologue.
                if event != "call" or frame.f_lasti > _PROLOGUE:
                    return
                callee = _room(frame)
                # The nearest caller of ours (past contextlib's and asyncio's frames).
                caller_frame = frame.f_back
                while caller_frame is not None and not caller_frame.f_globals.get("__name__", "").startswith(
                    "agent_rewind."
                ):
                    caller_frame = caller_frame.f_back
                caller = _room(caller_frame) if caller_frame is not None else None
                if callee is None:
                    return
                into_engine = callee == "agent_rewind.rewind" and frame.f_code.co_filename.endswith(
                    "engine.py"
                )
                if into_engine and (
                    caller_frame is None or not caller_frame.f_code.co_filename.endswith("engine.py")
                ):
                    entries["engine"] += 1
                if caller_frame is not None and caller is not None and caller != callee:
                    crossings[
                        (
                            f"{caller_frame.f_globals['__name__']}.{caller_frame.f_code.co_name}",
                            f"{frame.f_globals['__name__']}.{frame.f_code.co_name}",
                        )
                    ] += 1

            sys.setprofile(profile)
            threading.setprofile(profile)
            try:
                await c.rewind(sid, ids[1], BOTH)
            finally:
                sys.setprofile(None)
                threading.setprofile(None)
    total = sum(crossings.values())
    print(
        f"one Rewind (BOTH): {total} calls between rewind/ and sessions/; rewind/engine.py entered {entries['engine']} times"
    )
    for (caller, callee), n in sorted(crossings.items()):
        print(f"  {n} x {caller} -> {callee}")


if __name__ == "__main__":
    asyncio.run(main())
