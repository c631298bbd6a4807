"""``shuniu simulate``: the deployment's own scheduler and balancer over simulated engines in
virtual time, checked against what the engine model implies."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from shuniu.backends.sim import compiled_modules
from shuniu.core.config.loader import load_deployment
from shuniu.core.errors import ConfigError
from shuniu.core.plugin_manager import load_plugins
from shuniu.core.traffic import load_workload
from shuniu.plugins.tools.simulate import StopRule, simulate

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ROOT / "examples" / "workloads"


def _deployment(options: str, replicas: int = 2, extra: str = "", slots: int = 0) -> object:
    text = textwrap.dedent(
        f"""
        models:
          m:
            {extra}
            endpoints:
              - kind: sim
                replicas: {replicas}
                max_concurrency: {slots}
                options: {options}
        """
    )
    return load_deployment(None, load_plugins(), text=text)


LIGHT = """
name: light
duration_s: 60
slo: {ttft_p99_s: 0.5, itl_p99_s: 0.05}
streams:
  - arrival: {rate: 2}
    input_tokens: 64
    output_tokens: 20
"""


def test_light_load_matches_the_fixed_rate_engine() -> None:
    # 50 tokens/s per request, 10 ms fixed delay, instant prefill: at 2 requests/s nothing
    # queues, so TTFT = delay + one iteration and every gap is one iteration.
    resolved = _deployment("{ttft_ms: 10, tokens_per_s: 50, prefill_tokens_per_s: 0}")
    result = simulate(resolved, load_plugins(), load_workload("light", text=LIGHT), duration=60)
    s = result.summary()
    assert s["requests_completed"] == s["requests_arrived"] > 60
    assert s["ttft_p50"] == pytest.approx(0.030, rel=0.02)
    assert s["itl_p50"] == pytest.approx(0.020, rel=0.02) and s["itl_p99"] == pytest.approx(0.020, rel=0.02)
    assert s["e2e_p50"] == pytest.approx(0.030 + 19 * 0.020, rel=0.02)
    assert s["goodput"] == 1.0 and s["rejected"] == 0
    assert result.generated_tokens == 20 * s["requests_completed"]
    # round_robin alternates between the two replicas
    done = [e["completed"] for e in s["per_endpoint"].values()]
    assert abs(done[0] - done[1]) <= 1


def test_same_seed_same_result_and_wall_time_is_small() -> None:
    resolved = _deployment("{hardware: h200, model: qwen2.5-7b}", replicas=2)
    workload = load_workload(WORKLOADS / "poisson-simple.yaml")
    a = simulate(resolved, load_plugins(), workload, duration=30, seed=3).summary()
    b = simulate(resolved, load_plugins(), workload, duration=30, seed=3).summary()
    for key in ("ttft_p99", "itl_p50", "requests_completed", "throughput_tokens_per_s"):
        assert a[key] == b[key]
    assert a["sim_time_s"] >= 30


def test_a_run_raises_the_collectors_threshold_for_its_duration_only() -> None:
    # The run's young-generation threshold is its own; the process gets its own back, also
    # when the run fails.
    seen: list[tuple[int, int, int]] = []
    before = gc.get_threshold()
    resolved = _deployment("{hardware: h200, model: qwen2.5-7b}", replicas=1)
    workload = load_workload(WORKLOADS / "chat-shared-prefix.yaml")
    # the progress callback runs inside the run, every 256 requests
    simulate(
        resolved, load_plugins(), workload, duration=60, progress=lambda t, n: seen.append(gc.get_threshold())
    )
    assert gc.get_threshold() == before
    assert seen and all(t == (20_000, *before[1:]) for t in seen)
    with pytest.raises(ConfigError):
        simulate(resolved, load_plugins(), load_workload("light", text=LIGHT), duration=30, model="nope")
    assert gc.get_threshold() == before


def test_shared_prefix_chat_hits_the_prefix_cache() -> None:
    resolved = _deployment("{hardware: h200, model: qwen2.5-7b}", replicas=1)
    workload = load_workload(WORKLOADS / "chat-shared-prefix.yaml")
    s = simulate(resolved, load_plugins(), workload, duration=60).summary()
    assert s["prefix_hit_rate"] > 0.5  # system prompts and conversation history are reused
    off = _deployment("{hardware: h200, model: qwen2.5-7b, enable_prefix_caching: false}", replicas=1)
    s_off = simulate(off, load_plugins(), workload, duration=60).summary()
    assert s_off["prefix_hit_rate"] == 0.0
    assert s_off["ttft_p50"] > s["ttft_p50"]


def test_overload_queues_in_the_gateway_and_sheds() -> None:
    # One slow replica with 4 slots and a short gateway queue: the scheduler refuses the rest.
    resolved = _deployment(
        "{ttft_ms: 0, tokens_per_s: 10, prefill_tokens_per_s: 0}",
        replicas=1,
        extra="scheduler: {policy: fifo, options: {max_queue: 4, max_wait_s: 1}}",
        slots=4,
    )
    text = LIGHT.replace("rate: 2", "rate: 20")
    s = simulate(resolved, load_plugins(), load_workload("heavy", text=text), duration=20).summary()
    assert s["rejected"] > 0
    assert set(s["rejected_by_code"]) <= {"queue_full", "queue_timeout"}
    assert s["requests_completed"] + s["rejected"] == s["requests_arrived"]
    assert s["goodput"] < 0.5


def test_non_sim_endpoints_are_refused() -> None:
    resolved = load_deployment(
        None,
        load_plugins(),
        text="models:\n  m:\n    endpoints: [{kind: openai, options: {base_url: 'http://127.0.0.1:9/v1'}}]\n",
    )
    with pytest.raises(ConfigError) as info:
        simulate(resolved, load_plugins(), load_workload("light", text=LIGHT), duration=5)
    assert info.value.problems[0].path == "models.m.endpoints[0].kind"


def test_cli_json(tmp_path: Path) -> None:
    dep = tmp_path / "d.yaml"
    dep.write_text(
        "models:\n  m:\n    endpoints:\n"
        "      - {kind: sim, replicas: 2, options: {hardware: h100-sxm, model: llama-3.1-8b}}\n"
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "shuniu.core",
            "simulate",
            str(dep),
            "-w",
            str(WORKLOADS / "long-short-mix.yaml"),
            "--duration",
            "20",
            "--rate-scale",
            "0.5",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout)
    for key in (
        "ttft_p50",
        "ttft_p99",
        "itl_p50",
        "itl_p99",
        "e2e_p99",
        "throughput_tokens_per_s",
        "requests_completed",
        "goodput",
        "prefix_hit_rate",
        "preemptions",
        "rejected",
    ):
        assert key in s
    assert s["requests_completed"] > 0
    bad = subprocess.run(
        [sys.executable, "-m", "shuniu.core", "simulate", str(dep), "-w", str(dep)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_plot_over_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    resolved = _deployment("{ttft_ms: 10, tokens_per_s: 50, prefill_tokens_per_s: 0}")
    result = simulate(resolved, load_plugins(), load_workload("light", text=LIGHT), duration=60)
    # Every completed request lands in one arrival window.
    assert sum(w[0].count for w in result.timeline.values()) == result.requests_completed
    assert max(result.timeline) * result.window_s < 60
    from shuniu.plugins.tools.simulate import plot_timeline

    out = tmp_path / "latency.png"
    plot_timeline(result, str(out), "light")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000

    from shuniu.core.extras import MissingExtraError

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the extra were not installed
    with pytest.raises(MissingExtraError, match=r"shuniu\[plot\]"):
        plot_timeline(result, str(tmp_path / "no.png"))


CONTEND = """
name: tenants-contend
duration_s: 60
streams:
  - tenants:
      - {name: flood, weight: 3}
      - {name: team-a, weight: 1}
      - {name: team-b, weight: 1}
    arrival: {process: poisson, rate: 80}
    input_tokens: {dist: lognormal, mean: 600, sigma: 0.5, min: 32, max: 4000}
    output_tokens: {dist: lognormal, mean: 200, sigma: 0.5, min: 16, max: 1000}
