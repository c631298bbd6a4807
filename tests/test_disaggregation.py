"""A prefill/decode split in the simulator (``backends/sim/disagg.py``) and in the planner:
a request is prefilled on a prefill engine, its KV sent over the link and decoded on a
decode engine; ``shuniu simulate`` and ``shuniu plan`` run such units like replicas. Engine
tests run on the virtual clock, so times are exact."""

from __future__ import annotations

import asyncio
import textwrap
from typing import Any

import pytest

from shuniu.backends.sim import (
    CostModel,
    DisaggregatedEngine,
    Seq,
    SimOptions,
    build_engine,
    load_hardware,
    load_model,
)
from shuniu.backends.sim.profiles import kv_bytes_per_token
from shuniu.core.config.loader import load_deployment
from shuniu.core.plugin_manager import load_plugins
from shuniu.core.traffic import load_workload
from shuniu.plugins.tools.plan import PlanError, plan
from shuniu.plugins.tools.simulate import run_virtual, simulate

H100 = load_hardware("h100-sxm")
L8 = load_model("llama-3.1-8b")
UNIT = {"hardware": "h100-sxm", "model": "llama-3.1-8b", "prefill_engines": 1, "decode_engines": 1}


def _unit(**options: Any) -> DisaggregatedEngine:
    engine = build_engine(SimOptions.model_validate({**UNIT, **options})).engine
    assert isinstance(engine, DisaggregatedEngine)
    return engine


def _seq(name: str, prompt: list[int], output: int) -> Seq:
    loop = asyncio.get_running_loop()
    seq = Seq(name, prompt, output, arrival=loop.time())
    seq.done = loop.create_future()
    return seq


def test_a_request_is_prefilled_sent_and_decoded_in_turn() -> None:
    cm = CostModel(L8, H100)
    n = 4000
    prefill = cm.step_time(n, n * n / 2, 0, 0, 1)
    transfer = 20e-6 + n * kv_bytes_per_token(L8) / 50e9  # one H100's 400 Gb/s NIC
    first = cm.step_time(1, n - 1 + 0.5, 0, 0, 1)  # the decode engine computes the last prompt token
    gap = cm.step_time(0, 0.0, 1, n + 1, 0)

    async def main() -> tuple[Seq, DisaggregatedEngine]:
        unit = _unit()
        seq = _seq("r", list(range(n)), 3)
        unit.submit(seq)
        await seq.done
        await unit.stop()
        return seq, unit

    seq, unit = run_virtual(main())
    assert seq.first_token_at is not None and seq.finished_at is not None
    front = H100.frontend_ms / 1000  # the serving front end, once per request (not again at decode)
    assert seq.first_token_at - seq.arrival == pytest.approx(front + prefill + transfer + first, rel=1e-9)
    assert seq.output_count == 3 and unit.transfers == 1
    assert unit.transfer_time == pytest.approx(transfer, rel=1e-9)
    assert seq.finished_at - seq.first_token_at == pytest.approx(
        gap + cm.step_time(0, 0.0, 1, n + 2, 0), rel=1e-9
    )
    (p,), (d,) = unit.prompt_cores, unit.output_cores
    assert p.generated_tokens == 1 and d.generated_tokens == 3  # the prefill's token is not the client's
    assert d.prefix_hits == 0  # transferred KV is not a prefix-cache hit
    load = unit.load()
    assert (load.running, load.waiting, load.generated_tokens) == (0, 0, 3)


@pytest.mark.parametrize("when", ["prefill", "transfer", "decode"])
def test_an_abort_reaches_the_request_wherever_it_is(when: str) -> None:
    cm = CostModel(L8, H100)
    n = 2000
    prefill = cm.step_time(n, n * n / 2, 0, 0, 1)

    async def main() -> tuple[DisaggregatedEngine, Seq, int]:
        unit = _unit(kv_transfer_gb_s=0.01)  # a slow link: 26 s to send 2,000 tokens' KV
        seq = _seq("r", list(range(n)), 50)
        unit.submit(seq)
        if when == "transfer":
            await asyncio.sleep(prefill + 1.0)
        elif when == "decode":
            seq.waiter = asyncio.get_running_loop().create_future()
            await seq.waiter  # the first token
        assert unit.phase(seq) == when
        unit.abort(seq)
        assert unit.phase(seq) is None
        await asyncio.wait_for(seq.done, 1)  # whoever waits is woken
        prefill_core, decode_core = unit.prefill[0].core, unit.decode[0].core
        running = len(prefill_core.running) + len(decode_core.running)
        await asyncio.sleep(60)  # a cancelled transfer never lands on the decode engine
        running += len(decode_core.running) + decode_core.num_waiting
        await unit.stop()
        return unit, seq, running

    unit, seq, running = run_virtual(main())
    assert running == 0 and seq.output_count < 50
    assert unit.transfers == (1 if when == "decode" else 0)


