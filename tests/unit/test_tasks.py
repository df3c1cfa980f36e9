"""agent_rewind.tasks: detached work finishes whatever its caller does, and shutdown waits for it."""

from __future__ import annotations

import asyncio
import gc

import pytest

from agent_rewind import tasks


async def test_a_cancelled_caller_does_not_stop_the_work_it_started() -> None:
    started, release = asyncio.Event(), asyncio.Event()
    finished: list[str] = []

    async def work() -> str:
        started.set()
        await release.wait()
        finished.append("done")
        return "done"

    caller = asyncio.create_task(tasks.shielded(work(), name="work"))
    await started.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert [task.get_name() for task in tasks.pending()] == ["work"]
    release.set()
    assert await tasks.drain(5) == []
    assert finished == ["done"]


async def test_the_caller_gets_the_result_or_the_error_of_the_work() -> None:
    async def answer() -> int:
        return 42

    async def fail() -> None:
        raise ValueError("no")

    assert await tasks.shielded(answer(), name="answer") == 42
    with pytest.raises(ValueError, match="no"):
        await tasks.shielded(fail(), name="fail")


async def test_a_detached_task_is_held_until_it_ends_though_no_caller_keeps_it() -> None:
    release = asyncio.Event()
    finished: list[bool] = []

    async def work() -> None:
        await release.wait()
        finished.append(True)

    tasks.detach(work(), name="held")
    gc.collect()
    assert [task.get_name() for task in tasks.pending()] == ["held"]
    release.set()
    await tasks.drain(5)
    assert finished == [True]
    assert tasks.pending() == []


async def test_drain_waits_for_work_detached_while_it_waits() -> None:
    order: list[str] = []

    async def second() -> None:
        await asyncio.sleep(0)
        order.append("second")

    async def first() -> None:
        await asyncio.sleep(0)
        tasks.detach(second(), name="second")
        order.append("first")

    tasks.detach(first(), name="first")
    assert await tasks.drain(5) == []
    assert order == ["first", "second"]


async def test_drain_gives_back_what_is_still_running_at_its_timeout() -> None:
    never = asyncio.Event()
    stuck = tasks.detach(never.wait(), name="stuck")
    assert await tasks.drain(0.01) == [stuck]
    stuck.cancel()
    await asyncio.gather(stuck, return_exceptions=True)


async def test_drain_collects_a_failure_nobody_awaited() -> None:
    async def fail() -> None:
        raise RuntimeError("unseen")

    task = tasks.detach(fail(), name="fail")
    assert await tasks.drain(5) == []
    assert task.done() and isinstance(task.exception(), RuntimeError)
