"""A prefill/decode split (disaggregated serving) as one simulated endpoint.

Serving stacks such as llm-d and vLLM's disaggregated prefill run prompts and generation on
different engines: a request is prefilled on a prefill engine (as a one-token request), its
KV cache is sent to a decode engine over the network (vLLM's NIXL connector pulls it), and
the decode engine generates the answer, starting from the transferred KV. Long prompts then
never stall the decode engines' iterations (ITL), at the cost of the transfer and of two
pools to size.

:class:`DisaggregatedEngine` is such a unit: ``prefill`` and ``decode`` are ordinary
:class:`~shuniu.backends.sim.engine.SimEngine` objects with their own queues, batches and
prefix caches. The caller's sequence runs on a decode engine; a companion sequence of one
output token runs on a prefill engine first. The decode engine admits the sequence with its
prompt's KV present (``Seq.external_tokens``: all but the last token, which it computes to
produce the first output), so the TTFT a client sees is prefill queue + prefill + transfer
+ the decode engine's admission and first iteration. The unit presents the engine interface
the ``sim`` backend and ``shuniu simulate`` use (``submit``, ``abort``, ``load``, ...).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from shuniu.backends.sim.engine import FINISHED, EngineCore, Seq, SimEngine
from shuniu.core.kv_events.wire import EventBatch
from shuniu.core.types import EndpointLoad

__all__ = ["DisaggregatedEngine"]


class _Handoff:
    """One request between its prefill and its decode."""

    __slots__ = ("decode", "prefill", "prefill_engine", "timer")

    def __init__(self, prefill: Seq, engine: SimEngine) -> None:
        self.prefill = prefill
        self.prefill_engine = engine
        self.timer: asyncio.TimerHandle | None = None
        """The KV transfer in flight."""
        self.decode: SimEngine | None = None
        """The decode engine, once the sequence is there."""


class DisaggregatedEngine:
    """``prefill`` and ``decode`` engines behind one endpoint. ``transfer_s`` gives the
    seconds a prompt's KV of that many tokens takes to reach a decode engine."""

    def __init__(
        self, prefill: list[SimEngine], decode: list[SimEngine], transfer_s: Callable[[int], float]
    ) -> None:
        if not prefill or not decode:
            raise ValueError("a prefill/decode split needs at least one engine of each")
        self.prefill = prefill
        self.decode = decode
        self.transfer_s = transfer_s
        self._handoffs: dict[Seq, _Handoff] = {}
        self.transfers = 0
        """KV transfers completed."""
        self.transfer_time = 0.0
        """Seconds of KV transfer, summed over requests."""

    # -- what the sim backend and shuniu simulate read ------------------------------------

    @property
    def engines(self) -> list[SimEngine]:
        return [*self.prefill, *self.decode]

    @property
    def failure(self) -> BaseException | None:
        """The first of its engines' :attr:`SimEngine.failure`."""
        for engine in self.engines:
            failure = engine.failure
            if failure is not None:
                return failure
        return None

    @property
    def cores(self) -> list[EngineCore]:
        """Every engine's core (preemptions, KV block size)."""
        return [e.core for e in self.engines]

    @property
    def prompt_cores(self) -> list[EngineCore]:
        """The cores that compute prompts: prefix-cache statistics and prompt tokens."""
        return [e.core for e in self.prefill]

    @property
    def output_cores(self) -> list[EngineCore]:
        """The cores whose tokens reach the client: generated tokens, completions, ITL."""
        return [e.core for e in self.decode]

    @property
    def core(self) -> EngineCore:
        """The first prefill engine's core: its configuration is every engine's."""
        return self.prefill[0].core

    @property
    def leap_steps(self) -> int:
        return self.decode[0].leap_steps

    @leap_steps.setter
    def leap_steps(self, steps: int) -> None:
        for engine in self.engines:
            engine.leap_steps = steps

    @property
    def busy_time(self) -> float:
        """Busy seconds per engine (the mean: a share of the unit's time)."""
        engines = self.engines
        return sum(e.busy_time for e in engines) / len(engines)

    def publish_kv_events(self, publish: Callable[[EventBatch], None]) -> None:
        """The prefill engines' KV events (where a request's prefix is looked up)."""
        for engine in self.prefill:
            engine.publish_kv_events(publish)

    def load(self) -> EndpointLoad:
        """The unit's load: requests running and waiting on every engine (and in transfer),
        the mean KV usage, and the prefill engines' prefix-cache counters."""
        loads = [e.load() for e in self.engines]
        prefill = loads[: len(self.prefill)]
        usage = [x.kv_usage for x in loads if x.kv_usage is not None]
        in_transfer = sum(1 for h in self._handoffs.values() if h.timer is not None)
        return EndpointLoad(
            running=sum(x.running for x in loads),
            waiting=sum(x.waiting for x in loads) + in_transfer,
            kv_usage=sum(usage) / len(usage) if usage else None,
            prefix_queries=sum(x.prefix_queries or 0 for x in prefill),
            prefix_hits=sum(x.prefix_hits or 0 for x in prefill),
            generated_tokens=sum(x.generated_tokens or 0 for x in loads[len(self.prefill) :]),
            aborted=sum(x.aborted or 0 for x in loads),
        )

    # -- a request's way through the unit -------------------------------------------------

    def submit(self, seq: Seq) -> None:
        """Prefill ``seq``'s prompt on a prefill engine, then decode it on a decode engine.
        Raises ``ValueError`` when the prompt can never fit an engine's KV cache."""
        loop = asyncio.get_running_loop()
        engine = self._prefill_engine(seq)
        # The same output seed: the first output token (and any block hashed across it) is
        # the same on both engines, so the two may share one hash chain.
        first = Seq(
            f"{seq.id}/prefill",
            seq.prompt,
            1,
            output_seed=seq.output_seed,
            priority=seq.priority,
            arrival=seq.arrival,
        )
        first.hashes = seq.hashes
        first.done = loop.create_future()
        engine.submit(first)
        handoff = self._handoffs[seq] = _Handoff(first, engine)
        first.done.add_done_callback(lambda _: self._prefilled(seq, handoff))
        if seq.done is None:
            seq.done = loop.create_future()  # to forget the request when it ends
        seq.done.add_done_callback(lambda _: self._forget(seq, handoff))

    def _forget(self, seq: Seq, handoff: _Handoff) -> None:
        if self._handoffs.get(seq) is handoff:
            del self._handoffs[seq]

    def _prefill_engine(self, seq: Seq) -> SimEngine:
        """The prefill engine with the most of the prompt cached, then the least work queued."""
        engines = self.prefill
        if len(engines) == 1:
            return engines[0]
        best, key = engines[0], (-1, 0)
        for engine in engines:
            core = engine.core
            cached = core.cached_prefix(seq) if core.config.prefix_caching else 0
            candidate = (cached, -(len(core.running) + core.num_waiting))
            if candidate > key:
                best, key = engine, candidate
        return best

    def _prefilled(self, seq: Seq, handoff: _Handoff) -> None:
        first = handoff.prefill
        if self._handoffs.get(seq) is not handoff:
            return  # aborted meanwhile
        if first.output_count == 0:  # the prefill engine dropped it (a crash): so does the unit
            del self._handoffs[seq]
            seq.status = FINISHED
            _finish(seq)
            return
        if seq.cached_tokens is None:
            seq.cached_tokens = first.cached_tokens
        delay = self.transfer_s(seq.prompt_len)
        self.transfer_time += delay
        handoff.timer = asyncio.get_running_loop().call_later(delay, self._transferred, seq, handoff)

    def _transferred(self, seq: Seq, handoff: _Handoff) -> None:
        handoff.timer = None
        self.transfers += 1
        if self._handoffs.get(seq) is not handoff:
            return
        # The decode engine computes the prompt's last token itself (its logits give the
        # first output); the rest of the KV arrived.
        seq.external_tokens = seq.prompt_len - 1
        engine = min(self.decode, key=lambda e: len(e.core.running) + e.core.num_waiting)
        handoff.decode = engine
        try:
            engine.submit(seq)
        except ValueError:  # cannot happen with engines alike; never leave the client waiting
            del self._handoffs[seq]
            seq.status = FINISHED
            _finish(seq)

    def phase(self, seq: Seq) -> str | None:
        """Where ``seq`` is in the unit: ``prefill``, ``transfer`` or ``decode``; ``None``
        once it has left (or before it came)."""
        handoff = self._handoffs.get(seq)
        if handoff is None:
            return None
        if handoff.decode is not None:
            return "decode"
        return "transfer" if handoff.timer is not None else "prefill"

    def abort(self, seq: Seq, *, aborted: bool = True) -> None:
        """Stop ``seq`` wherever it is: its prefill, its transfer or its decode."""
        handoff = self._handoffs.pop(seq, None)
        if handoff is None:
            return
        if handoff.decode is not None:
            handoff.decode.abort(seq, aborted=aborted)
            return
        if handoff.timer is not None:
            handoff.timer.cancel()
        else:
            handoff.prefill_engine.abort(handoff.prefill, aborted=aborted)
        seq.status = FINISHED
        _finish(seq)

    def abort_all(self) -> None:
        for seq in list(self._handoffs):
            self.abort(seq)
        for engine in self.engines:
            engine.abort_all()

    async def stop(self) -> None:
        for handoff in self._handoffs.values():
            if handoff.timer is not None:
                handoff.timer.cancel()
        self._handoffs.clear()
        for engine in self.engines:
            await engine.stop()


def _finish(seq: Seq) -> None:
    """Wake whoever waits on a sequence the unit dropped."""
    for fut in (seq.waiter, seq.done):
        if fut is not None and not fut.done():
            fut.set_result(None)
    seq.waiter = None
