"""The deadline wheel that keeps attempts' long time-to-first-output limits
(``core/pools/resilience.py``): a deadline cancels the task that armed it and is told apart
from anyone else's cancellation; a disarmed one never fires; and through a real gateway a
hung engine call under a limit of 5 s (the wheel's range) is answered 504 ``ttft_timeout``."""

from __future__ import annotations

import asyncio

import openai
import pytest

from shuniu.core.pools.resilience import COARSE_FROM_S, DeadlineWheel


async def _guarded(wheel: DeadlineWheel, when: float, gate: asyncio.Event) -> str:
    """Waits for ``gate`` under a deadline, as an attempt waits for its first output."""
    deadline = wheel.arm(when)
    try:
        await gate.wait()
    except asyncio.CancelledError:
        if wheel.expired(deadline):
            return "timed out"
        raise
    finally:
        wheel.disarm(deadline)
    return "answered"


async def test_a_deadline_cancels_its_task_and_the_cancellation_is_taken_back() -> None:
    loop = asyncio.get_running_loop()
    wheel = DeadlineWheel(loop, tick_s=0.01)
    task = asyncio.create_task(_guarded(wheel, loop.time() + 0.02, asyncio.Event()))
    assert await task == "timed out"
    assert task.cancelling() == 0  # nothing left pending for the code after it
    assert not wheel.wheel.buckets


async def test_a_disarmed_deadline_never_fires() -> None:
    loop = asyncio.get_running_loop()
    wheel = DeadlineWheel(loop, tick_s=0.01)

    async def body() -> str:
        deadline = wheel.arm(loop.time() - 1)  # already due: the next sweep would fire it
        wheel.disarm(deadline)
        wheel.wheel._sweep()
        await asyncio.sleep(0)  # a cancellation, had there been one, would land here
        return "ran on"

    task = asyncio.create_task(body())
    assert await task == "ran on"
    assert task.cancelling() == 0 and not wheel.wheel.buckets and wheel.wheel.handle is None


async def test_someone_elses_cancellation_is_not_taken_for_the_deadline() -> None:
    loop = asyncio.get_running_loop()
    wheel = DeadlineWheel(loop, tick_s=0.01)
    # Cancelled by its caller (a client that left) before the deadline: a CancelledError.
    task = asyncio.create_task(_guarded(wheel, loop.time() + 60, asyncio.Event()))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # Both at once: the deadline fires and the caller cancels before the task runs again.
    task = asyncio.create_task(_guarded(wheel, loop.time() - 1, asyncio.Event()))
    await asyncio.sleep(0)
    wheel.wheel._sweep()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not wheel.wheel.buckets


def test_a_hung_engine_under_a_long_ttft_limit_gets_504_ttft_timeout(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(
        f"""
models:
  chat:
    timeouts: {{ttft_s: {COARSE_FROM_S}}}
    retries: {{max_retries: 0}}
    outlier: {{consecutive_failures: null, failure_rate: null}}
    endpoints:
      - kind: sim
        name: stuck
        options: {{ttft_ms: 5, tokens_per_s: 2000, faults: {{hang_after_requests: 0}}}}
"""
    )
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=60)
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
    assert caught.value.status_code == 504
    assert caught.value.body["code"] == "ttft_timeout"  # type: ignore[index]
