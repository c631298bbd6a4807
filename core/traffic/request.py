"""The record a workload generates: one :class:`SimRequest` per arriving request."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

__all__ = ["SimRequest"]


class SimRequest(msgspec.Struct, gc=False):
    """One simulated request, as :meth:`Workload.requests` yields it."""

    arrival: float
    """Seconds from the start of the run."""
    prompt: Sequence[int]
    """Prompt token ids (empty when generated with ``prompts=False``): a list, or for chat
    streams a compact ``array('H')`` (compare with ``list(prompt)``)."""
    output_tokens: int
    """Tokens the engine generates for it (as with ``ignore_eos``)."""
    output_seed: int
    """The engine's answer is ``synthetic_ids(output_seed, output_tokens)``."""
    tenant: str = "default"
    tier: str = "default"
    priority: int = 0
    """Smaller runs first (vLLM's convention)."""
    session: str | None = None
    """Conversation id (chat streams, or a trace's ``session``); for session affinity."""
    prefix_group: str | None = None
    """Name of the shared prefix (system prompt) the prompt starts with, if any."""
    kind: str = "chat"
    """API the request is sent to: ``chat`` or ``completions``."""
    prompt_tokens: int = -1
    """Prompt length; equals ``len(prompt)`` when prompts are generated (filled in from
    ``prompt`` when left at -1)."""
    prefix_tokens: int = 0
    """Length of the shared prefix at the start of the prompt (the system prompt)."""
    id: int = 0
    """Position in arrival order, from 0."""
    stream: str = ""
    """The stream (``name`` or ``name/class``) the request comes from, for per-class stats."""
    user: str | None = None
    turn: int = 0
    """Turn number within the conversation, from 0."""
    chain_key: str | None = None
    """Names the prompts that start alike, so a simulation hashes their shared blocks once
    (:class:`~shuniu.core.blockhash.PrefixChain`): ``chat:`` and the conversation (every
    turn's prompt starts with the whole previous one), ``system:`` and the system prompt's
    group, ``group:`` and a trace's prefix group; ``None`` without generated prompts."""
    chain_tokens: int = 0
    """How many leading prompt tokens this request shares with the others of ``chain_key``."""
    answer: Sequence[int] | None = None
    """The answer's ids, ``synthetic_ids(output_seed, output_tokens)``, when the generator made
    them already (a conversation's next turn replays them): a simulated engine takes these
    instead of generating them again."""

    def __post_init__(self) -> None:
        if self.prompt_tokens < 0:
            self.prompt_tokens = len(self.prompt)
