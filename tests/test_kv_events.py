"""KV-cache events: vLLM's wire format both ways (against vLLM's own encoder), the exact
index (parents, removals, copies, clears, its bound), a feed's sequence checks (a restart, a
gap, a bad message), the simulator's events agreeing with its own cache block for block, and
ZMQ publishing and subscribing on 127.0.0.1 with a replay that fills a gap."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from shuniu.backends.sim.engine import EngineConfig, EngineCore, Seq
from shuniu.core.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvBlockIndex,
    KvEventFeed,
    decode_batch,
    encode_batch,
)
from shuniu.core.pools.prefix import prefix_hashes
from shuniu.core.traffic import synthetic_ids
from shuniu.core.types import InferenceRequest
from tests.ports import quiet_ports

ROOT = Path(__file__).resolve().parent.parent
VLLM_PYTHON = Path(os.environ.get("SHUNIU_VLLM_VENV") or ROOT / ".venv-vllm") / "bin" / "python"

_VLLM_ENCODE = """
import sys, msgspec
from vllm.distributed.kv_events import KVEventBatch, BlockStored, BlockRemoved, AllBlocksCleared
b = KVEventBatch(ts=1.5, events=[
    BlockStored(block_hashes=[b"\\x01" * 32, 7], parent_block_hash=None, token_ids=list(range(32)),
                block_size=16, lora_id=None, medium="GPU", lora_name=None),
    BlockRemoved(block_hashes=[7], medium="GPU"), AllBlocksCleared()], data_parallel_rank=0)