"""


@pytest.mark.parametrize("gateways", [1, 3])
def test_tenants_share_the_pool_by_weight_whichever_gateway_they_use(gateways: int) -> None:
    """Three tenants each ask for more than a third of two replicas (flood three times as
    much as the others), each through its own gateway (``--split tenants``): with the
    fleet's slot split by weights each gets about a third of the tokens; split by demand
    (how fast each gateway asks), flood takes more than its share."""

    def shares(fleet_slots: str) -> dict[str, float]:
        resolved = _deployment(
            "{hardware: h200, model: llama-3.1-8b}",
            slots=16,
            extra="scheduler: {policy: priority, options: {max_wait_s: 20, aging_s: null, "
            f"fleet_slots: {fleet_slots}}}}}",
        )
        result = simulate(
            resolved,
            load_plugins(),
            load_workload("contend", text=CONTEND),
            gateways=gateways,
            split="tenants",
        )
        tenants = result.summary()["tenants"]
        assert result.rejected > 0  # contended: every tenant asks for more than it gets
        if gateways > 1:
            assert sorted(t["gateway"] for t in tenants.values()) == [0, 1, 2]
        return {name: t["token_share"] for name, t in tenants.items()}

    fair = shares("weights")
    assert all(abs(share - 1 / 3) < 0.05 for share in fair.values()), fair
    if gateways > 1:
        by_demand = shares("demand")
        assert by_demand["flood"] > 0.45, by_demand


def test_a_run_stops_once_its_ttft_verdict_is_settled() -> None:
    # One slow engine under far more load than it serves: TTFTs grow without bound. Asked to
    # stop once more than 20 requests took over 2 s to a first token, the run ends early,
    # leaves the rest unfinished and says when; the same run without it goes to the end.
    resolved = _deployment("{ttft_ms: 0, tokens_per_s: 20, prefill_tokens_per_s: 2000}", replicas=1)
    overload = load_workload(
        "over",
        text="name: over\nduration_s: 120\nstreams:\n  - arrival: {rate: 20}\n"
        "    input_tokens: 500\n    output_tokens: 50\n",
    )
    full = simulate(resolved, load_plugins(), overload, duration=120).summary()
    rule = StopRule(ttft_s=2.0, ttft_most=20)
    stopped = simulate(resolved, load_plugins(), overload, duration=120, stop_after=rule).summary()
    assert full["stopped_at"] is None and full["unfinished"] == 0
    assert stopped["stopped_at"] is not None and stopped["stopped_at"] < 60
    assert stopped["requests_arrived"] < full["requests_arrived"] / 2
    assert stopped["unfinished"] > 0
    # by then more than 20 requests had a TTFT above 2 s
    assert stopped["requests_completed"] > 20 and stopped["ttft_p99"] > 2.0
    assert stopped["stopped_because"] == "over 20 requests above TTFT 2 s"


def test_a_run_stops_once_its_itl_or_goodput_verdict_is_settled() -> None:
    # A light load (8 requests/s) on an engine whose every decode step takes 50 ms: first tokens come fast,
    # inter-token gaps are all 50 ms. A rule on gaps above 20 ms (at most 200 of them) ends
    # the run early, as one on requests missing their thresholds (at most 5) does; rules
    # that the run keeps (gaps above 80 ms, a TTFT far above what it sees) let it finish.
    resolved = _deployment("{ttft_ms: 0, tokens_per_s: 20, prefill_tokens_per_s: 100000}", replicas=1)
    light = load_workload(
        "light",
        text="name: light\nduration_s: 60\nslo: {ttft_s: 1, itl_s: 0.02}\nstreams:\n"
        "  - arrival: {rate: 8}\n    input_tokens: 100\n    output_tokens: 30\n",
    )

    def run(rule: StopRule) -> dict:
        return simulate(resolved, load_plugins(), light, duration=60, stop_after=rule).summary()

    kept = run(StopRule(ttft_s=30.0, ttft_most=0, itl_s=0.08, itl_most=0))
    assert kept["stopped_at"] is None and kept["itl_p99"] > 0.045
    gaps = run(StopRule(itl_s=0.02, itl_most=200))
    assert gaps["stopped_at"] is not None and gaps["stopped_at"] < 20  # checked every 64 arrivals
    assert gaps["stopped_because"] == "over 200 inter-token gaps above 20 ms"
    missed = run(StopRule(missed_most=5))
    assert missed["stopped_at"] is not None and missed["stopped_at"] < 20
    assert missed["requests_completed"] > 5 and missed["goodput"] < 0.5


def test_precise_prefix_gets_the_engines_kv_events_of_array_prompts() -> None:
    # The workload's prompts are arrays of token ids; the engines publish the blocks they
    # cache (token ids as lists, as the wire type says) to the balancer's exact index.
    resolved = _deployment(
        "{hardware: h200, model: qwen2.5-7b}", replicas=2, extra="balancer: {policy: precise_prefix}"
    )
    workload = load_workload(WORKLOADS / "chat-shared-prefix.yaml")
    s = simulate(resolved, load_plugins(), workload, duration=40).summary()
    assert s["requests_arrived"] > 100
    assert s["requests_completed"] == s["requests_arrived"] and s["unfinished"] == 0
    assert s["prefix_hit_rate"] > 0.5


@pytest.mark.skipif(bool(compiled_modules()), reason="a compiled engine's methods cannot be patched")
@pytest.mark.parametrize("method", ["schedule", "apply", "advance"])
def test_an_engine_that_fails_fails_the_run(monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    # A bug in planning, in committing an iteration or in committing a leap (each runs in a
    # different loop callback of the engine's driver).
    from shuniu.backends.sim.engine import EngineCore

    original = getattr(EngineCore, method)
    calls = 0

    def broken(self: EngineCore, *args):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        if calls == 20:
            raise KeyError("a bug in the engine")
        return original(self, *args)

    monkeypatch.setattr(EngineCore, method, broken)
    resolved = _deployment("{hardware: h200, model: qwen2.5-7b}", replicas=1)
    with pytest.raises(RuntimeError, match="simulated engine of m-0 failed: KeyError"):
        simulate(resolved, load_plugins(), load_workload("light", text=LIGHT), duration=30)
    _assert_the_gateways_stopped()


def test_a_virtual_clock_gateway_builds_its_web_app_on_first_use() -> None:
    # A capacity plan builds a gateway per trial and serves nothing over HTTP: the web app
    # waits until asked for, and then serves as any gateway's does.
    import asyncio

    import httpx

    from shuniu.core.gateway import Gateway

    async def run() -> httpx.Response:
        gw = Gateway(_deployment("{hardware: h200, model: qwen2.5-7b}"), load_plugins(), virtual_time=True)
        assert gw._app is None
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=gw.app), base_url="http://gw"
        ) as client:
            return await client.get("/v1/models")

    reply = asyncio.run(run())
    assert reply.status_code == 200
    assert [m["id"] for m in reply.json()["data"]] == ["m"]


QUEUED = """
name: queued
duration_s: 40
streams:
  - arrival: {rate: 12}
    input_tokens: 256
    output_tokens: 120
