"""The built-in engine simulator: the engine model and the ``sim`` backend built on it.

The engine model is vLLM-style continuous batching over a paged, prefix-cached KV cache
(``engine``, ``kvcache``), timed by a roofline cost model of a model profile on a hardware
profile (``costmodel``, ``profiles`` with the shipped ``data/``) or at a fixed rate
(``timing``), with injected faults (``faults``); ``compiled`` says which of these
modules run compiled (mypyc, ``setup.py``); ``disagg`` puts prefill engines and decode
engines behind one endpoint (a prefill/decode split). ``backend`` adapts it to the gateway
(``kind: sim``, the embedded default); ``metrics`` renders an engine's state as vLLM's
Prometheus metrics.

The tools built on it (``shuniu simulate``, ``shuniu plan``, ``shuniu sim serve``) live in
:mod:`shuniu.plugins.tools` and use only the names exported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shuniu.core.lazy import lazy_exports

if TYPE_CHECKING:
    from shuniu.backends.sim.backend import SimBackend
    from shuniu.backends.sim.build import EngineSetup, build_engine
    from shuniu.backends.sim.compiled import COMPILED_MODULES, compiled_modules
    from shuniu.backends.sim.costmodel import CostModel, StepBreakdown
    from shuniu.backends.sim.disagg import DisaggregatedEngine
    from shuniu.backends.sim.engine import CostFunction, EngineConfig, EngineCore, Seq, SimEngine
    from shuniu.backends.sim.faults import FaultOptions
    from shuniu.backends.sim.metrics import CONTENT_TYPE, render_metrics
    from shuniu.backends.sim.options import SimOptions
    from shuniu.backends.sim.profiles import (
        ENV_PROFILE_PATH,
        GIB,
        HardwareProfile,
        KVReport,
        ModelProfile,
        ProfileError,
        kv_bytes_per_token,
        kv_cache_tokens,
        kv_report,
        list_hardware,
        list_models,
        load_hardware,
        load_model,
        min_tensor_parallel,
        pipeline_parallel_problem,
        pipeline_split,
        tensor_parallel_problem,
        weight_bytes,
    )
    from shuniu.backends.sim.stats import LogHistogram
    from shuniu.backends.sim.timing import FixedRateCost

__all__ = [
    "COMPILED_MODULES",
    "CONTENT_TYPE",
    "ENV_PROFILE_PATH",
    "GIB",
    "CostFunction",
    "CostModel",
    "DisaggregatedEngine",
    "EngineConfig",
    "EngineCore",
    "EngineSetup",
    "FaultOptions",
    "FixedRateCost",
    "HardwareProfile",
    "KVReport",
    "LogHistogram",
    "ModelProfile",
    "ProfileError",
    "Seq",
    "SimBackend",
    "SimEngine",
    "SimOptions",
    "StepBreakdown",
    "build_engine",
    "compiled_modules",
    "kv_bytes_per_token",
    "kv_cache_tokens",
    "kv_report",
    "list_hardware",
    "list_models",
    "load_hardware",
    "load_model",
    "min_tensor_parallel",
    "pipeline_parallel_problem",
    "pipeline_split",
    "render_metrics",
    "tensor_parallel_problem",
    "weight_bytes",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "SimBackend": "shuniu.backends.sim.backend",
        "EngineSetup": "shuniu.backends.sim.build",
        "build_engine": "shuniu.backends.sim.build",
        "COMPILED_MODULES": "shuniu.backends.sim.compiled",
        "compiled_modules": "shuniu.backends.sim.compiled",
        "DisaggregatedEngine": "shuniu.backends.sim.disagg",
        "CostModel": "shuniu.backends.sim.costmodel",
        "StepBreakdown": "shuniu.backends.sim.costmodel",
        "CostFunction": "shuniu.backends.sim.engine",
        "EngineConfig": "shuniu.backends.sim.engine",
        "EngineCore": "shuniu.backends.sim.engine",
        "Seq": "shuniu.backends.sim.engine",
        "SimEngine": "shuniu.backends.sim.engine",
        "FaultOptions": "shuniu.backends.sim.faults",
        "CONTENT_TYPE": "shuniu.backends.sim.metrics",
        "render_metrics": "shuniu.backends.sim.metrics",
        "SimOptions": "shuniu.backends.sim.options",
        "ENV_PROFILE_PATH": "shuniu.backends.sim.profiles",
        "GIB": "shuniu.backends.sim.profiles",
        "HardwareProfile": "shuniu.backends.sim.profiles",
        "KVReport": "shuniu.backends.sim.profiles",
        "ModelProfile": "shuniu.backends.sim.profiles",
        "ProfileError": "shuniu.backends.sim.profiles",
        "kv_bytes_per_token": "shuniu.backends.sim.profiles",
        "kv_cache_tokens": "shuniu.backends.sim.profiles",
        "kv_report": "shuniu.backends.sim.profiles",
        "list_hardware": "shuniu.backends.sim.profiles",
        "list_models": "shuniu.backends.sim.profiles",
        "load_hardware": "shuniu.backends.sim.profiles",
        "load_model": "shuniu.backends.sim.profiles",
        "min_tensor_parallel": "shuniu.backends.sim.profiles",
        "pipeline_parallel_problem": "shuniu.backends.sim.profiles",
        "pipeline_split": "shuniu.backends.sim.profiles",
        "tensor_parallel_problem": "shuniu.backends.sim.profiles",
        "weight_bytes": "shuniu.backends.sim.profiles",
        "LogHistogram": "shuniu.backends.sim.stats",
        "FixedRateCost": "shuniu.backends.sim.timing",
    },
)
