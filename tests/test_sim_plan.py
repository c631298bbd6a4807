"""``shuniu plan``: the replica / tensor-parallel search over simulated deployments, its KV
arithmetic, and the command line. Durations are kept short (20-40 simulated seconds)."""

from __future__ import annotations

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
from shuniu.plugins.tools.plan import PlanError, plan, plan_command

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


def _unique(result) -> None:  # type: ignore[no-untyped-def]
    keys = [(t.phase, t.tensor_parallel, t.replicas, t.duration_s, t.rate_scale) for t in result.tried]
    assert len(keys) == len(set(keys)), "a configuration was simulated twice"


def test_light_workload_is_one_replica() -> None:
    workload = _workload(2, LIGHT_SLO)
    result = plan("qwen2.5-7b", "h200", workload, duration=30)
    rec = result.recommendation
    assert rec is not None and result.met
    assert (rec.tensor_parallel, rec.replicas, rec.devices) == (1, 1, 1)
    assert rec.met and rec.ttft_p99 <= 1.0 and rec.itl_p99 <= 0.05
    assert result.tensor_parallel_sizes[0] == 1
    assert len(result.tried) == 1  # larger TP sizes cannot use fewer devices than one
    assert result.kv.tensor_parallel == 1
    assert any("left out" in note for note in result.notes)
    # a short search, then the answer confirmed over the full duration
    two = plan("qwen2.5-7b", "h200", workload, duration=30, search_duration=15)
    assert two.recommendation is not None and two.recommendation.phase == "confirm"
    assert two.recommendation.duration_s == 30 and two.devices == 1
    assert [t.phase for t in two.tried] == ["search", "confirm"]


def test_more_traffic_never_needs_fewer_devices() -> None:
    base = _workload(
        6,
        LIGHT_SLO,
        input_tokens="{dist: lognormal, mean: 1000, sigma: 0.5, min: 32, max: 4000}",
        output_tokens="{dist: lognormal, mean: 200, sigma: 0.5, min: 16, max: 800}",
    )
    devices = []
    for factor in (1, 2, 4):
        result = plan("llama-3.1-8b", "a100-80gb", base.scaled(factor), duration=20, tensor_parallel_size=1)
        assert result.recommendation is not None, result.notes
        assert result.recommendation.met
        _unique(result)
        # the answer is the smallest count: every smaller one tried at TP 1 missed the SLO
        assert all(
            not t.met
            for t in result.tried
            if t.phase != "floor" and t.replicas < result.recommendation.replicas
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
    result = plan("qwen2.5-7b", "h200", workload, duration=20)
    assert result.recommendation is None and not result.met
    assert "no configuration meets" in result.notes[0]
    assert any("can meet" in n and "unloaded" in n for n in result.notes[1:])
    # per TP size: two loaded trials and one unloaded floor, never a march to 64 replicas
    assert max(t.replicas for t in result.tried) <= 3
    assert len(result.tried) <= 3 * len(result.tensor_parallel_sizes)
    assert time.perf_counter() - started < 120
    # an ITL target below one decode iteration is found unreachable without simulating
    fast = _workload(2, "{itl_p99_s: 0.001}")
    quick = plan("qwen2.5-7b", "h200", fast, duration=20, tensor_parallel_size=1)
    assert quick.recommendation is None and quick.tried == []
    assert "one decode iteration" in quick.notes[1]


def test_70b_on_80gb_gpus_needs_tensor_parallelism() -> None:
    model, hw = load_model("llama-3.1-70b"), load_hardware("h100-sxm")
    workload = _workload(1, "{ttft_p99_s: 2.0, itl_p99_s: 0.1}", input_tokens="512", output_tokens="64")
    result = plan("llama-3.1-70b", "h100-sxm", workload, duration=20)
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
        plan("llama-3.1-70b", "rtx-4090", workload, duration=10)
    assert "does not fit" in str(info.value)
    with pytest.raises(PlanError):
        plan("llama-3.1-70b", "h100-sxm", workload, duration=10, tensor_parallel_size=2)
    no_slo = load_workload(
        "x", text="streams:\n  - arrival: {rate: 1}\n    input_tokens: 8\n    output_tokens: 8\n"
    )
    with pytest.raises(PlanError) as info:
        plan("qwen2.5-7b", "h200", no_slo, duration=10)
    assert "no SLO" in str(info.value)
    # an SLO given on the command line makes it plannable
    ok = plan("qwen2.5-7b", "h200", no_slo, duration=10, ttft_p99=1.0)
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
    ):
        res = runner.invoke(plan_command, bad)
        assert res.exit_code == 2, res.output
        assert isinstance(res.exception, SystemExit) and "problem" in res.stderr
    unfit = ["--model", "llama-3.1-70b", "--hardware", "rtx-4090", "--workload", str(wl)]
    res = subprocess.run([sys.executable, "-c", CLI, *unfit], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and "does not fit" in res.stderr

    # nothing meets: exit code 1, still one JSON object
    res = runner.invoke(plan_command, [*args, "--itl-p99", "0.001", "--tensor-parallel-size", "1"])
    assert res.exit_code == 1
    data = json.loads(res.output)
    assert data["met"] is False and data["recommendation"] is None