sys.stdout.buffer.write(msgspec.msgpack.Encoder().encode(b))
"""


def _req(ids: list[int]) -> InferenceRequest:
    return InferenceRequest(
        id="r", model="m", api="completions", body={}, prompt="", prompt_tokens=len(ids), token_ids=ids
    )


def _stored(hashes: list[int], parent: int | None, ids: list[int], bs: int = 4) -> BlockStored:
    return BlockStored(hashes, parent, ids, bs, medium="GPU")


@pytest.mark.skipif(
    not VLLM_PYTHON.exists(), reason=f"needs vLLM's CPU build at {VLLM_PYTHON} (docs/testing.md)"
)
def test_vllms_own_encoding_decodes_and_ours_is_byte_for_byte_the_same() -> None:
    raw = subprocess.run(
        [str(VLLM_PYTHON), "-c", _VLLM_ENCODE], capture_output=True, check=True, timeout=300
    ).stdout
    batch = decode_batch(raw)
    stored, removed, cleared = batch.events
    assert isinstance(stored, BlockStored) and stored.block_hashes == [b"\x01" * 32, 7]
    assert (
        stored.parent_block_hash is None and stored.token_ids == list(range(32)) and stored.block_size == 16
    )
    assert isinstance(removed, BlockRemoved) and removed.block_hashes == [7]
    assert isinstance(cleared, AllBlocksCleared) and batch.data_parallel_rank == 0
    assert encode_batch(batch) == raw


def test_a_newer_engines_extra_fields_are_ignored() -> None:
    import msgspec

    raw = msgspec.msgpack.encode(
        [2.0, [{"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "token_ids": [1, 2],
                "block_size": 2, "lora_id": None, "medium": None, "lora_name": None, "group_idx": 3,
                "session_id": "s"}]]
    )  # fmt: skip
    (event,) = decode_batch(raw).events
    assert isinstance(event, BlockStored) and event.token_ids == [1, 2]


def test_the_index_matches_a_requests_own_hash_chain_and_follows_removals() -> None:
    index = KvBlockIndex()
    ids = list(range(100, 116))  # four blocks of 4
    index.apply(0, EventBatch(0.0, [_stored([11, 12], None, ids[:8])]))
    index.apply(0, EventBatch(0.1, [_stored([13, 14], 12, ids[8:])]))  # continues from its parent
    index.apply(1, EventBatch(0.2, [_stored([91], None, ids[:4])]))  # another engine's own hashes
    hashes = prefix_hashes(_req(ids), 256, 4)
    assert index.match_sparse(hashes, 0b11) == {0: 4, 1: 1}
    index.apply(0, EventBatch(0.3, [BlockRemoved([13], "GPU")]))
    assert index.match_sparse(hashes, 0b11) == {0: 2, 1: 1}
    index.apply(0, EventBatch(0.4, [_stored([15], 99, ids[:4])]))  # a parent never seen
    assert index.orphans == 1
    index.apply(1, EventBatch(0.5, [AllBlocksCleared()]))
    assert index.match_sparse(hashes, 0b11) == {0: 2} and index.blocks(1) == 0


def test_an_event_with_too_few_token_ids_keys_only_its_whole_blocks() -> None:
    # Four block hashes but ten ids for blocks of 4: the first two blocks have keys; the
    # third would be a part of a block (the fourth nothing) and is counted instead, and a
    # later event continuing from one of them is an orphan.
    index = KvBlockIndex()
    ids = list(range(200, 216))
    index.apply(0, EventBatch(0.0, [_stored([21, 22, 23, 24], None, ids[:10])]))
    hashes = prefix_hashes(_req(ids), 256, 4)
    assert index.match_sparse(hashes, 1) == {0: 2}
    assert index.blocks(0) == 2 and index.blocks_stored == 2
    assert index.malformed == {0: 2} and index.orphans == 0
    index.apply(0, EventBatch(0.1, [_stored([25], 24, ids[12:16])]))
    assert index.orphaned == {0: 1}
    index.apply(1, EventBatch(0.2, [_stored([31], None, [])]))  # no ids at all: nothing keyed
    assert index.malformed == {0: 2, 1: 1} and index.blocks(1) == 0
    assert len(index) == 2


def test_a_salted_copy_of_the_same_tokens_keeps_the_block_until_both_go() -> None:
    index = KvBlockIndex()
    ids = [1, 2, 3, 4]
    index.apply(0, EventBatch(0.0, [_stored([5], None, ids), _stored([6], None, ids)]))  # e.g. two LoRAs
    hashes = prefix_hashes(_req(ids), 256, 4)
    index.apply(0, EventBatch(0.1, [BlockRemoved([5], None)]))
    assert index.match_sparse(hashes, 1) == {0: 1}
    index.apply(0, EventBatch(0.2, [BlockRemoved([6], None)]))
    assert index.match_sparse(hashes, 1) == {}


def test_the_index_is_bounded() -> None:
    index = KvBlockIndex(max_blocks=10)
    for k in range(50):
        index.apply(0, EventBatch(float(k), [_stored([k], None, [k, k, k, k])]))
    assert len(index) <= 10 and index.blocks(0) <= 10
    assert index.match_sparse(prefix_hashes(_req([49] * 4), 256, 4), 1) == {0: 1}  # the newest kept


def test_a_feed_resynchronises_after_a_restart_a_gap_and_survives_a_bad_message() -> None:
    index = KvBlockIndex()
    feed = KvEventFeed(index, 0, "engine-0")
    ids = [7, 7, 7, 7]
    payload = encode_batch(EventBatch(0.0, [_stored([1], None, ids)]))
    hashes = prefix_hashes(_req(ids), 256, 4)
    feed.receive(5, payload)  # joining late: taken as is
    feed.receive(6, encode_batch(EventBatch(0.1, [])))
    assert index.match_sparse(hashes, 1) == {0: 1} and feed.resets == 0
    feed.receive(0, encode_batch(EventBatch(0.2, [])))  # numbers from 0 again: a new engine
    assert index.match_sparse(hashes, 1) == {} and feed.resets == 1
    feed.receive(1, payload)
    assert feed.missing(4) == range(2, 4)
    feed.receive(4, encode_batch(EventBatch(0.3, [])))  # two lost: what it held is unknown
    assert index.match_sparse(hashes, 1) == {} and feed.gaps == 1 and feed.resets == 2
    feed.receive(5, b"not msgpack")
    assert feed.invalid == 1 and feed.last == 5


def test_the_simulators_events_agree_with_its_cache_block_for_block() -> None:
    core = EngineCore(EngineConfig(num_blocks=24, block_size=4, max_num_batched_tokens=64))
    core.publish_kv_events()
    index = KvBlockIndex()
    shared = synthetic_ids(1, 24)
    prompts = [shared + synthetic_ids(10 + k, 12) for k in range(12)]  # more than the cache holds
    for k, prompt in enumerate(prompts):
        core.add(Seq(f"s{k}", prompt, 6))
        now = float(k)
        while core.has_work:
            batch = core.schedule()
            assert batch is not None
            now += 0.01
            core.apply(batch, now)
            if core.kv_events:
                index.apply(0, decode_batch(encode_batch(EventBatch(now, core.kv_events))))
                core.kv_events = []
    assert core.pool.evictions > 0  # the cache was too small: removals were published too
    for prompt in [*prompts, synthetic_ids(99, 20)]:
        # the engine's chain: hash((previous, block)) from the block size on
        engine_hashes: list[int] = []
        h = 4
        for b in range(len(prompt) // 4):
            h = hash((h, tuple(prompt[b * 4 : (b + 1) * 4])))
            engine_hashes.append(h)
        held = core.pool.lookup(engine_hashes, len(engine_hashes))[1]
        assert index.match_sparse(prefix_hashes(_req(prompt), 256, 4), 1).get(0, 0) == held
    assert index.blocks(0) == core.pool.cached


async def _until(predicate, within: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, "condition not met"
        await asyncio.sleep(0.01)


async def test_zmq_subscriber_follows_a_publisher_and_replays_fill_what_it_missed() -> None:
    pytest.importorskip("zmq")
    from shuniu.core.kv_events.zmq_transport import ZmqPublisher, ZmqSubscriber

    pub_port, replay_port = quiet_ports(2)
    replay = f"tcp://127.0.0.1:{replay_port}"
    publisher = ZmqPublisher(f"tcp://*:{pub_port}", topic="kv-events", replay_endpoint=replay)
    index = KvBlockIndex()
    feed = KvEventFeed(index, 0, "engine-0")
    sub = ZmqSubscriber(feed, f"tcp://127.0.0.1:{pub_port}", topic="kv-events", replay_endpoint=replay)
    blocks = [[k] * 4 for k in range(4)]
    # Sent before there is any subscriber: only a replay can bring it.
    publisher.publish(EventBatch(0.0, [_stored([0], None, blocks[0])]))
    await sub.start()
    try:
        deadline = time.monotonic() + 10
        while sub.received == 0:
            assert time.monotonic() < deadline, "nothing arrived"
            publisher.publish(EventBatch(0.1, []))
            await asyncio.sleep(0.02)
        await _until(lambda: feed.last == publisher.seq - 1)
        # Two batches lost on the way (as past a high-water mark): kept for replay, never sent.
        for k in (1, 2):
            publisher.buffer.append(
                (publisher.seq, encode_batch(EventBatch(1.0, [_stored([k], k - 1, blocks[k])])))
            )
            publisher.seq += 1
        publisher.publish(EventBatch(2.0, [_stored([3], 2, blocks[3])]))
        await _until(lambda: feed.last == publisher.seq - 1)
        assert feed.gaps == 0 and feed.resets == 0 and sub.replays >= 2
        chain = [x for b in blocks for x in b]
        assert index.match_sparse(prefix_hashes(_req(chain), 256, 4), 1) == {0: 4}
    finally:
        await sub.stop()
        await publisher.close()


async def test_without_a_replay_socket_a_gap_clears_the_endpoint() -> None:
    pytest.importorskip("zmq")
    from shuniu.core.kv_events.zmq_transport import ZmqPublisher, ZmqSubscriber

    port = quiet_ports()[0]
    publisher = ZmqPublisher(f"tcp://*:{port}")
    index = KvBlockIndex()
    feed = KvEventFeed(index, 0, "engine-0")
    sub = ZmqSubscriber(feed, f"tcp://127.0.0.1:{port}")
    await sub.start()
    try:
        deadline = time.monotonic() + 10
        while sub.received == 0:
            assert time.monotonic() < deadline, "nothing arrived"
            publisher.publish(EventBatch(0.0, []))
            await asyncio.sleep(0.02)
        publisher.publish(EventBatch(0.5, [_stored([1], None, [1] * 4)]))
        hashes = prefix_hashes(_req([1] * 4), 256, 4)
        await _until(lambda: index.match_sparse(hashes, 1) == {0: 1})
        publisher.seq += 3  # three batches lost
        publisher.publish(EventBatch(1.0, []))
        await _until(lambda: feed.resets == 1)
        assert index.match_sparse(hashes, 1) == {} and feed.gaps == 1
    finally:
        await sub.stop()
        await publisher.close()


async def test_shuniu_sim_serve_publishes_vllms_events_and_a_restart_clears_its_entries() -> None:
    pytest.importorskip("zmq")
    import openai

    from shuniu.core.kv_events.zmq_transport import ZmqSubscriber
    from tests.test_sim_serve import start_sim_server

    port = quiet_ports()[0]
    address = f"tcp://127.0.0.1:{port}"  # no wildcard: the engine connects, the subscriber binds
    config = json.dumps(
        {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": address, "topic": "kv-events"}
    )
    index = KvBlockIndex()
    feed = KvEventFeed(index, 0, "engine-0")
    sub = ZmqSubscriber(feed, address, topic="kv-events", bind=True)
    await sub.start()
    prompt = " ".join(f"word{k}" for k in range(400))

    async def ask_until_blocks(server_url: str) -> None:
        client = openai.AsyncOpenAI(base_url=f"{server_url}/v1", api_key="x", max_retries=0)
        deadline = time.monotonic() + 30
        while index.blocks(0) == 0:  # the first messages may go before the connection is up
            assert time.monotonic() < deadline, "no KV events arrived"
            await client.completions.create(model="sim", prompt=prompt, max_tokens=2)
            await asyncio.sleep(0.05)
        await client.close()

    server = start_sim_server(
        "--served-model-name", "sim", "--tokens-per-s", "0", "--kv-events-config", config
    )
    try:
        await ask_until_blocks(server.url)
        assert index.block_size == 16 and feed.invalid == 0
        server.stop(9)  # killed: a new engine, an empty cache, numbers from 0
        server = start_sim_server(
            "--served-model-name", "sim", "--tokens-per-s", "0", "--kv-events-config", config
        )
        before = feed.resets
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        deadline = time.monotonic() + 30
        while feed.resets == before:
            assert time.monotonic() < deadline, "the restart was not noticed"
            await client.completions.create(model="sim", prompt="another prompt " * 60, max_tokens=2)
            await asyncio.sleep(0.05)
        await client.close()
        assert index.blocks(0) <= 60 * 2 // 16 + 1  # only what the new engine stored since
    finally:
        server.stop()
        await sub.stop()


def test_precise_prefix_predicts_shuniu_sim_serve_engines_hits_exactly(tmp_path: Path) -> None:
    """The real-vLLM exactness test (tests/test_kv_events_real.py) against two ``shuniu sim
    serve`` engines that tokenize with the model's tokenizer (``--tokenizer``) and publish
    events over ZMQ, reached as ``vllm`` endpoints: the same path, with the simulator."""
    pytest.importorskip("zmq")
    import httpx
    import openai

    from shuniu.core.api.openai import parse_request
    from shuniu.core.tokenization.local import LocalTokenizer
    from tests.conftest import GatewayProcess, start_gateway, wait_until
    from tests.kv_exactness import Cluster, exactness_scenario, table
    from tests.test_sim_serve import start_sim_server
    from tests.test_tokenization import CHATML, _english_tokenizer

    model = tmp_path / "model"
    model.mkdir()
    _english_tokenizer().save(str(model / "tokenizer.json"))
    (model / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>", "chat_template": CHATML}))
    tokenizer = LocalTokenizer.load(model)

    def ids(messages: list[dict[str, str]]) -> list[int]:
        req = parse_request(json.dumps({"model": "chat", "messages": messages}).encode(), "chat", "r", 0.0)
        prompt = tokenizer.prompt_text(req)
        assert prompt is not None
        text, special = prompt
        return tokenizer.ids_text(text, special_tokens=special)

    kv_ports = quiet_ports(2)  # bound by the engines seconds later

    def engine(port: int) -> GatewayProcess:
        config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}"}
        args = ["--served-model-name", "tiny", "--tokens-per-s", "0", "--tokenizer", str(model)]
        return start_sim_server(*args, "--kv-events-config", json.dumps({**config, "topic": "kv-events"}))

    servers = [engine(kp) for kp in kv_ports]
    endpoints = "\n".join(
        f"""      - kind: vllm
        name: e{k}
        options: {{base_url: "{srv.url}"}}
        kv_events: {{endpoint: "tcp://127.0.0.1:{kp}", topic: kv-events}}"""
        for k, (srv, kp) in enumerate(zip(servers, kv_ports, strict=True))
    )
    config = f"""