def test_the_prefill_engine_holding_the_prefix_takes_the_request() -> None:
    system = list(range(1, 3201))  # 200 blocks shared by every prompt

    async def main() -> DisaggregatedEngine:
        unit = _unit(prefill_engines=2, decode_engines=1)
        first = _seq("a", [*system, 90001, 90002], 2)
        unit.submit(first)
        await first.done
        rest = [_seq(f"b{i}", [*system, 91000 + i], 2) for i in range(4)]
        for seq in rest:
            unit.submit(seq)
            await seq.done
        await unit.stop()
        return unit

    unit = run_virtual(main())
    served = [core.completed for core in unit.prompt_cores]
    assert sorted(served) == [0, 5]  # all on the engine that cached the system prompt
    assert sum(core.prefix_hits for core in unit.prompt_cores) == 4 * 3200


PREFILL_HEAVY = """
name: rag
duration_s: 60
slo: {ttft_p99_s: 5.0, itl_p99_s: 0.05}
streams:
  - arrival: {rate: 4}
    input_tokens: 6000
    output_tokens: 60
"""


def _deployment(options: str, replicas: int) -> Any:
    text = textwrap.dedent(
        f"""
        models:
          m:
            balancer: {{policy: least_load}}
            endpoints:
              - kind: sim
                replicas: {replicas}
                max_concurrency: 0
                options: {options}
        """
    )
    return load_deployment(None, load_plugins(), text=text)


def test_a_split_keeps_long_prefills_out_of_decode_iterations() -> None:
    # Two engines either way: side by side, every decode iteration may carry a 2,048-token
    # prefill chunk; split, the decode engine only decodes.
    workload = load_workload("rag", text=PREFILL_HEAVY)
    engine = "hardware: h100-sxm, model: llama-3.1-8b, max_num_batched_tokens: 2048"
    colocated = simulate(_deployment(f"{{{engine}}}", 2), load_plugins(), workload, duration=60).summary()
    split = simulate(
        _deployment(f"{{{engine}, prefill_engines: 1, decode_engines: 1}}", 1),
        load_plugins(),
        workload,
        duration=60,
    )
    s = split.summary()
    assert s["requests_completed"] == s["requests_arrived"] == colocated["requests_completed"]
    assert s["itl_p99"] < 0.5 * colocated["itl_p99"]
    # every request counted once: its prompt on the prefill engine, its answer on the decode one
    assert split.generated_tokens == 60 * s["requests_completed"]
    assert split.prompt_tokens == 6000 * s["requests_completed"]


def test_the_planner_reads_and_tries_splits() -> None:
    workload = load_workload("rag", text=PREFILL_HEAVY)
    pins = {
        "balancer": "least_load",
        "max_num_batched_tokens": 2048,
        "max_num_seqs": 256,
        "weight_precision": "bf16",
        "kv_precision": "bf16",
        "prefix_caching": True,
        "tensor_parallel_size": 1,
    }
    result = plan("llama-3.1-8b", "h100-sxm", workload, duration=30, prefill_decode="1:1", **pins)
    rec = result.recommendation
    assert rec is not None and rec.config["prefill_engines"] == rec.config["decode_engines"] == 1
    assert rec.devices == 2 * rec.replicas and rec.engines == 2
    assert result.to_dict()["recommendation"]["prefill_engines"] == 1
    with pytest.raises(PlanError, match="--prefill-decode"):
        plan("llama-3.1-8b", "h100-sxm", workload, duration=30, prefill_decode="1-2", **pins)
