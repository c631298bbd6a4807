"""The simulated engine: vLLM-style continuous batching over a paged, prefix-cached KV cache.

Why this file is long: the engine core (scheduling, KV bookkeeping, committing iterations) and
its driver share the sequence and batch state and their hot loops, and the decode leaps are
half in each (the core plans and commits them, the driver times, cuts and syncs them); split,
every hot loop would reach across modules for the same private state.

:class:`EngineCore` is synchronous and knows nothing about time: :meth:`EngineCore.schedule`
plans one iteration (which sequences run, how many tokens each), a cost model turns the plan
into a duration, and :meth:`EngineCore.apply` commits it at the time it ends. Like vLLM's
scheduler, one token budget per iteration (``max_num_batched_tokens``) is shared by running
sequences first (decodes and unfinished prefill chunks) and then by waiting ones; prompts
longer than the budget are prefilled in chunks; when KV blocks run out the most recently
admitted (or lowest-priority) running sequence is preempted and later recomputed.

:class:`SimEngine` drives a core on an asyncio event loop: one timer per iteration, never
one per token. On a normal loop that is real time (the in-process ``sim`` backend); on the
virtual-time loop of ``shuniu simulate`` the same code runs hours of traffic in seconds.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import random
from collections import deque
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import Protocol

from mypy_extensions import mypyc_attr

from shuniu.backends.sim.cohort import Cohort, running_order
from shuniu.backends.sim.costmodel import jitter_factor
from shuniu.backends.sim.kvcache import BlockPool, Hits, Run
from shuniu.backends.sim.stats import LogHistogram
from shuniu.core.blockhash import extend_chain
from shuniu.core.kv_events.wire import BlockRemoved, BlockStored, EventBatch, KvEvent
from shuniu.core.traffic import synthetic_ids
from shuniu.core.types import EndpointLoad

__all__ = ["CostFunction", "EngineConfig", "EngineCore", "Seq", "SimEngine"]

WAITING, RUNNING, FINISHED = 0, 1, 2

LEAP_CHUNK = 16
"""Decode iterations of a leap timed at a time (most leaps are cut after a few)."""


class CostFunction(Protocol):
    def step_time(
        self,
        prefill_tokens: int,
        prefill_attn: float,
        decode_seqs: int,
        decode_kv_tokens: int,
        new_seqs: int = 0,
    ) -> float:
        """Seconds one iteration takes (see ``backends/sim/costmodel.py``); ``new_seqs`` is the
        number of sequences the iteration schedules from the waiting queue."""
        ...


class EngineConfig:
    """The engine's knobs, named as vLLM names them."""

    __slots__ = (
        "block_size",
        "chunked_prefill",
        "max_num_batched_tokens",
        "max_num_seqs",
        "num_blocks",
        "prefill_first",
        "prefix_caching",
        "priority",
    )

    def __init__(
        self,
        *,
        num_blocks: int,
        block_size: int = 16,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 8192,
        chunked_prefill: bool = True,
        prefix_caching: bool = True,
        priority: bool = False,
        prefill_first: bool = False,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.chunked_prefill = chunked_prefill
        self.prefix_caching = prefix_caching
        self.priority = priority
        self.prefill_first = prefill_first
        """vLLM's V0 scheduling: an iteration either prefills waiting requests (first, when
        one can start) or decodes the running ones, never both."""

    @property
    def caches_when_scheduled(self) -> bool:
        """Whether a block becomes findable in the prefix cache when the iteration computing
        it is scheduled, as V1 caches it (vLLM's ``KVCacheManager.allocate_slots``): a request
        admitted later in the same step hits the blocks an earlier one computes in it. V0
        marked them computed after the step (:meth:`EngineCore.apply`)."""
        return self.prefix_caching and not self.prefill_first


class Seq:
    """One request inside the engine."""

    __slots__ = (
        "alloc_tick",
        "arrival",
        "cached_tokens",
        "cdue",
        "ckey",
        "done",
        "external_tokens",
        "fill_tick",
        "finished_at",
        "first_token_at",
        "hashes",
        "id",
        "last_token_at",
        "max_output",
        "num_blocks",
        "num_computed",
        "num_hashed",
        "on_first",
        "order",
        "output_count",
        "output_ids",
        "output_seed",
        "per_token",
        "preemptions",
        "priority",
        "prompt",
        "prompt_len",
        "runs",
        "status",
        "synced",
        "waiter",
    )

    def __init__(
        self,
        id: str,
        prompt: Sequence[int],
        max_output: int,
        *,
        output_seed: int = 0,
        priority: int = 0,
        arrival: float = 0.0,
    ) -> None:
        self.id = id
        self.on_first: Callable[[], None] | None = None
        """Called once, at the first output token (``shuniu simulate`` gives the slot's prefill back)."""
        self.prompt = prompt
        self.prompt_len = len(prompt)
        self.max_output = max_output
        self.output_seed = output_seed
        self.priority = priority
        self.arrival = arrival
        self.status = WAITING
        self.num_computed = 0  # tokens whose KV is in the cache
        self.cached_tokens: int | None = None  # prompt tokens the prefix cache served at admission
        self.external_tokens = 0
        """Prompt tokens whose KV arrived from elsewhere (a prefill engine of a prefill/decode
        split): admitted as computed, in blocks of their own, without counting as prefix-cache
        hits; lost on a preemption (recomputed, as vLLM does)."""
        self.output_count = 0
        self.output_ids: Sequence[int] | None = None
        """The answer's token ids, generated whole when first needed (only to hash its
        blocks), unless the caller had them (``shuniu simulate``: a workload's answer)."""
        self.runs: list[Run] = []
        """The cached runs of KV blocks it uses (:mod:`~shuniu.backends.sim.kvcache`)."""
        self.num_blocks = 0  # KV blocks it holds: its runs' and those not full yet
        self.hashes: list[int] = []
        """Chained hashes of the full blocks known so far: ``hash((previous, block tokens))``
        from the block size on (what ``core.pools.prefix.prefix_hashes`` computes for blocks of
        token ids, so a caller may hand those in)."""
        self.num_hashed = 0  # of its blocks, how many are registered in the prefix cache (its runs')
        self.preemptions = 0
        self.first_token_at: float | None = None
        self.last_token_at = 0.0
        self.finished_at: float | None = None
        self.waiter: asyncio.Future[None] | None = None  # woken on every new token
        self.done: asyncio.Future[None] | None = None  # woken when the sequence finishes
        self.per_token = True
        """Whether its caller follows it token by token (:attr:`waiter`). When not (it waits
        for :attr:`done`), the engine may advance it with the other decodes in aggregate
        (:mod:`~shuniu.backends.sim.cohort`): then its token counts are current when it
        finishes, not in between."""
        self.order = 0  # when it (last) joined the running sequences: their order
        self.ckey = 0  # its key in the engine's cohort while a member, else 0
        self.cdue = -1  # the tick of its next block event in the cohort, -1 if none pending
        self.synced = 0  # the cohort's tick when it joined
        # While a cohort member: the cohort ticks whose planned iterations first need its
        # next block, and fill its last (Cohort.schedule_block keeps them).
        self.alloc_tick = 0
        self.fill_tick = 0

    @property
    def finished(self) -> bool:
        return self.status == FINISHED


class Batch:
    """One planned iteration."""

    __slots__ = (
        "cohort",
        "decode_kv_tokens",
        "decode_seqs",
        "items",
        "new_seqs",
        "preempted",
        "prefill_attn",
        "prefill_tokens",
    )

    def __init__(self) -> None:
        self.items: list[tuple[Seq, int]] = []
        """The sequences it runs one by one, in running order, and their tokens."""
        self.cohort = 0
        """How many decodes of the engine's cohort it runs besides (one token each)."""
        self.preempted = False
        """Whether planning it preempted a running sequence."""
        self.prefill_tokens = 0
        self.prefill_attn = 0.0
        self.decode_seqs = 0
        self.decode_kv_tokens = 0
        self.new_seqs = 0
        """Sequences this iteration took from the waiting queue (new, or back after a preemption)."""


class EngineCore:
    """Scheduling and KV bookkeeping for one engine replica."""

    def __init__(self, config: EngineConfig, ids: Callable[[int, int, int], list[int]] | None = None) -> None:
        """``ids(seed, n, start)`` gives generated token ids; by default the workloads' own
        stream, so a later turn's history (built from the same ids) hits the prefix cache."""
        self.config = config
        self.pool = BlockPool(config.num_blocks, config.prefix_caching)
        self._ids = ids or synthetic_ids
        self.running: list[Seq] = []
        """Every running sequence, in the order they (last) started running."""
        self.cohort = Cohort(config.block_size, config.prefix_caching)
        """The running decodes advanced in aggregate (never under V0 scheduling, whose
        decodes sit out the prefill iterations)."""
        self._solo: set[Seq] = set()  # the running sequences outside the cohort
        self._admissions = 0  # sequences started running (their order)
        self._fifo: deque[Seq] = deque()
        self._heap: list[tuple[int, float, int, Seq]] = []
        self._counter = 0
        self.num_waiting = 0
        # counters, as vLLM exports them
        self.requests = 0
        self.completed = 0
        self.aborted = 0
        self.preemptions = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.generated_tokens = 0
        self.prompt_tokens = 0
        self.iterations = 0
        self.ttft = LogHistogram()
        self.itl = LogHistogram()
        self.e2e = LogHistogram()
        self.kv_events: list[KvEvent] | None = None
        """KV events since the engine last published them (:meth:`publish_kv_events`)."""

    # -- admission -------------------------------------------------------------------

    def add(self, seq: Seq) -> None:
        self.requests += 1
        self._push_waiting(seq, front=False)

    def _push_waiting(self, seq: Seq, front: bool) -> None:
        seq.status = WAITING
        self.num_waiting += 1
        if self.config.priority:
            self._counter += 1
            heapq.heappush(self._heap, (seq.priority, seq.arrival, self._counter, seq))
        elif front:
            self._fifo.appendleft(seq)
        else:
            self._fifo.append(seq)

    def _peek_waiting(self) -> Seq | None:
        if self.config.priority:
            heap = self._heap
            while heap and heap[0][3].status != WAITING:
                heapq.heappop(heap)  # aborted while waiting
            return heap[0][3] if heap else None
        fifo = self._fifo
        while fifo and fifo[0].status != WAITING:
            fifo.popleft()
        return fifo[0] if fifo else None

    def _pop_waiting(self) -> None:
        if self.config.priority:
            heapq.heappop(self._heap)
        else:
            self._fifo.popleft()
        self.num_waiting -= 1

    def abort(self, seq: Seq, *, aborted: bool = True, now: float | None = None) -> None:
        """Drop a sequence at once, freeing its blocks: the client went away (``aborted``), or
        it ended early (a stop string hit), which counts as a completion at ``now``."""
        if seq.status == FINISHED:
            return
        if seq.status == WAITING:
            self.num_waiting -= 1  # stays in its queue, skipped when it reaches the head
        else:
            if seq.ckey:
                self.cohort.leave(seq)
            self.running.remove(seq)
            self._solo.discard(seq)
            self.pool.release(seq)
        seq.status = FINISHED
        if aborted:
            self.aborted += 1
        else:
            self.completed += 1
            if now is not None:
                seq.finished_at = now
                self.e2e.add(now - seq.arrival)
        _wake(seq, finished=True)

    def abort_all(self) -> None:
        """Drop every sequence (the engine crashed)."""
        for seq in list(self.running):
            self.abort(seq)
        for seq in [*self._fifo, *(entry[3] for entry in self._heap)]:
            if seq.status == WAITING:
                self.abort(seq)

    def fits(self, seq: Seq) -> bool:
        """Whether the sequence's prompt (plus one token) can ever fit in the KV cache."""
        return self._blocks_for(seq.prompt_len + 1) <= self.config.num_blocks

    def cached_prefix(self, seq: Seq) -> int:
        """Prompt tokens of ``seq`` this engine's prefix cache holds now (whole blocks)."""
        bs = self.config.block_size
        self._extend_hashes(seq, seq.prompt_len)
        return self.pool.lookup(seq.hashes, (seq.prompt_len - 1) // bs)[1] * bs

    @property
    def has_work(self) -> bool:
        return bool(self.running) or self.num_waiting > 0

    def load(self) -> EndpointLoad:
        return EndpointLoad(
            running=len(self.running),
            waiting=self.num_waiting,
            kv_usage=self.pool.usage(),
            prefix_queries=self.prefix_queries,
            prefix_hits=self.prefix_hits,
            generated_tokens=self.generated_tokens,
            aborted=self.aborted,
        )

    # -- one iteration -----------------------------------------------------------------

    def _all_tokens(self, seq: Seq, start: int, end: int) -> Sequence[int]:
        """Token ids ``start:end`` of prompt + output (output ids generated on demand)."""
        p = seq.prompt_len
        if end <= p:
            return seq.prompt[start:end]
        outs = self._output_ids(seq, end - p)
        if start >= p:
            return outs[start - p : end - p]
        return [*seq.prompt[start:], *outs[: end - p]]  # the prompt may be an array

    def _output_ids(self, seq: Seq, n: int) -> Sequence[int]:
        """At least the first ``n`` output token ids of ``seq``."""
        outs = seq.output_ids
        if outs is None or len(outs) < n:
            # The whole answer at once (its length is known): the stream is regenerated
            # from its start on every call, so growing it piecemeal would cost more.
            outs = seq.output_ids = self._ids(seq.output_seed, max(n, seq.max_output), 0)
        return outs

    def _extend_hashes(self, seq: Seq, upto_tokens: int) -> None:
        bs = self.config.block_size
        full = upto_tokens // bs
        hashes = seq.hashes
        have = len(hashes)
        if have >= full:
            return
        # The gateway's chain (core.blockhash): a request that arrives with those hashes
        # (Seq.hashes) is not hashed twice. The prompt's blocks first, sliced straight from
        # it, then the block that straddles prompt and output, then output-only blocks,
        # sliced straight from the output ids.
        in_prompt = min(full, seq.prompt_len // bs)
        if have < in_prompt:
            extend_chain(hashes, seq.prompt, bs, in_prompt)
        b = max(have, in_prompt)
        if b >= full:
            return
        # Into the answer: every full block of it is hashed now (its ids are generated
        # whole anyway), so the blocks its decode fills later find their hashes here.
        p = seq.prompt_len
        full = max(full, (p + seq.max_output) // bs)
        h = hashes[-1] if hashes else bs
        append = hashes.append
        if b * bs < p:  # the block the prompt ends in, with the first output tokens
            h = hash((h, tuple(self._all_tokens(seq, b * bs, (b + 1) * bs))))
            append(h)
            b += 1
        lo, hi = b * bs - p, full * bs - p
        outs = self._output_ids(seq, hi)[lo:hi]
        if not isinstance(outs, list):  # an array's ids made into ints once, not per slice
            outs = outs.tolist()  # type: ignore[attr-defined]  # an array.array
        # Blocks of output only, a tuple each straight from one iterator (zip takes `bs` at a
        # time; hi - lo is whole blocks).
        for ids_of_block in zip(*[iter(outs)] * bs, strict=False):
            h = hash((h, ids_of_block))
            append(h)

    def _blocks_for(self, tokens: int) -> int:
        bs = self.config.block_size
        return (tokens + bs - 1) // bs

    def _preempt(self, victim: Seq) -> None:
        self.running.remove(victim)  # outside the cohort: only the one-by-one plan preempts
        self._solo.discard(victim)
        self.pool.release(victim)
        victim.num_hashed = 0
        victim.num_computed = 0
        victim.external_tokens = 0
        victim.preemptions += 1
        self.preemptions += 1
        self._push_waiting(victim, front=True)

    def _victim(self) -> Seq:
        if self.config.priority:
            return max(self.running, key=lambda s: (s.priority, s.arrival))
        return self.running[-1]

    def schedule(self) -> Batch | None:
        """Plan the next iteration, or ``None`` when there is nothing to run."""
        cfg = self.config
        if cfg.prefill_first and self.num_waiting and len(self.running) < cfg.max_num_seqs:
            # V0: waiting prompts first, in an iteration of their own (the decodes wait).
            batch = Batch()
            self._admit(batch, cfg.max_num_batched_tokens)
            if batch.items:
                return batch
        if self.cohort.members:
            planned = self._schedule_with_cohort()
            if planned is not None:
                return planned
            self._solo.update(self.cohort.disband())  # planned one by one, as below
        pool = self.pool
        budget = cfg.max_num_batched_tokens
        bs = cfg.block_size
        batch = Batch()
        items = batch.items
        preempted = False
        running = self.running
        chunked = cfg.chunked_prefill
        register = cfg.caches_when_scheduled
        decode_seqs = decode_kv = prefill_tokens = 0
        prefill_attn = 0.0
        # Hot loop (once per running sequence per iteration): locals, no helper calls.
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            nc = seq.num_computed
            total = seq.prompt_len + seq.output_count
            need = total - nc
            if need <= budget:
                n = need
            elif chunked:
                n = budget
            else:
                i += 1
                continue
            held = seq.num_blocks
            if nc + n > held * bs:
                extra = (nc + n + bs - 1) // bs - held
                while not pool.allocate(extra):
                    victim = self._victim()
                    self._preempt(victim)
                    preempted = True
                    if victim is seq:
                        break
                    if running.index(seq) < i:  # a sequence before it left the list
                        i -= 1
                if seq.status != RUNNING:
                    continue
                seq.num_blocks = held + extra
            items.append((seq, n))
            if register and nc + n >= (seq.num_hashed + 1) * bs:
                self._register_full(seq, (nc + n) // bs)
            budget -= n
            if need == 1 and seq.output_count:
                decode_seqs += 1
                decode_kv += total
            else:
                prefill_tokens += n
                prefill_attn += n * (nc + n / 2)
            i += 1
        batch.preempted = preempted
        batch.decode_seqs = decode_seqs
        batch.decode_kv_tokens = decode_kv
        batch.prefill_tokens = prefill_tokens
        batch.prefill_attn = prefill_attn

        # Waiting sequences join only if no one had to be preempted (as in vLLM), and under
        # V0 scheduling never alongside decodes (they had their chance above).
        if not preempted and not cfg.prefill_first:
            self._admit(batch, budget)
        return batch if items else None

    def _schedule_with_cohort(self) -> Batch | None:
        """:meth:`schedule`'s plan when the engine has a cohort: the same plan, its members
        one token each, touched only when due for a block, the other running sequences one
        by one; or ``None`` when that plan would not be the same (a sequence before a member
        in the running order cut short by the token budget, or a preemption): then the
        cohort is disbanded."""
        cfg = self.config
        cohort = self.cohort
        solo = self._solo
        tick = cohort.tick
        leaving: list[Seq] = []
        cohort.ending(tick, leaving)  # their last token: planned and finished one by one
        solo.update(leaving)
        members = len(cohort.members)
        if not members:
            return None
        seqs = sorted(solo, key=running_order) if len(solo) > 1 else list(solo)
        # The budget reaches every member: a sequence before the last member (in the running
        # order) must get its whole need from what they leave, one after it is planned
        # exactly as in schedule's loop.
        running = self.running
        j = len(running) - 1
        while not running[j].ckey:
            j -= 1
        last = running[j].order
        bs = cfg.block_size
        budget = cfg.max_num_batched_tokens - members
        if budget < 0:
            return None  # the budget runs out before the last member
        chunked = cfg.chunked_prefill
        plan: list[tuple[Seq, int]] = []
        blocks = 0
        for seq in seqs:
            before = seq.order < last
            if budget <= 0:
                if before:
                    return None
                break
            nc = seq.num_computed
            need = seq.prompt_len + seq.output_count - nc
            if need <= budget:
                n = need
            elif before:
                return None
            elif chunked:
                n = budget
            else:
                continue
            if nc + n > seq.num_blocks * bs:
                blocks += (nc + n + bs - 1) // bs - seq.num_blocks
            plan.append((seq, n))
            budget -= n
        due = cohort.due_blocks(tick)
        for seq in due:
            late = tick + 1 - seq.alloc_tick  # ticks since the one needing its next block
            if late > 0:
                blocks += (late + bs - 1) // bs
        pool = self.pool
        if blocks > pool.available:  # someone is preempted: planned one by one
            for seq in due:
                cohort.schedule_block(seq, seq.num_computed + tick - seq.synced, tick)
            return None
        batch = Batch()
        items = batch.items
        register = cfg.caches_when_scheduled
        decode_seqs = batch.cohort = members
        decode_kv = cohort.kv_base + members * tick
        prefill_tokens = 0
        prefill_attn = 0.0
        # The members due for a block (one token each, as every member) in running order
        # among the others: those between two planned sequences in one call.
        done = 0
        for seq, n in plan:
            if done < len(due):
                upto = bisect.bisect_left(due, seq.order, done, key=running_order)
                if upto > done:
                    self._member_blocks(due, done, upto, tick, 1, 1)  # counted above: they fit
                    done = upto
            nc = seq.num_computed
            held = seq.num_blocks
            if nc + n > held * bs:
                extra = (nc + n + bs - 1) // bs - held
                pool.allocate(extra)  # counted above: it fits
                seq.num_blocks = held + extra
            if register and nc + n >= (seq.num_hashed + 1) * bs:
                self._register_full(seq, (nc + n) // bs)
            items.append((seq, n))
            total = seq.prompt_len + seq.output_count
            if total - nc == 1 and seq.output_count:
                decode_seqs += 1
                decode_kv += total
            else:
                prefill_tokens += n
                prefill_attn += n * (nc + n / 2)
        if done < len(due):
            self._member_blocks(due, done, len(due), tick, 1, 1)
        batch.decode_seqs = decode_seqs
        batch.decode_kv_tokens = decode_kv
        batch.prefill_tokens = prefill_tokens
        batch.prefill_attn = prefill_attn
        self._admit(batch, budget)
        return batch

    def _join_cohort(self, items: list[tuple[Seq, int]]) -> bool:
        """After a commit: the running decodes among ``items`` that may join the cohort do;
        whether any did."""
        if self.config.prefill_first:
            return False
        cohort = self.cohort
        solo = self._solo
        joined = False
        for seq, _ in items:
            if (
                seq.status == RUNNING
                and not seq.ckey
                and not seq.per_token
                and seq.output_count
                and seq.num_computed == seq.prompt_len + seq.output_count - 1
                and cohort.join(seq)
            ):
                solo.discard(seq)
                joined = True
        return joined

    def _admit(self, batch: Batch, budget: int) -> None:
        """Add waiting sequences to ``batch`` while the token budget, ``max_num_seqs`` and
        the free KV blocks allow (prefix hits claimed, the rest allocated)."""
        cfg = self.config
        pool = self.pool
        running = self.running
        items = batch.items
        register = cfg.caches_when_scheduled
        while budget > 0 and len(running) < cfg.max_num_seqs:
            seq = self._peek_waiting()
            if seq is None:
                break
            total = seq.prompt_len + seq.output_count
            hits: Hits = []
            found = 0
            if cfg.prefix_caching:
                self._extend_hashes(seq, total)
                hits, found = pool.lookup(seq.hashes, (total - 1) // cfg.block_size)
            cached = local = found * cfg.block_size
            if seq.external_tokens > cached:
                cached = seq.external_tokens
            need = total - cached
            n = need if need <= budget else (budget if cfg.chunked_prefill else 0)
            if n <= 0:
                break
            pool.claim(seq, hits)
            extra = self._blocks_for(cached + n) - found
            if not pool.allocate(extra):
                pool.release(seq)
                break
            seq.num_blocks += extra
            self._pop_waiting()
            if cfg.prefix_caching:
                self.prefix_queries += total
                self.prefix_hits += local
            seq.num_hashed = found
            seq.num_computed = cached
            if register and cached + n >= (found + 1) * cfg.block_size:
                self._register_full(seq, (cached + n) // cfg.block_size)
            if seq.cached_tokens is None:  # the first admission (a preempted one recomputes)
                seq.cached_tokens = min(cached, seq.prompt_len)
            seq.status = RUNNING
            self._admissions += 1
            seq.order = self._admissions
            running.append(seq)
            self._solo.add(seq)
            items.append((seq, n))
            budget -= n
            batch.new_seqs += 1
            batch.prefill_tokens += n
            batch.prefill_attn += n * (cached + n / 2)

    def apply(self, batch: Batch, now: float) -> None:
        """Commit an iteration that ended at ``now``: KV computed, tokens sampled."""
        self.iterations += 1
        cfg = self.config
        bs = cfg.block_size
        caching = cfg.prefix_caching and not cfg.caches_when_scheduled  # V0 registers here
        pool = self.pool
        events = self.kv_events
        if events is not None and pool.removed:
            events.append(BlockRemoved(pool.removed, "GPU"))  # evicted by this step's allocations
            pool.removed = []
        # Sequences that decoded in the same earlier iteration share one inter-token gap:
        # count them per distinct gap instead of one histogram update per token.
        cohort = self.cohort
        members = len(cohort.members)
        gaps: dict[float, int] = {cohort.last: members} if members else {}
        generated = members
        # Hot loop (once per scheduled sequence per iteration): locals, no helper calls.
        for seq, n in batch.items:
            if seq.status != RUNNING:
                continue  # aborted or preempted meanwhile
            nc = seq.num_computed + n
            seq.num_computed = nc
            if caching and nc >= (seq.num_hashed + 1) * bs:
                self._register_full(seq, nc // bs)
            oc = seq.output_count
            if nc < seq.prompt_len + oc:
                continue  # a prefill chunk that did not reach the end of the prompt
            oc += 1
            seq.output_count = oc
            generated += 1
            if seq.first_token_at is None:
                seq.first_token_at = now
                self.prompt_tokens += seq.prompt_len
                self.ttft.add(now - seq.arrival)
                if seq.on_first is not None:
                    seq.on_first()
            else:
                last = seq.last_token_at
                gaps[last] = gaps.get(last, 0) + 1
            seq.last_token_at = now
            if oc >= seq.max_output:
                self._finish(seq, now)
            elif seq.waiter is not None:
                _wake(seq, finished=False)
        self.generated_tokens += generated
        for last, count in gaps.items():
            self.itl.add(now - last, count)
        cohort.tick += 1
        cohort.last = now
        self._join_cohort(batch.items)

    # -- decode leaps (virtual time) -------------------------------------------------------

    def leap_length(self, batch: Batch, cap: int) -> int:
        """How many decode iterations, ``batch`` first, run before anything changes but the
        tokens: 1 unless the batch is decode-only and holds every running sequence, nothing
        waiting could join, and no sequence finishes before the last one; at most ``cap``,
        and no more than the free KV blocks carry without a preemption. Within that many
        iterations each one is ``batch`` again, one token longer per sequence, so
        :meth:`advance` can commit them together."""
        running = self.running
        planned = len(batch.items) + batch.cohort
        if (
            batch.prefill_tokens
            or batch.new_seqs
            or batch.preempted
            or planned != len(running)
            or batch.decode_seqs != len(running)
        ):
            return 1
        cfg = self.config
        if self.num_waiting and len(running) < cfg.max_num_seqs and cfg.max_num_batched_tokens > len(running):
            return 1  # something waits for blocks: per iteration, as a preemption may follow
        k = cap
        for seq, _ in batch.items:
            left = seq.max_output - seq.output_count
            if left < k:
                k = left
        if batch.cohort:
            left = self.cohort.min_left()
            if left < k:
                k = left
        if k <= 1:
            return 1
        free = self.pool.available
        # Each sequence holds the block of its next token already, so k more tokens need at
        # most ceil((k - 1) / block) more blocks each: the exact count only when that could
        # exceed the free blocks.
        bs = cfg.block_size
        if planned * ((k + bs - 2) // bs) > free and self._leap_blocks(batch, k) > free:
            lo, hi = 1, k - 1  # the longest leap the free blocks carry (1 always does)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self._leap_blocks(batch, mid) <= free:
                    lo = mid
                else:
                    hi = mid - 1
            k = lo
        return k

    def _leap_blocks(self, batch: Batch, k: int) -> int:
        """Blocks ``k`` decode iterations of ``batch`` need beyond those already held."""
        bs = self.config.block_size
        computed = self.cohort.computed
        extra = 0
        for seq in [*(item[0] for item in batch.items), *self.cohort.members]:
            need = (computed(seq) + k + bs - 1) // bs - seq.num_blocks
            if need > 0:
                extra += need
        return extra

    def advance(self, batch: Batch, ends: list[float], start: int, stop: int, last: int) -> None:
        """Commit decode iterations ``start`` to ``stop - 1`` of a leap of ``last`` iterations
        planned on ``batch`` (:meth:`leap_length`); iteration ``i`` ended at ``ends[i]``. The
        same state as applying them one at a time: tokens, KV blocks (those of the iteration
        still running included), the prefix cache, the counters and histograms; sequences
        finish at the leap's last iteration."""
        m = stop - start
        if m <= 0:
            return
        self.iterations += m
        cfg = self.config
        bs = cfg.block_size
        caching = cfg.prefix_caching
        pool = self.pool
        events = self.kv_events
        ahead = 0 if stop == last else 1  # the iteration in progress holds its block already
        when = ends[stop - 1]
        cohort = self.cohort
        items = batch.items
        due: list[Seq] = []
        if cohort.members:
            tick = cohort.tick
            leaving: list[Seq] = []
            cohort.ending(tick + m - 1, leaving)  # they finish: committed one by one
            if leaving:
                self._solo.update(leaving)
                items.extend((seq, 1) for seq in leaving)
                items.sort(key=_item_order)
            # Members due for a block in these iterations (or the next one's) are handled in
            # place, in running order among the others: those between two of the others in
            # one call.
            due = cohort.due_blocks(tick + m + ahead - 1)
        live = len(cohort.members)
        first_gaps: dict[float, int] = {cohort.last: live} if live else {}
        finishing: list[Seq] = []
        reached = cohort.tick + m  # the cohort's tick after these iterations
        done = 0
        for seq, _ in items:
            if done < len(due):
                upto = bisect.bisect_left(due, seq.order, done, key=running_order)
                if upto > done:
                    self._member_blocks(due, done, upto, reached, ahead, 0)  # leap_length checked
                    done = upto
            if seq.status != RUNNING:
                continue  # aborted meanwhile
            live += 1
            nc = seq.num_computed + m
            seq.num_computed = nc
            held = seq.num_blocks
            if nc + ahead > held * bs:
                extra = (nc + ahead + bs - 1) // bs - held
                ok = pool.allocate(extra)
                assert ok, "leap_length checked the free blocks"
                seq.num_blocks = held + extra
            if caching and nc >= (seq.num_hashed + 1) * bs:
                self._register_full(seq, nc // bs)
            last_at = seq.last_token_at
            first_gaps[last_at] = first_gaps.get(last_at, 0) + 1
            seq.last_token_at = when
            oc = seq.output_count + m
            seq.output_count = oc
            if oc >= seq.max_output:
                finishing.append(seq)
            elif seq.waiter is not None:
                _wake(seq, finished=False)
        if done < len(due):
            self._member_blocks(due, done, len(due), reached, ahead, 0)
        cohort.tick += m
        cohort.last = when
        if events is not None and pool.removed:
            events.append(BlockRemoved(pool.removed, "GPU"))
            pool.removed = []
        self.generated_tokens += live * m
        itl = self.itl
        t0 = ends[start]
        for last_at, count in first_gaps.items():
            itl.add(t0 - last_at, count)
        if live:
            itl.add_gaps(ends, start + 1, stop, live)
        for seq in finishing:
            self._finish(seq, when)
        if self._join_cohort(items):  # the leap goes on without them in its items
            items[:] = [item for item in items if not item[0].ckey]

    def _member_blocks(
        self, members: list[Seq], lo: int, hi: int, tick: int, ahead: int, fill_ahead: int
    ) -> None:
        """Cohort members ``members[lo:hi]`` (in running order) are due for a block event at
        ``tick``, where each has ``nc`` tokens computed: hold blocks for ``nc + ahead``
        tokens, register the full blocks of ``nc + fill_ahead`` (with prefix caching), and
        put its next block event on the cohort's calendar (as :meth:`Cohort.schedule_block`).
        One call for a run of them, in ticks rather than tokens (fewer operations, each one
        a new int): this is the engine's commonest work, once per member and block."""
        bs = self.config.block_size
        pool = self.pool
        allocate, register_one = pool.allocate, pool.register_one
        cohort = self.cohort
        registers = cohort.registers
        publishing = self.kv_events is not None
        calendar = cohort.blocks
        earliest = cohort.next_tick
        room = pool.empty  # blocks this call may take without evicting any
        taken = 0
        # A member whose next block is first needed at a tick before `alloc_at` needs it now
        # (one block unless it was needed a block's worth of ticks before `alloc_at` or
        # more); likewise a block it fills at a tick before `fill_at` is full.
        alloc_at = tick + ahead
        one_alloc = alloc_at - bs
        fill_at = tick + fill_ahead
        one_fill = fill_at - bs
        for seq in members[lo:hi]:
            # Ticks, not token counts (a member computes one token per tick): the iteration
            # at `alloc_tick` needs its next block, the one at `fill_tick` fills its last.
            due = seq.alloc_tick
            if due < alloc_at:
                extra = 1 if due >= one_alloc else (alloc_at - due + bs - 1) // bs
                if extra <= room:  # evicts nothing: taken in one allocation at the end
                    room -= extra
                    taken += extra
                else:  # may evict: in its place among the registrations
                    if taken:
                        allocate(taken)
                        taken = 0
                    ok = allocate(extra)
                    assert ok, "the caller counted the free blocks"
                    room = 0
                seq.num_blocks += extra
                due = seq.alloc_tick = due + extra * bs
            if registers:
                fills = seq.fill_tick
                if fills < fill_at:
                    k = 1 if fills >= one_fill else (fill_at - fills + bs - 1) // bs  # blocks filled
                    hashed = seq.num_hashed
                    full = hashed + k
                    hashes = seq.hashes
                    if publishing or len(hashes) < full:
                        self._register_full(seq, full)
                    else:
                        if k > 1 or not register_one(seq, hashes[hashed]):
                            pool.register(seq, hashes, hashed, full)
                        seq.num_hashed = full
                    fills = seq.fill_tick = fills + k * bs
                if fills < due:
                    due = fills
            calendar[due].append(seq)  # a defaultdict: a new tick's list made in C
            seq.cdue = due
            if due < earliest:
                earliest = due
        if taken:
            allocate(taken)
        cohort.next_tick = earliest

    def _register_full(self, seq: Seq, full: int) -> None:
        """Make ``seq``'s first ``full`` blocks findable in the prefix cache (publishing them
        when the engine collects KV events)."""
        if len(seq.hashes) < full:
            self._extend_hashes(seq, full * self.config.block_size)
        if self.kv_events is None:
            self.pool.register(seq, seq.hashes, seq.num_hashed, full)
        else:
            self._register_publishing(seq, full)
        seq.num_hashed = full

    def publish_kv_events(self) -> None:
        """Start collecting KV events (:attr:`kv_events`): the blocks each step makes
        findable and those it evicts, as vLLM publishes them."""
        if self.kv_events is None:
            self.kv_events = []
            self.pool.removed = []

    def _register_publishing(self, seq: Seq, full: int) -> None:
        """Register ``seq``'s blocks up to ``full`` and record a ``BlockStored`` per run of
        blocks that became findable (a block whose content another already holds is not
        new to the cache)."""
        pool, bs = self.pool, self.config.block_size
        hashes = seq.hashes
        events = self.kv_events
        assert events is not None
        if pool.removed:  # evicted by the allocations before this: published first, in order
            events.append(BlockRemoved(pool.removed, "GPU"))
            pool.removed = []
        stored: list[tuple[int, int]] = []
        pool.register(seq, hashes, seq.num_hashed, full, stored)
        for first, stop in stored:
            events.append(
                BlockStored(
                    hashes[first:stop],  # type: ignore[arg-type]  # ints, one of BlockHash's kinds
                    hashes[first - 1] if first else None,
                    # a list, as the wire type says (a workload's prompt is an array)
                    list(self._all_tokens(seq, first * bs, stop * bs)),
                    bs,
                    medium="GPU",
                )
            )

    def _finish(self, seq: Seq, now: float) -> None:
        self.running.remove(seq)  # outside the cohort: a member leaves before its last token
        self._solo.discard(seq)
        self.pool.release(seq)
        seq.status = FINISHED
        seq.finished_at = now
        self.completed += 1
        self.e2e.add(now - seq.arrival)
        _wake(seq, finished=True)


def _item_order(item: tuple[Seq, int]) -> int:
    return item[0].order


def _wake(seq: Seq, finished: bool) -> None:
    waiter = seq.waiter
    if waiter is not None:
        seq.waiter = None
        if not waiter.done():
            waiter.set_result(None)
    if finished and seq.done is not None and not seq.done.done():
        seq.done.set_result(None)


_MAX_HOST_SHARE = 0.95  # a saturated host core still admits, 20x slower


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled (setup.py), still a base class
class SimEngine:
    """Runs an :class:`EngineCore` on the current event loop, one timer per iteration."""

    def __init__(
        self, core: EngineCore, cost: CostFunction, *, admission_delay: float = 0.0, seed: int = 0
    ) -> None:
        """``seed`` starts the engine's own random stream (step jitter, when the cost model has
        a ``jitter_sigma``), so a run with the same seed takes the same iteration times."""
        self.core = core
        self.cost = cost
        self.admission_delay = admission_delay
        self.rng = random.Random(seed)
        self.jitter_sigma = float(getattr(cost, "jitter_sigma", 0.0) or 0.0)
        self._host_token = float(getattr(cost, "host_token", 0.0) or 0.0)
        self._decode_steps: Callable[[int, int, int, int], list[float]] | None
        self._decode_steps = getattr(cost, "decode_steps", None)
        """The cost model's leap timing (``CostModel.decode_steps``), if it has one."""
        self.host_share = 0.0
        """The share of a shared host core (``host_token_us``) the last iteration spent
        streaming tokens; the front-end delay of a new request is stretched by
        ``1 / (1 - host_share)``, as its intake queues behind that work, and requests'
        front-end work is served one at a time (one front-end core). 0 while idle."""
        self._started = False  # driven by loop callbacks (until stop)
        self._resuming = False  # a resumption is due in the loop's next turn
        self._busy = False  # an iteration or a leap is under way (its timer set)
        self._timer: asyncio.TimerHandle | None = None
        self._batch: Batch | None = None  # the single iteration under way
        self._failure: BaseException | None = None
        self._delayed: set[Seq] = set()
        self._front_free = 0.0  # when the front-end core finishes the work queued on it
        self.busy_time = 0.0
        self.kv_publisher: Callable[[EventBatch], None] | None = None
        """Where each step's KV events go (:meth:`publish_kv_events`)."""
        self.leap_steps = 1
        """Most decode iterations run as one event (``shuniu simulate`` raises it; 1: one
        timer per iteration). A leap is cut short at the iteration in progress when a
        sequence arrives or leaves, and committed up to the present when the engine's load
        is read, so what anyone sees is what iteration-by-iteration stepping shows. Only
        for runs that do not wait on single tokens (``Seq.waiter``)."""
        self.timers = 0
        """Timers the engine has run on (one per iteration, or per leap)."""
        self._leap: _Leap | None = None
        self._jitter: deque[float] = deque()  # drawn for iterations a cut leap did not run

    @property
    def cores(self) -> list[EngineCore]:
        """The engine's cores: its one (a prefill/decode split has several)."""
        return [self.core]

    @property
    def prompt_cores(self) -> list[EngineCore]:
        """The cores that compute prompts: this one
        (:class:`~shuniu.backends.sim.disagg.DisaggregatedEngine` splits them)."""
        return [self.core]

    @property
    def output_cores(self) -> list[EngineCore]:
        """The cores whose tokens reach the client: this one."""
        return [self.core]

    def publish_kv_events(self, publish: Callable[[EventBatch], None]) -> None:
        """Hand each step's KV events (blocks cached, blocks evicted) to ``publish``."""
        self.core.publish_kv_events()
        self.kv_publisher = publish

    def submit(self, seq: Seq) -> None:
        """Hand a sequence to the engine (its ``arrival`` should be the loop time now)."""
        loop = asyncio.get_running_loop()
        if not self.core.fits(seq):
            raise ValueError(
                f"a sequence of {seq.prompt_len} prompt tokens can never fit in this engine's "
                f"KV cache ({self.core.config.num_blocks * self.core.config.block_size} tokens)"
            )
        if self.admission_delay > 0:
            self._delayed.add(seq)
            delay = self.admission_delay
            if self._host_token:
                # One front-end core: requests' front-end work is served one at a time, on
                # what the streaming leaves of the core.
                delay /= 1.0 - min(self.host_share, _MAX_HOST_SHARE)
                now = loop.time()
                self._front_free = max(now, self._front_free) + delay
                delay = self._front_free - now
            loop.call_later(delay, self._add, seq)
        else:
            self._add(seq)
        if not self._started:
            self._started = True
            self._resume_soon()

    def _add(self, seq: Seq) -> None:
        if self.admission_delay > 0:
            if seq not in self._delayed:
                return  # aborted during the admission delay
            self._delayed.discard(seq)
        if self._leap is not None:
            # A new sequence only joins the queue: the iterations already ended are
            # committed with the rest at the end of the one in progress, in one pass over
            # the batch (unless KV events must tell the balancer about them now).
            self._cut(sync=self.kv_publisher is not None)
        self.core.add(seq)
        if not self._busy:
            self._resume_soon()

    def abort(self, seq: Seq, *, aborted: bool = True) -> None:
        """Stop a sequence now (client gone: ``aborted``; or ended early by a stop string)."""
        if seq in self._delayed:
            self._delayed.discard(seq)
            seq.status = FINISHED
            if aborted:
                self.core.aborted += 1
            _wake(seq, finished=True)
            return
        if self._leap is not None:
            self._cut()
        self.core.abort(seq, aborted=aborted, now=asyncio.get_running_loop().time())

    def abort_all(self) -> None:
        """Drop everything in the engine, including requests in their admission delay."""
        for seq in list(self._delayed):
            self.abort(seq)
        if self._leap is not None:
            self._cut()
        self.core.abort_all()

    # -- leaps ---------------------------------------------------------------------------

    def _draw(self) -> float:
        """The next iteration's jitter factor: one left over by a cut leap first, so the
        n-th iteration run gets the n-th draw however iterations were grouped."""
        if self._jitter:
            return self._jitter.popleft()
        return jitter_factor(self.rng, self.jitter_sigma)

    def _sync(self) -> None:
        """Commit the iterations of the current leap that have ended by now."""
        leap = self._leap
        if leap is None:
            return
        now = asyncio.get_running_loop().time()
        done = bisect.bisect_right(leap.ends, now, leap.done, len(leap.ends))
        if done > leap.done:
            self.core.advance(leap.batch, leap.ends, leap.done, done, leap.steps)
            leap.done = done
            self._publish()

    def _cut(self, sync: bool = True) -> None:
        """Something changes the batch: end the current leap with the iteration in progress
        (committing the iterations ended by now first, unless not ``sync``)."""
        leap = self._leap
        assert leap is not None
        if sync:
            self._sync()
            keep = leap.done + 1
        else:
            now = asyncio.get_running_loop().time()
            keep = bisect.bisect_right(leap.ends, now, leap.done, len(leap.ends)) + 1
        if leap.steps > keep:
            ends = leap.ends
            if len(ends) < keep:  # the iteration in progress starts a chunk not timed yet
                self._time_leap(leap, keep)
            computed = len(ends)
            if leap.factors:
                self._jitter.extendleft(reversed(leap.factors[keep:computed]))
                del leap.factors[keep:]
            self.busy_time -= ends[computed - 1] - ends[keep - 1]
            del ends[keep:]
            leap.steps = keep
            timer = self._timer
            if timer is not None:
                timer.cancel()
                self._arm_leap(leap)  # on the new end

    def _time_leap(self, leap: _Leap, upto: int) -> None:
        """Time the leap's iterations up to ``upto`` (exclusive; its first is timed): each
        one's duration (and jitter draw) is worked out only when the leap reaches its
        chunk, since most leaps are cut long before their planned end."""
        ends = leap.ends
        t = ends[-1]
        start = t
        cost = self.cost
        sigma = self.jitter_sigma
        batch = leap.batch
        seqs, kv = batch.decode_seqs, batch.decode_kv_tokens
        if self._decode_steps is not None:
            steps = self._decode_steps(seqs, kv, len(ends), upto)
        else:
            steps = [cost.step_time(0, 0.0, seqs, kv + i * seqs, 0) for i in range(len(ends), upto)]
        if sigma:
            factors = leap.factors
            for step in steps:
                f = self._draw()
                factors.append(f)
                t += step * f
                ends.append(t)
        elif steps:
            timed = accumulate(steps, initial=t)  # t, then each end: the same sums in order
            next(timed)
            ends += timed
            t = ends[-1]
        self.busy_time += t - start

    def _start_leap(self, batch: Batch, dt: float, factor: float, k: int) -> None:
        """Run ``k`` decode iterations of ``batch`` as one timer per :data:`LEAP_CHUNK` of
        them (the first takes ``dt``)."""
        leap = _Leap(batch)
        ends = leap.ends
        ends.append(asyncio.get_running_loop().time() + dt)
        if self.jitter_sigma:
            leap.factors.append(factor)
        self.busy_time += dt
        leap.steps = k
        self._time_leap(leap, min(k, LEAP_CHUNK))
        self._leap = leap
        self._arm_leap(leap)

    def _arm_leap(self, leap: _Leap) -> None:
        self.timers += 1
        self._timer = asyncio.get_running_loop().call_at(leap.ends[-1], self._leap_timer)

    def _leap_timer(self) -> None:
        """The leap's timed iterations have ended: time the next chunk, or end the leap."""
        self._timer = None
        try:
            leap = self._leap
            assert leap is not None
            if len(leap.ends) < leap.steps:
                self._time_leap(leap, min(leap.steps, len(leap.ends) + LEAP_CHUNK))
                self._arm_leap(leap)
                return
            self._leap = None
            if leap.done < leap.steps:
                self.core.advance(leap.batch, leap.ends, leap.done, leap.steps, leap.steps)
                self._publish()
            self._step()
        except Exception as exc:
            self._fail(exc)

    def _publish(self) -> None:
        core = self.core
        if core.kv_events and self.kv_publisher is not None:
            self.kv_publisher(EventBatch(asyncio.get_running_loop().time(), core.kv_events, 0))
            core.kv_events = []

    # -- the driver: loop callbacks, one timer per iteration or leap ------------------------

    def _resume_soon(self) -> None:
        """Plan the next iteration in the loop's next turn (work arrived at an idle engine):
        whatever else arrives in this turn joins the same plan."""
        if not self._resuming:
            self._resuming = True
            asyncio.get_running_loop().call_soon(self._resume)

    def _resume(self) -> None:
        self._resuming = False
        if self._started and not self._busy:
            try:
                self._step()
            except Exception as exc:
                self._fail(exc)

    def _step(self) -> None:
        """Plan an iteration and set its timer (or a leap's); idle when there is nothing to run."""
        core = self.core
        batch = core.schedule()
        if batch is None:
            self._busy = False
            self.host_share = 0.0
            return
        self._busy = True
        cost = self.cost
        dt = cost.step_time(
            batch.prefill_tokens,
            batch.prefill_attn,
            batch.decode_seqs,
            batch.decode_kv_tokens,
            batch.new_seqs,
        )
        if self._host_token:
            self.host_share = cost.host_share(dt, batch.decode_seqs, batch.new_seqs)  # type: ignore[attr-defined]
        factor = 1.0
        if self.jitter_sigma:
            factor = self._draw()
            dt *= factor
        if self.leap_steps > 1:
            k = core.leap_length(batch, self.leap_steps)
            if k > 1:
                self._start_leap(batch, dt, factor, k)
                return
        self.busy_time += dt
        self.timers += 1
        self._batch = batch
        self._timer = asyncio.get_running_loop().call_later(dt, self._end_iteration)

    def _end_iteration(self) -> None:
        self._timer = None
        batch, self._batch = self._batch, None
        assert batch is not None
        try:
            self.core.apply(batch, asyncio.get_running_loop().time())
            self._publish()
            self._step()
        except Exception as exc:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        """A bug in the engine: it stops, and :attr:`failure` says why (its sequences would
        wait forever)."""
        self._failure = exc
        self._halt()

    def _halt(self) -> None:
        self._started = False
        self._busy = False
        self._leap = None
        self._batch = None
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    @property
    def failure(self) -> BaseException | None:
        """What stopped the engine, if something other than :meth:`stop` did (a bug: the
        sequences in it would wait forever)."""
        return self._failure

    async def stop(self) -> None:
        self._halt()

    def load(self) -> EndpointLoad:
        if self._leap is not None:
            self._sync()
        return self.core.load()


class _Leap:
    """Decode iterations an engine runs as one timer (:meth:`SimEngine._start_leap`)."""

    __slots__ = ("batch", "done", "ends", "factors", "steps")

    def __init__(self, batch: Batch) -> None:
        self.batch = batch
        self.ends: list[float] = []
        """When each iteration ends."""
        self.factors: list[float] = []
        """Each iteration's jitter factor (empty without jitter)."""
        self.steps = 0
        """Iterations the leap runs (fewer once cut)."""
        self.done = 0
        """Iterations committed so far."""
