"""Pipeline parallelism in the simulator and the planner: a model that fits no node is split
into stages of a node each (``pipeline_parallel_size``), with the KV room, iteration times,
engine and plan that follow."""

from __future__ import annotations

import textwrap

import pytest

from shuniu.backends.sim import (
    CostModel,
    SimOptions,
    build_engine,
    kv_cache_tokens,
    load_hardware,
    load_model,
    min_tensor_parallel,
    pipeline_split,
)
from shuniu.backends.sim.profiles import default_overhead_bytes
from shuniu.core.traffic import load_workload
from shuniu.plugins.tools.plan import PlanError, plan
from shuniu.plugins.tools.plan.candidates import tp_candidates

H100 = load_hardware("h100-sxm")
L405 = load_model("llama-3.1-405b")
L70 = load_model("llama-3.1-70b")


def test_a_model_larger_than_a_node_is_split_into_the_fewest_stages() -> None:
    # 810 GB of bf16 weights against 8 x 80 GB: no tensor-parallel size holds them...
    assert min_tensor_parallel(L405, H100) is None
    assert kv_cache_tokens(L405, H100, 8) == 0
    # ...two nodes do, and every stage adds a node's memory (less its runtime overhead) to
    # the KV cache
    assert pipeline_split(L405, H100) == (8, 2)
    two, three = kv_cache_tokens(L405, H100, 8, pp=2), kv_cache_tokens(L405, H100, 8, pp=3)
    per_token = 2 * 126 * 8 * 128 * 2  # layers x KV heads x head_dim x bf16, over the replica
    node = H100.memory_bytes * 0.9 * 8 - default_overhead_bytes(L405, 8)
    assert two > 0 and abs((three - two) * per_token - node) <= per_token
    # FP8 weights fit one node; a box that stays one box has no split
    assert min_tensor_parallel(load_model("llama-3.1-405b@fp8"), H100) == 8
    assert pipeline_split(L405, load_hardware("rtx-4090")) is None


def test_the_share_of_a_turn_on_its_critical_path() -> None:
    cm = CostModel(L70, H100, 4, 2)
    assert cm.pipeline_share(0, 1) == 1.0  # a lone sequence overlaps with nothing
    assert cm.pipeline_share(0, 8) == 0.5  # a full pipeline: half the tokens per stage turn
    assert cm.pipeline_share(0, 3) == pytest.approx(2 / 3)  # microbatches of 2 and 1
    assert cm.pipeline_share(1000, 10) == pytest.approx(1000 / 1010)  # the prefill chunk's microbatch
    assert CostModel(L70, H100, 4).pipeline_share(0, 8) == 1.0


def test_stages_add_throughput_and_memory_not_single_request_speed() -> None:
    one, two = CostModel(L70, H100, 4), CostModel(L70, H100, 4, 2)
    # A lone request runs through both stages one after the other: as slow as on one node,
    # plus the hops between them.
    assert two.prefill_time(2000) >= one.prefill_time(2000)
    assert two.prefill_time(2000) < 1.05 * one.prefill_time(2000)
    assert two.decode_time(1, 1000) >= one.decode_time(1, 1000)
    # Many decoding sequences fill the pipeline: each stage works on half of them at a time,
    # so a sequence more costs half as much.
    marginal_one = one.decode_time(256, 1000) - one.decode_time(2, 1000)
    marginal_two = two.decode_time(256, 1000) - two.decode_time(2, 1000)
    assert 0.45 * marginal_one < marginal_two < 0.6 * marginal_one
    # Weight reads are not shared: a small decode batch gains (almost) nothing.
    assert two.decode_time(2, 1000) > 0.9 * one.decode_time(2, 1000)
    # Beyond the hardware's stages, or a model's layers, there is no split.
    with pytest.raises(ValueError, match="pipeline stages"):
        CostModel(L70, H100, 4, 5)
    with pytest.raises(ValueError, match="layers"):
        CostModel(load_model("tiny-llama"), load_hardware("h100-sxm"), 1, 4 * 1000)


def test_the_sim_backend_runs_a_split_replica() -> None:
    options = {"hardware": "h100-sxm", "model": "llama-3.1-405b", "tensor_parallel_size": 8}
    with pytest.raises(ValueError, match="does not fit on 8 x h100-sxm"):
        build_engine(SimOptions.model_validate(options))
    setup = build_engine(SimOptions.model_validate({**options, "pipeline_parallel_size": 2}))
    assert "TP 8 x PP 2" in setup.description and "16x h100-sxm" in setup.description
    assert setup.engine.core.config.num_blocks * 16 <= kv_cache_tokens(L405, H100, 8, pp=2)


def test_the_planner_splits_only_what_fits_no_node() -> None:
    assert tp_candidates(L405, H100, 0.9, 8192, None) == [(8, 2)]
    # three stages pinned: the smallest TP size that holds the model over three nodes
    assert tp_candidates(L405, H100, 0.9, 8192, None, 3) == [(4, 3)]
    assert tp_candidates(L405, H100, 0.9, 8192, 8, 3) == [(8, 3)]
    assert all(pp == 1 for _, pp in tp_candidates(L70, H100, 0.9, 8192, None))
    with pytest.raises(PlanError, match="--pipeline-parallel-size"):
        tp_candidates(L405, H100, 0.9, 8192, None, 9)


def test_a_plan_for_a_model_larger_than_a_node_recommends_stages() -> None:
    workload = load_workload(
        "inline",
        text=textwrap.dedent(
            """
            name: inline
            duration_s: 20
            slo: {ttft_p99_s: 3.0, itl_p99_s: 0.2}
            streams:
              - arrival: {process: poisson, rate: 0.5}
                input_tokens: 512
                output_tokens: 32
            """
        ),
    )
    result = plan(
        "llama-3.1-405b",
        "h100-sxm",
        workload,
        duration=20,
        max_model_len=8192,
        balancer="round_robin",
        max_num_batched_tokens=8192,
        max_num_seqs=256,
        weight_precision="bf16",
        kv_precision="bf16",
        prefix_caching=True,
    )
    rec = result.recommendation
    assert rec is not None
    assert (rec.tensor_parallel, rec.pipeline_parallel) == (8, 2)
    assert rec.devices == 16 * rec.replicas and rec.config["pipeline_parallel"] == 2
    assert result.kv.pipeline_parallel == 2 and result.kv.kv_cache_tokens == kv_cache_tokens(
        L405, H100, 8, pp=2
    )
    assert result.to_dict()["recommendation"]["pipeline_parallel_size"] == 2
