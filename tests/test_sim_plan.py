"""``shuniu plan``: the replica / tensor-parallel search over simulated deployments, its KV
arithmetic, and the command line. Durations are kept short (20-40 simulated seconds)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from shuniu.backends.sim.costmodel import CostModel
from shuniu.backends.sim.profiles import kv_report, load_hardware, load_model, min_tensor_parallel
from shuniu.core.traffic import load_workload
from shuniu.plugins.tools.plan import PlanError, Trial, plan, plan_command
from shuniu.plugins.tools.plan.steady import warmup_s

WORKLOADS = Path(__file__).resolve().parent.parent / "examples" / "workloads"
CLI = "from shuniu.plugins.tools.plan import plan_command; plan_command()"


def _workload(
    rate: float, slo: str, input_tokens: str = "256", output_tokens: str = "64", duration: int = 30
):
    text = textwrap.dedent(
        f"""
        name: inline
        duration_s: {duration}
        slo: {slo}
        streams:
          - arrival: {{process: poisson, rate: {rate}}}
            input_tokens: {input_tokens}
            output_tokens: {output_tokens}
        """
    )
    return load_workload("inline", text=text)


LIGHT_SLO = "{ttft_p99_s: 1.0, itl_p99_s: 0.05}"


def _long_prompts(rate: float):  # type: ignore[no-untyped-def]
    """Prompts of 3,000-6,000 tokens, 64-token answers and a tight ITL target (25 ms): an
    iteration that carries an 8k-token prefill chunk is far slower than the target, so only
    small chunks can meet it, whatever the count."""
    return _workload(
        rate,
        "{ttft_p99_s: 2.0, itl_p99_s: 0.025}",
        input_tokens="{dist: uniform, min: 3000, max: 6000}",
        output_tokens="64",
    )


PINNED = {
    "balancer": "round_robin",
    "max_num_batched_tokens": 8192,
    "max_num_seqs": 256,
    "weight_precision": "bf16",
    "kv_precision": "bf16",
    "prefix_caching": True,
    "prefill_decode": "off",
}
"""Every knob but the TP size pinned: the replica search alone."""


def _unique(result) -> None:  # type: ignore[no-untyped-def]
    keys = [(t.label, t.replicas, t.duration_s, t.rate_scale, t.seed) for t in result.tried]
    assert len(keys) == len(set(keys)), "a configuration was simulated twice"


def test_light_workload_is_one_replica() -> None:
    workload = _workload(2, LIGHT_SLO)
    result = plan("qwen2.5-7b", "h200", workload, duration=30)
    rec = result.recommendation
    assert rec is not None and result.met
    assert (rec.tensor_parallel, rec.replicas, rec.devices) == (1, 1, 1)
    assert rec.met and rec.ttft_p99 <= 1.0 and rec.itl_p99 <= 0.05
    assert result.tensor_parallel_sizes[0] == 1
    # one replica of one device is the cheapest there is: no other knob value is simulated,
    # each is set aside with the reason
    assert [t.phase for t in result.tried] == ["search", "confirm"]
    assert result.rejected and all("costs as much as the best" in r.reason for r in result.rejected)
    assert {r.change.split()[0] for r in result.rejected} >= {"balancer", "chunk", "TP", "max_num_seqs"}
    # at the same cost the model's own precision wins: no quality cost to state
    assert rec.config["weight_precision"] == "bf16" and result.quality is None
    # the answer is confirmed over the full duration on another sample of the workload
    assert rec.phase == "confirm" and rec.duration_s == 30 and rec.seed == 1
    assert result.tried[0].seed == 0 and result.tried[0].duration_s == 30
    _unique(result)


def test_more_traffic_never_needs_fewer_devices() -> None:
    base = _workload(
        6,
        LIGHT_SLO,
        input_tokens="{dist: lognormal, mean: 1000, sigma: 0.5, min: 32, max: 4000}",
        output_tokens="{dist: lognormal, mean: 200, sigma: 0.5, min: 16, max: 800}",
    )
    devices = []
    for factor in (1, 2, 4):
        result = plan(
            "llama-3.1-8b", "a100-80gb", base.scaled(factor), duration=20, tensor_parallel_size=1, **PINNED
        )
        assert result.recommendation is not None, result.notes
        assert result.recommendation.met
        _unique(result)
        # the answer is the smallest count: every smaller one tried at TP 1 missed the SLO
        assert all(
            not t.met
            for t in result.tried
            if t.phase != "floor" and t.replicas < result.recommendation.replicas and t.seed == 1
        )
        devices.append(result.devices)
    assert devices == sorted(devices), devices
    assert devices[-1] > devices[0], devices


def test_unreachable_slo_is_reported_without_a_long_search() -> None:
    model, hw = load_model("qwen2.5-7b"), load_hardware("h200")
    # every request needs a 4,000-token prefill; ask for a TTFT below half of it even at TP 4
    target = CostModel(model, hw, 4).prefill_time(4000) / 2
    workload = _workload(2, f"{{ttft_p99_s: {target:.4f}}}", input_tokens="4000", output_tokens="16")
    started = time.perf_counter()
    result = plan("qwen2.5-7b", "h200", workload, duration=20, **PINNED)
    assert result.recommendation is None and not result.met
    assert "no configuration meets" in result.notes[0]
    assert any("unloaded" in r.reason for r in result.rejected)
    # per TP size: two loaded trials and one unloaded floor, never a march to 64 replicas
    assert max(t.replicas for t in result.tried) <= 3
    assert len(result.tried) <= 3 * len(result.tensor_parallel_sizes)
    assert time.perf_counter() - started < 120
    # an ITL target below one decode iteration is found unreachable without simulating
    fast = _workload(2, "{itl_p99_s: 0.001}")
    quick = plan("qwen2.5-7b", "h200", fast, duration=20, tensor_parallel_size=1, **PINNED)
    assert quick.recommendation is None and quick.tried == []
    assert "one decode iteration" in quick.rejected[0].reason


def test_70b_on_80gb_gpus_needs_tensor_parallelism() -> None:
    model, hw = load_model("llama-3.1-70b"), load_hardware("h100-sxm")
    workload = _workload(1, "{ttft_p99_s: 2.0, itl_p99_s: 0.1}", input_tokens="512", output_tokens="64")
    result = plan("llama-3.1-70b", "h100-sxm", workload, duration=20, **PINNED)
    rec = result.recommendation
    assert rec is not None
    assert rec.tensor_parallel >= 2
    assert result.tensor_parallel_sizes[0] == min_tensor_parallel(model, hw) >= 2
    assert all(t.tensor_parallel >= 2 for t in result.tried)
    assert rec.devices == rec.tensor_parallel * rec.replicas
    # the KV arithmetic is kv_report's, at the recommended TP and the workload's lengths
    assert result.kv == kv_report(
        model, hw, input_tokens=512, output_tokens=64, tp=rec.tensor_parallel, max_num_seqs=256
    )
    kv = result.kv
    assert kv.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2  # layers x KV heads x head_dim x BF16
    assert kv.kv_bytes_per_request == kv.kv_bytes_per_token * 576  # 36 blocks of 16
    assert result.kv_room_seqs == kv.kv_blocks // 36
    assert kv.max_concurrent_seqs == min(256, result.kv_room_seqs)


def test_inputs_that_cannot_be_planned() -> None:
    workload = _workload(1, LIGHT_SLO)
    with pytest.raises(PlanError) as info:
        plan("llama-3.1-70b", "rtx-4090", workload, duration=10, weight_precision="bf16", kv_precision="bf16")
    assert "does not fit" in str(info.value)
    with pytest.raises(PlanError):
        plan(
            "llama-3.1-70b",
            "h100-sxm",
            workload,
            duration=10,
            tensor_parallel_size=2,
            weight_precision="bf16",
        )
    with pytest.raises(PlanError) as info:
        plan("qwen2.5-7b", "h200", workload, duration=10, weight_precision="int3")
    assert "--weight-precision" in str(info.value) and "int3" in str(info.value)
    no_slo = load_workload(
        "x", text="streams:\n  - arrival: {rate: 1}\n    input_tokens: 8\n    output_tokens: 8\n"
    )
    with pytest.raises(PlanError) as info:
        plan("qwen2.5-7b", "h200", no_slo, duration=10)
    assert "no SLO" in str(info.value)
    # an SLO given on the command line makes it plannable
    ok = plan("qwen2.5-7b", "h200", no_slo, duration=10, ttft_p99=1.0, **PINNED)
    assert ok.devices == 1 and ok.slo == {"ttft_p99_s": 1.0}


def test_cli_json(tmp_path: Path) -> None:
    wl = tmp_path / "w.yaml"
    wl.write_text(
        "name: w\nduration_s: 20\nslo: {ttft_p99_s: 1.0, itl_p99_s: 0.05, ttft_s: 1.0}\n"
        "streams:\n  - arrival: {rate: 3}\n    input_tokens: 300\n    output_tokens: 50\n"
    )
    args = ["--model", "qwen2.5-7b", "--hardware", "h200", "--workload", str(wl), "--json"]
    out = subprocess.run([sys.executable, "-c", CLI, *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    rec = data["recommendation"]
    assert data["met"] is True and rec["replicas"] == 1 and rec["devices"] == 1
    assert rec["tensor_parallel_size"] == 1 and rec["ttft_p99"] <= 1.0
    assert data["goodput_target"] == 0.99  # the SLO has its own per-request threshold
    assert data["tried"] and data["tried"][0]["met"] is True
    for key in ("kv_bytes_per_token", "kv_bytes_per_request", "kv_cache_tokens", "max_concurrent_seqs"):
        assert data["kv"][key] > 0
    assert data["kv"]["input_tokens"] == 300 and data["kv"]["output_tokens"] == 50

    # tables, through click's runner
    runner = CliRunner()
    shown = runner.invoke(plan_command, [a for a in args if a != "--json"])
    assert shown.exit_code == 0, shown.output
    assert "Recommendation" in shown.output and "KV bytes per token" in shown.output
    assert "max concurrent sequences" in shown.output

    # bad input: exit code 2, a message, no traceback
    for bad in (
        ["--model", "no-such-model", "--hardware", "h200", "--workload", str(wl)],
        ["--model", "qwen2.5-7b", "--hardware", "h200", "--workload", str(tmp_path / "missing.yaml")],
        ["--model", "qwen2.5-7b", "--hardware", "h200", "--workload", str(wl), "--balancer", "nope"],
        ["--model", "qwen2.5-7b", "--hardware", "h200", "--workload", str(wl), "--max-num-seqs", "many"],
        ["--model", "qwen2.5-7b", "--hardware", "h200", "--workload", str(wl), "--precision", "int3"],
        ["--model", "qwen2.5-7b", "--hardware", "h200", "--workload", str(wl), "--price", "-1"],
    ):
        res = runner.invoke(plan_command, bad)
        assert res.exit_code == 2, res.output
        assert isinstance(res.exception, SystemExit) and "problem" in res.stderr
    unfit = [
        "--model",
        "llama-3.1-70b",
        "--hardware",
        "rtx-4090",
        "--workload",
        str(wl),
        "--precision",
        "bf16",
        "--kv-precision",
        "bf16",
    ]
    res = subprocess.run([sys.executable, "-c", CLI, *unfit], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and "does not fit" in res.stderr

    # nothing meets: exit code 1, still one JSON object
    res = runner.invoke(plan_command, [*args, "--itl-p99", "0.001", "--tensor-parallel-size", "1"])
    assert res.exit_code == 1
    data = json.loads(res.output)
    assert data["met"] is False and data["recommendation"] is None


def test_the_knobs_an_expert_would_tune() -> None:
    # Long prompts and a tight ITL target: an iteration that carries an 8k-token prefill chunk
    # is far slower than the target, so only small chunks can meet it, whatever the count.
    workload = _long_prompts(30)
    pins = {**PINNED, "max_num_batched_tokens": [512, 8192]}
    result = plan(
        "llama-3.1-8b", "h100-sxm", workload, duration=30, tensor_parallel_size=1, price=2.0, **pins
    )
    rec = result.recommendation
    assert rec is not None, (result.notes, result.rejected)
    assert rec.config["max_num_batched_tokens"] == 512
    big = [r for r in result.rejected if r.change == "chunk 8192"]
    assert big and "ITL p99" in big[0].reason, result.rejected
    # costs are devices x hours x the price given
    assert all(t.cost_per_hour == pytest.approx(t.devices * 2.0) for t in result.tried)
    assert result.price_per_hour == 2.0
    # the frontier: no search trial that ran to its end is cheaper and faster at both p99s
    # than a frontier point, and none stopped early is on it (its p99s are partial)
    searched = [
        t
        for t in result.tried
        if t.phase in ("search", "probe") and t.rate_scale == 1.0 and t.stopped_at is None
    ]
    assert result.frontier and all(f.stopped_at is None for f in result.frontier)
    for f in result.frontier:
        assert not any(
            (t.cost_per_hour, t.ttft_p99, t.itl_p99) != (f.cost_per_hour, f.ttft_p99, f.itl_p99)
            and t.cost_per_hour <= f.cost_per_hour
            and t.ttft_p99 <= f.ttft_p99
            and t.itl_p99 <= f.itl_p99
            for t in searched
        )
    _unique(result)


def test_a_larger_chunk_is_settled_by_a_smaller_one_missing_the_itl_target() -> None:
    # The start is the 512-token chunk (the largest whose iteration fits the ITL target);
    # 2048 misses the ITL target, so 8192, which only lengthens the iterations that carry a
    # chunk further, is rejected with that reason and never simulated.
    workload = _long_prompts(30)
    pins = {**PINNED, "max_num_batched_tokens": [512, 2048, 8192]}
    result = plan("llama-3.1-8b", "h100-sxm", workload, duration=30, tensor_parallel_size=1, **pins)
    assert result.recommendation is not None and result.recommendation.config["max_num_batched_tokens"] == 512
    reasons = {r.change: r.reason for r in result.rejected}
    assert "ITL p99" in reasons["chunk 2048"] and not reasons["chunk 2048"].startswith("chunk")
    assert reasons["chunk 8192"].startswith("chunk 2048 already missed at"), reasons
    assert not [t for t in result.tried if t.config["max_num_batched_tokens"] == 8192]
    _unique(result)


def test_a_chunk_below_the_sequence_limit_lowers_the_limit_to_fit() -> None:
    # vLLM refuses max_num_batched_tokens < max_num_seqs: the 128-token chunk is tried with
    # 128 sequences (the largest allowed value within it), not skipped.
    workload = _workload(5, LIGHT_SLO, duration=20)
    pins = {**PINNED, "max_num_batched_tokens": [128, 8192], "max_num_seqs": [64, 128, 256]}
    result = plan("llama-3.1-8b", "h100-sxm", workload, duration=20, tensor_parallel_size=1, **pins)
    small = [t for t in result.tried if t.config["max_num_batched_tokens"] == 128]
    assert small and {t.config["max_num_seqs"] for t in small} == {128}, [t.label for t in result.tried]
    assert all(t.config["max_num_seqs"] <= t.config["max_num_batched_tokens"] for t in result.tried)


def test_a_missed_confirmation_grows_to_the_nearest_count(monkeypatch: pytest.MonkeyPatch) -> None:
    # The search's verdicts are replaced (5 replicas meet the short run, 6 the full one) to
    # follow the confirmation alone: a miss at 5 grows by 1.25x to the nearest count, 6, not
    # to 7 (a full-duration run more) and back.
    from shuniu.plugins.tools.plan.search import Planner

    real_run = Planner.run

    def run(self, phase, shape, replicas, horizon, scale=1.0, seed=None):  # type: ignore[no-untyped-def]
        trial = real_run(self, phase, shape, replicas, horizon, scale, seed)
        if phase == "floor":
            return trial
        met = replicas >= (6 if phase == "confirm" else 5)
        failures = [] if met else ["TTFT p99 9 s > 1 s (9x)"]
        return dataclasses.replace(trial, met=met, failures=failures, worst=0.5 if met else 9.0)

    monkeypatch.setattr(Planner, "run", run)
    pins = {**PINNED, "balancer": "least_load"}
    result = plan(
        "llama-3.1-8b",
        "h100-sxm",
        _workload(2, LIGHT_SLO, duration=20),
        duration=20,
        tensor_parallel_size=1,
        **pins,
    )
    confirms = [t.replicas for t in result.tried if t.phase == "confirm"]
    assert confirms == [5, 6], confirms
    assert result.recommendation is not None and result.recommendation.replicas == 6


def test_trials_side_by_side_give_the_same_answer(tmp_path: Path) -> None:
    # The knob probes (and the confirmations) run in two worker processes: the same trials
    # are judged the same way, so the answer and the reasons do not change.
    workload = _long_prompts(20)
    pins = {**PINNED, "max_num_batched_tokens": [512, 8192], "balancer": "round_robin,least_load"}
    alone = plan("llama-3.1-8b", "h100-sxm", workload, duration=30, tensor_parallel_size=1, jobs=1, **pins)
    paired = plan("llama-3.1-8b", "h100-sxm", workload, duration=30, tensor_parallel_size=1, jobs=2, **pins)
    assert alone.recommendation is not None and paired.recommendation is not None
    assert paired.recommendation.label == alone.recommendation.label
    assert paired.recommendation.replicas == alone.recommendation.replicas
    assert paired.recommendation.ttft_p99 == alone.recommendation.ttft_p99
    assert {r.change for r in paired.rejected} == {r.change for r in alone.rejected}
    # the frontier as a PNG
    from shuniu.plugins.tools.plan.frontier import plot_frontier

    png = tmp_path / "frontier.png"
    plot_frontier(paired, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_more_replicas_that_do_not_help_stop_the_growth() -> None:
    # The rule itself, on two measured-looking trials: half again as many replicas that leave
    # a missed ITL p99 within 10% of where it was stop the growth, with the reason kept.
    workload = _workload(8, "{ttft_p99_s: 5.0, itl_p99_s: 0.05}")
    planner, shape = _planner(workload)

    def trial(replicas: int, itl: float) -> Trial:
        return Trial(
            "search", 1, replicas, 30, 1.0, 0.1, 0.5, itl, 5.0, None, 1.0, 100, 100, 0, 0, 0.0, False
        )

    assert planner._saturated(shape, trial(11, 0.076), trial(33, 0.0753))
    assert "more replicas do not help" in (planner.unreachable(shape, run=False) or "")
    planner, shape = _planner(workload)
    assert not planner._saturated(shape, trial(11, 0.076), trial(33, 0.060))  # it still helps
    assert not planner._saturated(shape, trial(11, 0.076), trial(14, 0.0753))  # too few more to tell
    assert not planner._saturated(shape, trial(11, 0.040), trial(33, 0.045))  # the ITL is met


def _planner(workload):  # type: ignore[no-untyped-def]
    from shuniu.backends.sim.profiles import load_hardware, load_model
    from shuniu.core.plugin_manager import load_plugins
    from shuniu.core.traffic import describe
    from shuniu.plugins.tools.plan.results import PlanReporter
    from shuniu.plugins.tools.plan.search import Planner
    from shuniu.plugins.tools.plan.shapes import Space

    model, hw = load_model("llama-3.1-8b"), load_hardware("h100-sxm")
    space = Space(
        model,
        "llama-3.1-8b",
        hw,
        util=0.9,
        max_model_len=None,
        tensor_parallel=1,
        weight_precisions=None,
        kv_precisions=None,
        chunks=None,
        max_num_seqs=None,
        prefix_caching=None,
        balancers=None,
        shared_prefixes=False,
    )
    planner = Planner(
        space=space,
        hardware="h100-sxm",
        workload=workload,
        desc=describe(workload, 30),
        duration=30,
        search_duration=30,
        seed=0,
        max_replicas=64,
        goodput_target=None,
        price=None,
        max_model_len=None,
        plugins=load_plugins(),
        reporter=PlanReporter(),
    )
    return planner, space.base(0.05, 32)


def test_a_lower_precision_is_chosen_only_with_its_quality_cost() -> None:
    # qwen2.5-72b in BF16 needs 4 x H100; in INT4 one replica spans 2
    workload = _workload(0.5, "{ttft_p99_s: 3.0, itl_p99_s: 0.2}", input_tokens="256", output_tokens="32")
    pins = {k: v for k, v in PINNED.items() if k != "weight_precision"}
    result = plan(
        "qwen2.5-72b",
        "h100-sxm",
        workload,
        duration=20,
        weight_precision="bf16,int4-awq",
        max_model_len=8192,
        **pins,
    )
    rec = result.recommendation
    assert rec is not None
    assert rec.config["weight_precision"] == "int4-awq" and rec.devices < 4
    assert result.quality is not None and "INT4" in result.quality
    # ...and the answer at the model's own precision is there to compare
    assert result.native is not None and result.native.config["weight_precision"] == "bf16"
    assert result.native.devices > rec.devices


def test_growing_workloads_are_searched_past_their_warm_up() -> None:
    chat = load_workload(WORKLOADS / "chat-shared-prefix.yaml")
    warm = warmup_s(chat, 600)
    assert 30 < warm < 300  # conversations lengthen over several think times
    assert warmup_s(load_workload(WORKLOADS / "poisson-simple.yaml"), 600) == 0.0
    # a load that doubles at 100 s settles there
    step = load_workload(
        "step",
        text="name: step\nduration_s: 300\nstreams:\n"
        "  - arrival: {rate: 4}\n    input_tokens: 100\n    output_tokens: 10\n"
        "  - arrival: {schedule: [{at_s: 0, rate: 0.001}, {at_s: 100, rate: 4}]}\n"
        "    input_tokens: 100\n    output_tokens: 10\n",
    )
    assert 80 <= warmup_s(step, 300) <= 110
