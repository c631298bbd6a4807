"""KV-cache events from the engines (vLLM's ZMQ format, which SGLang, vllm-ascend and the
simulator publish too) and the exact index of which endpoint holds which prompt blocks that
they feed (``docs/scheduling.md``): :mod:`.wire` (the messages), :mod:`.index` (the index),
:mod:`.feed` (one endpoint's stream: sequence gaps, restarts), :mod:`.local` (in-process,
the ``sim`` backend), :mod:`.zmq_transport` (ZMQ publisher and subscriber)."""

from __future__ import annotations

from shuniu.core.kv_events.feed import KvEventFeed
from shuniu.core.kv_events.index import KvBlockIndex
from shuniu.core.kv_events.local import LocalKvEvents
from shuniu.core.kv_events.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEvent,
    decode_batch,
    encode_batch,
)

__all__ = [
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EventBatch",
    "KvBlockIndex",
    "KvEvent",
    "KvEventFeed",
    "LocalKvEvents",
    "decode_batch",
    "encode_batch",
]
