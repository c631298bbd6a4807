"""The running event loop, without a system call per look-up.

On Python 3.11, ``asyncio.get_running_loop()`` (and so ``asyncio.current_task()`` without a
loop) calls ``getpid()`` every time, to notice a loop inherited through ``fork``: a system
call, about 0.5 µs on the virtual machines the gateway is measured on, and the request path
asked six times per request. :func:`running_loop` answers the same: the loop it found last
in this thread, while that loop is still running (a thread runs one loop at a time, so a
running loop that this thread found is the one running here), forgotten in a forked child.
Python 3.12 and later keep the running loop in the thread's state without the check:
there it is ``asyncio.get_running_loop`` itself.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Callable

__all__ = ["running_loop"]


_found = threading.local()
"""``loop``: the loop this thread found last (absent until it found one)."""


def _forget() -> None:
    _found.__dict__.pop("loop", None)


def _running_loop() -> asyncio.AbstractEventLoop:
    """``asyncio.get_running_loop()``: the loop running in this thread (``RuntimeError``
    when none is)."""
    try:
        loop: asyncio.AbstractEventLoop = _found.loop
        if loop.is_running():
            return loop
    except AttributeError:  # this thread's first look-up
        pass
    loop = _found.loop = asyncio.get_running_loop()
    return loop


running_loop: Callable[[], asyncio.AbstractEventLoop]
if sys.version_info >= (3, 12):
    running_loop = asyncio.get_running_loop
else:
    running_loop = _running_loop
    # A forked child's loop (if it runs one) is its own: never the parent's, still marked
    # running in the copy of its memory.
    os.register_at_fork(after_in_child=_forget)