models:
  chat:
    tokenizer: {json.dumps(str(model))}
    health: {{interval_s: 0.2}}
    balancer: {{policy: precise_prefix, options: {{recent_s: 0.001}}}}
    endpoints:
{endpoints}
"""
    gw = start_gateway(config, tmp_path)
    try:

        def ready() -> bool:
            body = httpx.get(f"{gw.url}/ready", timeout=10).json()
            return all(e["healthy"] for e in body["models"]["chat"]["endpoints"])

        wait_until(ready, timeout=30)
        ports = {f"e{k}": int(srv.url.rsplit(":", 1)[1]) for k, srv in enumerate(servers)}
        cluster = Cluster(gw.url, ports, ids, 16)
        client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=60)
        sent = exactness_scenario(cluster, client)
        client.close()
        shown = table(sent)
        assert [s.expected for s in sent] == [s.hits for s in sent], shown
        assert {s.endpoint for s in sent} == set(ports), shown
        assert sum(s.hits for s in sent) > 0 and any(s.hits == 0 for s in sent), shown
        assert all(s.hits >= s.prompt_tokens // 2 for s in sent[9:]), shown
        # Every block the engines stored was keyed: none skipped, for either reason.
        metrics = httpx.get(f"{gw.url}/metrics", timeout=30).text
        name = "shuniu_kv_event_skipped_blocks_total"
        skipped = [line for line in metrics.splitlines() if line.startswith(name)]
        assert len(skipped) == 2 * len(ports) and all(line.endswith(" 0.0") for line in skipped), skipped
    finally:
        gw.stop()
        for srv in servers:
            srv.stop()
