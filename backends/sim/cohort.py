"""Decodes advanced in aggregate: the simulated engine's cohort.

Most of an engine's running sequences, most of the time, are plain decodes: each iteration
computes one token of each, and nothing else happens to them until one fills a KV block,
needs the next one or finishes. Touching every one of them whenever an iteration is planned
or a decode leap committed was most of the simulator's engine work. A :class:`Cohort` holds
such sequences without touching them: an iteration advances its :attr:`~Cohort.tick`, and a
member's token counts are its counts at the tick it joined plus the ticks since. The engine
finds the members due for a block (to allocate, or to register once full) on a calendar by tick, and
handles just those, in their running order among the sequences it handles one by one; a
member about to finish leaves the cohort first, and finishes as any sequence does.

While a sequence is a member, its ``num_computed``, ``output_count`` and ``last_token_at``
are those of the tick it joined (:meth:`Cohort.computed` gives the current count);
:meth:`Cohort.leave` brings them up to date.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Iterable
from operator import attrgetter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shuniu.backends.sim.engine import Seq

__all__ = ["Cohort", "running_order"]


class Cohort:
    """Decode-only sequences of one engine, advanced together."""

    __slots__ = (
        "_ends",
        "_key",
        "block_size",
        "blocks",
        "kv_base",
        "last",
        "members",
        "next_tick",
        "registers",
        "tick",
    )

    def __init__(self, block_size: int, registers: bool) -> None:
        self.block_size = block_size
        self.registers = registers
        """Whether a block that fills is registered in the prefix cache (prefix caching on)."""
        self.members: set[Seq] = set()
        self.tick = 0
        """Iterations committed so far (with members or not)."""
        self.last = 0.0
        """When the last committed iteration ended: every member's last token."""
        self.kv_base = 0
        """The sum over members of ``prompt_len + output_count - synced`` (their counts as of
        joining), so that their tokens are ``kv_base + len(members) * tick``."""
        self.blocks: defaultdict[int, list[Seq]] = defaultdict(list)
        """Tick → the members whose next block event comes with the iteration planned at it
        (it first needs the member's next block, or fills its block): a calendar, since
        every event is due within a block's worth of ticks (:meth:`push_block`). An entry
        counts only while the member's ``cdue`` names its tick: those of members that left,
        or were handled and pushed again, are skipped. The engine puts a run of members on
        it in one go (``EngineCore._member_blocks``). A ``defaultdict``: a tick's first
        member makes its list in C (per member event 6.2 k -> 6.0 k instructions); read it
        with ``pop(tick, None)``, which does not add the tick."""
        self.next_tick = 0
        """No tick before this one has events left to hand out (lowered by whoever puts an
        earlier one on the calendar)."""
        self._ends: list[tuple[int, int, int, Seq]] = []
        """(the tick whose planned iteration computes the member's last token, order, key,
        member)."""
        self._key = 0

    def join(self, seq: Seq) -> bool:
        """Take in a running decode (its counts up to date) unless its next iteration is its
        last; whether it joined."""
        tick = self.tick
        oc = seq.output_count
        end = tick + seq.max_output - 1 - oc
        if end <= tick:
            return False
        key = self._key = self._key + 1
        seq.ckey = key
        seq.synced = tick
        self.members.add(seq)
        self.kv_base += seq.prompt_len + oc - tick
        heapq.heappush(self._ends, (end, seq.order, key, seq))
        self.schedule_block(seq, seq.num_computed, tick)
        return True

    def schedule_block(self, seq: Seq, computed: int, tick: int) -> None:
        """Push a member's next block event: it has ``computed`` tokens at ``tick`` and
        holds its blocks and registrations up to date for them."""
        bs = self.block_size
        due = seq.alloc_tick = tick + seq.num_blocks * bs - computed
        if self.registers:
            fills = seq.fill_tick = tick + (seq.num_hashed + 1) * bs - 1 - computed
            if fills < due:
                due = fills
        self.push_block(seq, due)

    def push_block(self, seq: Seq, due: int) -> None:
        """Put a member's next block event, at tick ``due``, on the calendar."""
        self.blocks[due].append(seq)
        seq.cdue = due
        if due < self.next_tick:
            self.next_tick = due

    def due_blocks(self, limit: int) -> list[Seq]:
        """The members whose next block event comes at a tick up to ``limit``, taken off the
        calendar (the caller handles them and pushes them again), in running order."""
        start = self.next_tick
        if limit < start:
            return []
        self.next_tick = limit + 1
        blocks = self.blocks
        due: list[Seq] = []
        if limit - start < len(blocks):
            ticks: Iterable[int] = range(start, limit + 1)
        else:  # a long leap: the ticks that have events, not every tick
            ticks = [t for t in blocks if t <= limit]
        for t in ticks:
            bucket = blocks.pop(t, None)
            if bucket is not None:
                for seq in bucket:
                    if seq.cdue == t:
                        seq.cdue = -1
                        due.append(seq)
        if len(due) > 1:
            due.sort(key=running_order)
        return due

    def ending(self, limit: int, out: list[Seq]) -> None:
        """Let go of (and append to ``out``) every member whose last token is computed by
        the iteration planned at a tick up to ``limit``."""
        ends = self._ends
        while ends and ends[0][0] <= limit:
            _, _, key, seq = heapq.heappop(ends)
            if seq.ckey == key:
                self.leave(seq)
                out.append(seq)

    def leave(self, seq: Seq) -> None:
        """Let a member go, its counts brought up to date (its entries go stale)."""
        ahead = self.tick - seq.synced
        self.kv_base -= seq.prompt_len + seq.output_count - seq.synced
        if ahead:
            seq.num_computed += ahead
            seq.output_count += ahead
            seq.last_token_at = self.last
        seq.ckey = 0
        seq.cdue = -1
        members = self.members
        members.remove(seq)
        if not members:
            self.blocks.clear()
            self._ends.clear()

    def min_left(self) -> int:
        """The fewest output tokens any member has left (there must be a member)."""
        ends = self._ends
        while ends[0][3].ckey != ends[0][2]:
            heapq.heappop(ends)
        return ends[0][0] + 1 - self.tick

    def computed(self, seq: Seq) -> int:
        """A sequence's computed tokens now, member or not."""
        return seq.num_computed + (self.tick - seq.synced if seq.ckey else 0)

    def disband(self) -> list[Seq]:
        """Let every member go (brought up to date); they are returned."""
        gone = list(self.members)
        for seq in gone:
            self.leave(seq)
        return gone


running_order: Callable[[Seq], int] = attrgetter("order")
"""A running sequence's place in its engine's running order (the key to sort them by; a
getter in C, as it sorts on every plan)."""