"""


def test_a_scheduler_that_needs_a_task_runs_as_one_that_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """The built-in schedulers' admissions are stepped without a task per request
    (``steps_without_task``); one without that mark gets a task for its admission, a loop
    turn later. On a queue that fills, times out and refuses, both give the same run."""
    from shuniu.plugins.schedulers.fifo import FifoScheduler

    extra = "scheduler: {policy: fifo, options: {max_wait_s: 1.5, max_queue: 12}}"
    runs = []
    for steps in (True, False):
        monkeypatch.setattr(FifoScheduler, "steps_without_task", steps)
        resolved = _deployment("{ttft_ms: 10, tokens_per_s: 40}", replicas=2, extra=extra, slots=4)
        runs.append(
            simulate(resolved, load_plugins(), load_workload("queued", text=QUEUED), duration=40).summary()
        )
    stepped, tasked = runs
    assert stepped["rejected_by_code"].get("queue_timeout") and stepped["rejected_by_code"].get("queue_full")
    assert stepped["requests_completed"] > 100
    for key in (
        "requests_arrived",
        "requests_completed",
        "rejected_by_code",
        "ttft_p50",
        "ttft_p99",
        "e2e_p99",
    ):
        assert stepped[key] == tasked[key], key


def test_a_request_whose_own_code_breaks_fails_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a refusal or an engine failure (those are counted): a bug, which a task per
    request used to swallow."""
    from shuniu.plugins.balancers.round_robin import RoundRobin

    calls = 0
    pick = RoundRobin.pick

    def broken(self, req, endpoints):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        if calls == 20:
            raise KeyError("a balancer's bug")
        return pick(self, req, endpoints)

    monkeypatch.setattr(RoundRobin, "pick", broken)
    resolved = _deployment("{ttft_ms: 10, tokens_per_s: 50}", extra="balancer: {policy: round_robin}")
    with pytest.raises(KeyError, match="a balancer's bug"):
        simulate(resolved, load_plugins(), load_workload("light", text=LIGHT), duration=30)
    _assert_the_gateways_stopped()


def _assert_the_gateways_stopped() -> None:
    """A failed run stopped its gateways as a finished one does. A gateway freezes what it
    built when it starts and thaws it when it stops: left running (its health, load and
    autoscaling tasks pending on the closed loop), all of it would stay frozen, out of the
    collector's reach, for the rest of the process (a capacity plan runs many trials)."""
    import gc

    assert gc.get_freeze_count() == 0
