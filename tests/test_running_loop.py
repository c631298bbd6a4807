"""``core/running_loop.py``: the loop ``asyncio.get_running_loop()`` would answer, in every
case it has to tell apart (a new loop in the same thread, another thread, no loop, a
forked child), without asking it again while the loop it found still runs."""

from __future__ import annotations

import asyncio
import os
import sys
import threading

import pytest

from shuniu.core import running_loop as module
from shuniu.core.running_loop import running_loop


def test_it_is_the_running_loop_of_each_new_loop_and_none_outside() -> None:
    async def which() -> tuple[asyncio.AbstractEventLoop, asyncio.AbstractEventLoop]:
        return running_loop(), asyncio.get_running_loop()

    for _ in range(3):  # one loop after another in this thread: never the last one's
        found, truth = asyncio.run(which())
        assert found is truth
    with pytest.raises(RuntimeError):
        running_loop()


def test_each_thread_gets_its_own_loop() -> None:
    seen: dict[str, bool] = {}
    started = threading.Event()
    stop = threading.Event()

    async def hold() -> None:
        seen["other"] = running_loop() is asyncio.get_running_loop()
        started.set()
        await asyncio.to_thread(stop.wait, 30)  # its loop runs on while this thread runs one

    other = threading.Thread(target=asyncio.run, args=(hold(),))
    other.start()
    assert started.wait(30)

    async def here() -> bool:
        return running_loop() is asyncio.get_running_loop()

    try:
        seen["here"] = asyncio.run(here())
    finally:
        stop.set()
        other.join(30)
    assert seen == {"other": True, "here": True}


@pytest.mark.skipif(sys.version_info >= (3, 12) or not hasattr(os, "fork"), reason="3.11's cache only")
def test_a_forked_child_forgets_the_parents_loop() -> None:
    async def fork() -> int:
        assert running_loop() is asyncio.get_running_loop()
        pid = os.fork()
        if pid == 0:  # the child: the copy of the parent's loop still says it runs
            code = 0 if getattr(module._found, "loop", None) is None else 3
            os._exit(code)
        return pid

    child = asyncio.run(fork())
    assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0
