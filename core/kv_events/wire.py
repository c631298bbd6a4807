"""KV-cache events as engines publish them: vLLM's wire format (SGLang and vllm-ascend send
the same), which the simulator publishes too.

One ZMQ message is three frames, ``[topic, sequence, payload]``: the topic (bytes, may be
empty), the batch's sequence number (8 bytes, big-endian, from 0 at the engine's start) and
a msgpack-encoded :class:`EventBatch` — an array ``[ts, events, data_parallel_rank]``
whose events are maps tagged by ``type``: :class:`BlockStored` (full blocks now cached,
with the token ids they hold and the hash of the block before the first of them),
:class:`BlockRemoved` (blocks evicted) and :class:`AllBlocksCleared` (the cache was reset).

A block hash is the engine's own (an int, or bytes for vLLM's sha256 hashes); consumers
treat it as an opaque key. Fields a newer engine adds are ignored; fields an older one
leaves out take their defaults.
"""

from __future__ import annotations

import msgspec

__all__ = [
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EventBatch",
    "KvEvent",
    "decode_batch",
    "encode_batch",
    "sequence_bytes",
]

BlockHash = int | bytes


class BlockStored(msgspec.Struct, tag=True, gc=False):
    """Full blocks the engine cached, in prefix order."""

    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    """The block before the first of these (``None``: they start the prompt)."""
    token_ids: list[int]
    """The tokens of every block, ``block_size`` each."""
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    """Where the blocks are (``GPU``, ``CPU`` for an offloading tier); ``None``: the GPU."""
    lora_name: str | None = None


class BlockRemoved(msgspec.Struct, tag=True, gc=False):
    """Blocks the engine evicted."""

    block_hashes: list[BlockHash]
    medium: str | None = None


class AllBlocksCleared(msgspec.Struct, tag=True, gc=False):
    """The engine dropped its whole prefix cache."""


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """The events of one engine step."""

    ts: float
    events: list[KvEvent]
    data_parallel_rank: int | None = None


_decoder = msgspec.msgpack.Decoder(EventBatch)
_encoder = msgspec.msgpack.Encoder()


def decode_batch(payload: bytes) -> EventBatch:
    """A batch from its payload frame; ``msgspec.DecodeError`` / ``ValidationError`` when it
    is not one."""
    return _decoder.decode(payload)


def encode_batch(batch: EventBatch) -> bytes:
    return _encoder.encode(batch)


def sequence_bytes(seq: int) -> bytes:
    """The sequence frame: 8 bytes, big-endian (``-1`` marks the end of a replay)."""
    return seq.to_bytes(8, "big", signed=True)
