"""The engine configurations (*shapes*) a plan chooses between: tensor-parallel size (and
pipeline stages, for a model that fits no node), weight
and KV precision, the iteration token budget (``max_num_batched_tokens``, which is the prefill
chunk size), ``max_num_seqs``, prefix caching and the pool's balancer; and the
:class:`Space` of values each knob may take, with the checks that a shape fits the hardware.

A plan varies one knob at a time from the best shape so far (:meth:`Space.neighbours`), so a
knob's values are the ones an expert would try, not every combination."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from shuniu.backends.sim import CostModel, HardwareProfile, ModelProfile, load_model
from shuniu.core.errors import Problem
from shuniu.plugins.tools.plan.candidates import Split, tp_candidates
from shuniu.plugins.tools.plan.results import PlanError

__all__ = [
    "CHUNK_SIZES",
    "DIMENSIONS",
    "MAX_NUM_SEQS",
    "PREFILL_HEAVY",
    "QUALITY",
    "SPLITS",
    "WEIGHT_LOSS",
    "Shape",
    "Space",
    "parallel_label",
    "precision_quality",
    "quality_loss",
]

DIMENSIONS = (
    "balancer",
    "max_num_batched_tokens",
    "tensor_parallel",
    "precision",
    "max_num_seqs",
    "prefix_caching",
    "disaggregation",
)
"""The knobs, in the order a plan varies them (the cheapest to try and the most telling first)."""

CHUNK_SIZES = (128, 256, 512, 1024, 2048, 8192)
"""``max_num_batched_tokens`` values tried: the prefill chunk an iteration may carry. Small
chunks keep decode iterations short (ITL), large ones prefill faster (TTFT, throughput). A
chunk below ``max_num_seqs`` comes with ``max_num_seqs`` lowered to fit it (vLLM refuses a
token budget smaller than its sequence limit)."""

MAX_NUM_SEQS = (64, 128, 256, 512)
"""``max_num_seqs`` values tried."""

SPLITS = ((1, 1), (1, 2), (2, 1), (1, 3))
"""Prefill/decode splits tried, as (prefill engines, decode engines) per unit, besides no
split (:data:`PREFILL_HEAVY` says when)."""

PREFILL_HEAVY = 4.0
"""The search tries prefill/decode splits (by default) when the prompt tokens to compute
(those no prefix cache holds) are at least this many times the answer's: prefills then stall
decode iterations the most, which a split removes."""

BALANCERS_SHARED = ("prefix_affinity", "least_load", "round_robin")
"""Built-in balancers tried for workloads whose prompts share prefixes (the first is the start)."""
BALANCERS_PLAIN = ("least_load", "round_robin")
"""Built-in balancers tried otherwise."""

QUALITY: dict[str, str] = {
    "fp8": "FP8 weights: usually within about 1% of BF16 on standard benchmarks",
    "int8": "INT8 weights: usually within about 1% of BF16 on standard benchmarks",
    "int4-awq": "INT4 (AWQ) weights: usually 1-3% lower on standard benchmarks, more on long context, "
    "math and code",
    "int4-gptq": "INT4 (GPTQ) weights: usually 1-3% lower on standard benchmarks, more on long context, "
    "math and code",
}
"""What a lower weight precision typically costs in answer quality (general guidance from
published quantization evaluations; check the model's own evaluations before serving it)."""
KV_QUALITY = "FP8 KV cache: small losses, mostly at long context"


WEIGHT_LOSS: dict[str, int] = {"fp8": 1, "int8": 1, "int4-awq": 2, "int4-gptq": 2}
"""How far a lower weight precision is from the model's own, in steps (:func:`quality_loss`)."""


def quality_loss(weight: str, kv: str, native_weight: str, native_kv: str) -> int:
    """A rank of the quality cost of ``weight``/``kv`` (0: the model's own precisions; an
    8-bit weight format or an FP8 KV cache one step each, 4-bit weights two), for preferring
    the smaller loss between configurations that cost the same."""
    loss = WEIGHT_LOSS.get(weight, 1) if weight != native_weight else 0
    return loss + (1 if kv != native_kv else 0)


def precision_quality(weight: str, kv: str, native_weight: str, native_kv: str) -> str | None:
    """The quality cost of serving at ``weight``/``kv`` instead of the model's own precisions
    (``None``: none)."""
    parts = []
    if weight != native_weight and weight in QUALITY:
        parts.append(QUALITY[weight])
    if kv != native_kv and kv == "fp8":
        parts.append(KV_QUALITY)
    return "; ".join(parts) or None


def parallel_label(tp: int, pp: int) -> str:
    """``TP 8``, or ``TP 8 x PP 2`` with pipeline stages."""
    return f"TP {tp} x PP {pp}" if pp > 1 else f"TP {tp}"


@dataclass(frozen=True, order=True)
class Shape:
    """One engine configuration of a pool (everything but the replica count)."""

    tensor_parallel: int
    """Devices one replica spans."""
    weight_precision: str
    kv_precision: str
    max_num_batched_tokens: int
    """Token budget of one iteration (the largest prefill chunk)."""
    max_num_seqs: int
    prefix_caching: bool
    balancer: str
    """The pool's balancer policy."""
    pipeline_parallel: int = 1
    """Pipeline stages of a replica, each a node of ``tensor_parallel`` devices (above 1 only
    for a model that fits no node)."""
    prefill_engines: int = 0
    """With a prefill/decode split, the prefill engines of each unit (a replica is then a
    unit of ``prefill_engines`` + ``decode_engines`` engines); 0: no split."""
    decode_engines: int = 0

    @property
    def engines(self) -> int:
        """Engines of one replica (a unit of a prefill/decode split has several)."""
        return self.prefill_engines + self.decode_engines or 1

    @property
    def devices(self) -> int:
        """Devices one replica spans."""
        return self.tensor_parallel * self.pipeline_parallel * self.engines

    @property
    def disaggregation(self) -> str:
        """``1P2D`` for one prefill and two decode engines per unit; empty without a split."""
        return f"{self.prefill_engines}P{self.decode_engines}D" if self.prefill_engines else ""

    @property
    def split(self) -> Split:
        return self.tensor_parallel, self.pipeline_parallel

    @property
    def parallel(self) -> str:
        """``TP 8``, or ``TP 8 x PP 2`` with pipeline stages."""
        return parallel_label(self.tensor_parallel, self.pipeline_parallel)

    def options(self, hardware: str, model: str, util: float) -> dict[str, Any]:
        """The ``sim`` backend options of one replica."""
        return {
            "hardware": hardware,
            "model": model,
            "tensor_parallel_size": self.tensor_parallel,
            **({"pipeline_parallel_size": self.pipeline_parallel} if self.pipeline_parallel > 1 else {}),
            **(
                {"prefill_engines": self.prefill_engines, "decode_engines": self.decode_engines}
                if self.prefill_engines
                else {}
            ),
            "weight_precision": self.weight_precision,
            "kv_precision": self.kv_precision,
            "gpu_memory_utilization": util,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "enable_prefix_caching": self.prefix_caching,
        }

    @property
    def precision(self) -> str:
        return f"{self.weight_precision}/kv {self.kv_precision}"

    def label(self) -> str:
        """Every knob, briefly: ``TP 8 bf16/kv bf16 chunk 256 seqs 256 cache prefix_affinity``."""
        cache = "cache" if self.prefix_caching else "no-cache"
        split = f" {self.disaggregation}" if self.prefill_engines else ""
        return (
            f"{self.parallel} {self.precision} chunk {self.max_num_batched_tokens} "
            f"seqs {self.max_num_seqs} {cache} {self.balancer}{split}"
        )

    def change(self, other: Shape) -> str:
        """How this shape differs from ``other``, e.g. ``chunk 2048`` (empty: it does not)."""
        parts = []
        if self.balancer != other.balancer:
            parts.append(f"balancer {self.balancer}")
        if self.max_num_batched_tokens != other.max_num_batched_tokens:
            parts.append(f"chunk {self.max_num_batched_tokens}")
        if self.split != other.split:
            parts.append(self.parallel)
        if self.precision != other.precision:
            parts.append(self.precision)
        if self.max_num_seqs != other.max_num_seqs:
            parts.append(f"max_num_seqs {self.max_num_seqs}")
        if self.prefix_caching != other.prefix_caching:
            parts.append("prefix caching " + ("on" if self.prefix_caching else "off"))
        if (self.prefill_engines, self.decode_engines) != (other.prefill_engines, other.decode_engines):
            parts.append(
                f"prefill/decode {self.disaggregation}" if self.prefill_engines else "no prefill/decode split"
            )
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Space:
    """The values each knob of a :class:`Shape` may take for one model on one hardware: a knob
    the user pinned has one value; tensor-parallel sizes are those that hold the model at the
    shape's precision (:func:`~shuniu.plugins.tools.plan.candidates.tp_candidates`)."""

    def __init__(
        self,
        model: ModelProfile,
        model_spec: str,
        hw: HardwareProfile,
        *,
        util: float,
        max_model_len: int | None,
        tensor_parallel: int | None,
        weight_precisions: list[str] | None,
        kv_precisions: list[str] | None,
        chunks: list[int] | None,
        max_num_seqs: list[int] | None,
        prefix_caching: bool | None,
        balancers: list[str] | None,
        shared_prefixes: bool,
        pipeline_parallel: int | None = None,
        splits: list[tuple[int, int]] | None = None,
    ) -> None:
        self.model = model
        self.model_spec = model_spec
        self.hw = hw
        self.util = util
        self.max_model_len = max_model_len
        self.pinned_tp = tensor_parallel
        self.pinned_pp = pipeline_parallel
        fp8 = hw.peak_flops("fp8") is not None
        native_w, native_kv = model.weight_precision, model.kv_precision
        self.native = (native_w, native_kv)
        weights = weight_precisions or _unique([native_w, "fp8" if fp8 else "int8", "int4-awq"])
        kvs = kv_precisions or _unique([native_kv, *(["fp8"] if fp8 else [])])
        self.precisions = [(w, kv) for w in weights for kv in kvs]
        self.chunks = sorted(chunks or CHUNK_SIZES)
        self.seqs = sorted(max_num_seqs or MAX_NUM_SEQS)
        self.caching = [prefix_caching] if prefix_caching is not None else [True, False]
        self.balancers = balancers or list(BALANCERS_SHARED if shared_prefixes else BALANCERS_PLAIN)
        self.splits = [(0, 0)] if splits is None else splits
        """Prefill/decode splits the search may use, ``(0, 0)`` for none (the first is the start)."""
        self._models: dict[tuple[str, str], ModelProfile] = {}
        self._tp: dict[tuple[str, str], list[Split] | Problem] = {}
        self._cost: dict[tuple[Split, str, str], CostModel] = {}
        if not any(isinstance(self.tp_sizes(w, kv), list) for w, kv in self.precisions):
            # Nothing fits: report the native precision's reason (with its advice).
            reason = self._tp[self.precisions[0]]
            assert isinstance(reason, Problem)
            raise PlanError([reason], "options")

    def model_at(self, weight: str, kv: str) -> ModelProfile:
        key = (weight, kv)
        if key not in self._models:
            self._models[key] = load_model(self.model_spec, weight_precision=weight, kv_precision=kv)
        return self._models[key]

    def tp_sizes(self, weight: str, kv: str) -> list[Split] | Problem:
        """The splits (tensor parallel, pipeline parallel) that hold the model at these
        precisions, or why none does."""
        key = (weight, kv)
        if key not in self._tp:
            try:
                self._tp[key] = tp_candidates(
                    self.model_at(weight, kv),
                    self.hw,
                    self.util,
                    self.max_model_len,
                    self.pinned_tp,
                    self.pinned_pp,
                )
            except PlanError as exc:
                self._tp[key] = exc.problems[0]
        return self._tp[key]

    def cost_model(self, shape: Shape) -> CostModel:
        key = (shape.split, shape.weight_precision, shape.kv_precision)
        if key not in self._cost:
            model = self.model_at(shape.weight_precision, shape.kv_precision)
            self._cost[key] = CostModel(model, self.hw, shape.tensor_parallel, shape.pipeline_parallel)
        return self._cost[key]

    def quality(self, shape: Shape) -> str | None:
        return precision_quality(shape.weight_precision, shape.kv_precision, *self.native)

    def base(self, itl_target: float | None, decode_batch: int) -> Shape:
        """Where the search starts: the model's own precision (else the first that fits);
        the smallest TP size at which an iteration of the smallest chunk plus
        ``decode_batch`` decodes stays under 90% of the ITL target (else the largest size);
        there, the largest such chunk; 256 sequences (or the nearest allowed), prefix caching
        on, the first balancer."""
        for w, kv in self.precisions:
            sizes = self.tp_sizes(w, kv)
            if isinstance(sizes, list):
                break
        assert isinstance(sizes, list)
        seqs = min(self.seqs, key=lambda n: (abs(n - 256), n))
        tp, pp = sizes[0]
        p, d = self.splits[0]
        shape = Shape(tp, w, kv, self.chunks[-1], seqs, self.caching[0], self.balancers[0], pp, p, d)
        if itl_target is None:
            return self.valid(shape) or shape

        def fits(split: Split, chunk: int) -> bool:
            cm = self.cost_model(
                dataclasses.replace(shape, tensor_parallel=split[0], pipeline_parallel=split[1])
            )
            step = cm.step_time(chunk, chunk * chunk / 2, decode_batch, decode_batch * 1024)
            return step <= 0.9 * itl_target

        split = next((t for t in sizes if fits(t, self.chunks[0])), sizes[-1])
        chunk = max((c for c in self.chunks if fits(split, c)), default=self.chunks[0])
        shape = self.with_chunk(
            dataclasses.replace(shape, tensor_parallel=split[0], pipeline_parallel=split[1]), chunk
        )
        return self.valid(shape) or shape

    def with_chunk(self, shape: Shape, chunk: int) -> Shape:
        """``shape`` with a prefill chunk of ``chunk`` tokens, and ``max_num_seqs`` lowered
        to the largest allowed value within it when the chunk is smaller (the pair an
        expert would set: a small chunk for ITL without giving up the batch's other
        sequences)."""
        seqs = shape.max_num_seqs
        if chunk < seqs:
            seqs = max((n for n in self.seqs if n <= chunk), default=seqs)
        return dataclasses.replace(shape, max_num_batched_tokens=chunk, max_num_seqs=seqs)

    def valid(self, shape: Shape) -> Shape | None:
        """``shape`` if it can run (vLLM wants a token budget of at least ``max_num_seqs``)."""
        sizes = self.tp_sizes(shape.weight_precision, shape.kv_precision)
        if not isinstance(sizes, list) or shape.split not in sizes:
            return None
        if shape.max_num_batched_tokens < shape.max_num_seqs:
            return None
        return shape

    def neighbours(self, shape: Shape, dimension: str) -> list[Shape]:
        """``shape`` with one knob set to each of its other values (those that can run)."""
        replace = dataclasses.replace
        if dimension == "balancer":
            out = [replace(shape, balancer=b) for b in self.balancers]
        elif dimension == "max_num_batched_tokens":
            out = [self.with_chunk(shape, c) for c in self.chunks]
        elif dimension == "max_num_seqs":
            out = [replace(shape, max_num_seqs=n) for n in self.seqs]
        elif dimension == "prefix_caching":
            out = [replace(shape, prefix_caching=c) for c in self.caching]
        elif dimension == "disaggregation":
            out = [replace(shape, prefill_engines=p, decode_engines=d) for p, d in self.splits]
        elif dimension == "tensor_parallel":
            sizes = self.tp_sizes(shape.weight_precision, shape.kv_precision)
            if isinstance(sizes, list):
                out = [replace(shape, tensor_parallel=t, pipeline_parallel=p) for t, p in sizes]
            else:
                out = []
        elif dimension == "precision":
            out = []
            for w, kv in self.precisions:
                sizes = self.tp_sizes(w, kv)
                if not isinstance(sizes, list):
                    continue
                # at the same TP size where it fits, and at the smallest that does (a lower
                # precision often fits on fewer devices)
                for tp, pp in dict.fromkeys((shape.split, sizes[0])):
                    if (tp, pp) in sizes:
                        out.append(
                            replace(
                                shape,
                                weight_precision=w,
                                kv_precision=kv,
                                tensor_parallel=tp,
                                pipeline_parallel=pp,
                            )
                        )
        else:
            raise ValueError(f"unknown dimension {dimension!r}")
        return [s for s in out if s != shape and self.valid(s) is not None]


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))
