"""The roofline cost model: seconds per engine iteration for a hardware and model profile.

One iteration of a continuous-batching engine runs the new prompt tokens of some prefill chunks
and one token of each decoding sequence through the model. Its time is

    max(max(GEMM compute, weight bytes)                    # the linear layers
          + max(attention compute, KV bytes)                 # attention
          + per-sequence overhead x decoding sequences,      # the device path
        host per-sequence time x decoding sequences)         # the host roof (0 by default)
      + iteration overhead + tensor-parallel all-reduces
      + admission cost x requests scheduled for the first time (0 by default)

each compute term over the achievable FLOP/s and each byte term over the achievable
bandwidth, where, per iteration (T = prefill tokens + decoding sequences, A = attention token
pairs = ``prefill_attn + decode_kv_tokens``):

- GEMM compute      = 2 x decoder parameters x T        (at the weights' compute precision)
                    + 2 x LM-head parameters x decoding sequences (16-bit; prefill samples
                      ~1 per chunk)
- weight bytes      = decoder + LM-head weight bytes (read once; the embedding is a lookup)
- attention compute = 4 x layers x heads x head_dim x A (QK^T and PV, 16-bit)
- KV bytes          = KV bytes per token x (decode_kv_tokens + prefill context read + T written)

The two rooflines are separate because the kernels are: the matmuls stream the weights and
the attention kernels stream the KV cache, one after the other in every layer, so a decode
batch whose matmuls have turned compute-bound still pays for reading its KV, and a long
prefill's attention FLOPs do not hide the weight reads. (One roofline over the sums, as this
model had before, prices a large decode batch with long contexts as if the weight reads and
the attention FLOPs overlapped: 15-25% under TensorRT-LLM's published throughput tables.)

The prefill context read is approximated by ``prefill_attn / prefill_tokens`` tokens (exact for a
single chunk up to half its own length, which FlashAttention keeps on chip; prefill is
compute-bound, so the term hardly matters). Attention FLOPs are counted in full for decode and
causally for prefill, as the engine reports them.

Tensor parallelism over ``tp`` devices divides compute and weight bytes by ``tp`` and KV bytes
by the per-device share of KV heads (replicated when ``tp`` exceeds them); it adds two
all-reduces per layer (after attention and after the MLP) of T x hidden 16-bit activations:
ring time 2 (tp - 1) / tp x bytes over the one-direction link bandwidth x efficiency, plus a
fixed latency per all-reduce. Communication is not overlapped with compute (as in vLLM).

Pipeline parallelism over ``pp`` stages (each a node of ``tp`` devices, for a model that does
not fit one node) splits the layers. An iteration here is one turn of the pipeline: the
running sequences, in ``pp`` microbatches as vLLM schedules them, each pass every stage once.
A turn lasts as long as its largest microbatch takes through all stages
(:meth:`CostModel.pipeline_share`: the decoding sequences spread evenly, the prefill chunks as
one microbatch), so the per-token work (matmuls, attention, KV reads, all-reduces) is charged
for that share of the tokens: ``1 / pp`` of them in a full pipeline, all of them for a lone
request, which overlaps with nothing. Each stage reads its weights once per microbatch, so
the weight time is that of ``tp`` devices holding the whole model: stages add memory and
throughput, not decode speed. The LM head runs on the last stage for every sequence. Between
stages a token's activations (hidden x 16 bits) cross ``pp - 1`` node links
(``node_link_gb_s`` per device), plus ``node_link_latency_us`` per hop.

Compute precision: FP8 weights use the FP8 peak where the hardware has one, else BF16 (W8A16
kernels such as FP8 Marlin); INT8/INT4 weight-only quantization computes in BF16 and only reads
fewer bytes.

The host roof (``host_seq_us``), the admission cost (``request_overhead_ms``), the shared host
core (``host_token_us``) and step jitter (``step_jitter_sigma``) are hardware-profile fields
that default to 0, so profiles without them (every shipped GPU profile) price iterations as
before.

**The shared host core.** With ``host_token_us`` = c, streaming the iteration's n sampled tokens
(decoding sequences + new requests) keeps the host core busy for c x n, a share c n / T of an
iteration of T seconds, and the host-side parts h (iteration overhead, per-sequence and
admission costs) run on what is left: T = d + h / (1 - c n / T), with d the device path (the
roofline and all-reduces). That is the quadratic T^2 - (d + h + c n) T + d c n = 0, whose larger
root is taken; it is d + h when c = 0 and approaches c n, the core's own limit, at large n.

Jitter is not applied here: the :class:`~shuniu.backends.sim.engine.SimEngine` multiplies each iteration by
:func:`jitter_factor`, drawn from its own seeded random stream, when :attr:`CostModel.jitter_sigma`
is set.

Every constant is folded at construction, so :meth:`CostModel.step_time` is a handful of float
operations: it is called once per simulated iteration, millions of times per run.
"""

from __future__ import annotations

import math
import random
from typing import NamedTuple

from shuniu.backends.sim.profiles import (
    HardwareProfile,
    ModelProfile,
    bytes_per_weight,
    compute_precision,
    kv_bytes_per_token_per_device,
    pipeline_parallel_problem,
    tensor_parallel_problem,
)

__all__ = ["CostModel", "StepBreakdown", "jitter_factor"]

_MARGIN = 1.0 + 1e-9
"""A relative gap between two roofs far beyond any rounding (:meth:`CostModel.decode_steps`)."""


def jitter_factor(rng: random.Random, sigma: float) -> float:
    """A lognormal factor of mean 1 and log-space standard deviation ``sigma`` (1 when
    ``sigma`` is 0): ``exp(N(-sigma^2 / 2, sigma^2))``."""
    if sigma <= 0:
        return 1.0
    return math.exp(rng.gauss(-0.5 * sigma * sigma, sigma))


class StepBreakdown(NamedTuple):
    """The parts of one iteration's time, in seconds."""

    compute_s: float
    """Matmul and attention FLOPs over the achievable FLOP/s."""
    memory_s: float
    """Weight and KV bytes over the achievable bandwidth."""
    overhead_s: float
    """Fixed iteration overhead, the device-side per-sequence time and the admission cost."""
    comm_s: float
    """Tensor-parallel all-reduces (0 without tensor parallelism)."""
    total_s: float
    """What :meth:`CostModel.step_time` returns."""
    host_s: float = 0.0
    """The host roof: ``host_seq_us`` x decoding sequences (0 without one)."""
    request_s: float = 0.0
    """The admission cost of the requests scheduled for the first time (part of ``overhead_s``)."""
    seq_s: float = 0.0
    """The device-side per-sequence time (part of ``overhead_s``)."""
    kernels_s: float = 0.0
    """The kernels' time: each of the matmuls and attention under its own roof,
    ``max(GEMM FLOPs, weight bytes) + max(attention FLOPs, KV bytes)``; at least
    ``max(compute_s, memory_s)`` and at most their sum."""

    @property
    def bound(self) -> str:
        """``"compute"``, ``"memory"`` or ``"host"``: which roof the iteration sits under
        (of the kernels, the one whose work takes longer in total)."""
        if self.host_s > self.kernels_s + self.seq_s:
            return "host"
        return "compute" if self.compute_s > self.memory_s else "memory"


class CostModel:
    """Iteration times of one engine replica: ``model`` on ``tp`` devices of ``hardware``."""

    __slots__ = (
        "_c_comm",
        "_c_head",
        "_c_hop",
        "_c_pair",
        "_c_seq",
        "_c_token",
        "_fixed",
        "_fixed_comm",
        "_host_seq",
        "_m_fixed",
        "_m_kv",
        "_request",
        "compute_precision",
        "hardware",
        "host_token",
        "jitter_sigma",
        "model",
        "pp",
        "tp",
    )

    def __init__(self, model: ModelProfile, hardware: HardwareProfile, tp: int = 1, pp: int = 1) -> None:
        problem = tensor_parallel_problem(model, tp) or pipeline_parallel_problem(model, pp)
        if problem is not None:
            raise ValueError(problem)
        if tp > hardware.max_tensor_parallel:
            raise ValueError(
                f"{hardware.name} allows at most {hardware.max_tensor_parallel} devices per "
                f"tensor-parallel group, not {tp}"
            )
        if pp > hardware.max_pipeline_parallel:
            raise ValueError(
                f"{hardware.name} allows at most {hardware.max_pipeline_parallel} pipeline stages, not {pp}"
            )
        self.model = model
        self.hardware = hardware
        self.tp = tp
        self.pp = pp
        precision = compute_precision(model, hardware)
        self.compute_precision = precision
        act_precision = "fp32" if model.weight_precision == "fp32" else "bf16"
        if model.weight_precision == "fp16":
            act_precision = "fp16"
        act_bytes = 4 if act_precision == "fp32" else 2
        peak_linear = hardware.peak_flops(precision)
        peak_act = hardware.peak_flops(act_precision)
        assert peak_linear is not None and peak_act is not None  # bf16/fp16/fp32 always have one
        flops_linear = peak_linear * hardware.compute_efficiency * tp
        flops_act = peak_act * hardware.compute_efficiency * tp
        bandwidth = hardware.memory_bandwidth_gb_s * 1e9 * hardware.bandwidth_efficiency

        lm_head = model.embedding_params
        head_bytes = 4 if model.weight_precision == "fp32" else 2
        weights_read = model.body_params * bytes_per_weight(model.weight_precision) + lm_head * head_bytes

        # seconds per unit of each input, through all layers (with pipeline stages, the share of
        # the tokens on the turn's critical path scales them: see _pipelined_step)
        self._c_token = 2.0 * model.active_body_params / flops_linear
        self._c_head = 2.0 * lm_head / flops_act
        self._c_pair = 4.0 * model.num_layers * model.num_attention_heads * model.head_dim / flops_act
        self._m_fixed = weights_read / tp / bandwidth
        self._m_kv = kv_bytes_per_token_per_device(model, tp) / bandwidth
        self._c_seq = hardware.seq_overhead_us * 1e-6
        self._host_seq = hardware.host_seq_us * 1e-6
        self._request = hardware.request_overhead_ms * 1e-3
        self.host_token = hardware.host_token_us * 1e-6
        """Host-core seconds per sampled token (0: no shared host core)."""
        self.jitter_sigma = hardware.step_jitter_sigma
        """Log-space sigma of the multiplicative step jitter the engine applies (0: none)."""
        if tp > 1:
            link = hardware.interconnect_gb_s * 1e9 / 2 * hardware.interconnect_efficiency
            ring = 2.0 * (tp - 1) / tp
            self._c_comm = 2 * model.num_layers * ring * model.hidden_size * act_bytes / link
            self._fixed_comm = 2 * model.num_layers * hardware.allreduce_latency_us * 1e-6
        else:
            self._c_comm = 0.0
            self._fixed_comm = 0.0
        # the stage hops: a token's activations over pp - 1 node links, and a fixed latency
        # per hop (communication, like the all-reduces, is not overlapped)
        self._c_hop = (pp - 1) * model.hidden_size * act_bytes / (hardware.node_link_gb_s * 1e9)
        self._fixed_comm += (pp - 1) * hardware.node_link_latency_us * 1e-6
        self._fixed = hardware.iteration_overhead_ms * 1e-3 + self._fixed_comm

    def step_time(
        self,
        prefill_tokens: int,
        prefill_attn: float,
        decode_seqs: int,
        decode_kv_tokens: int,
        new_seqs: int = 0,
    ) -> float:
        """Seconds one engine iteration takes (before jitter).

        ``prefill_tokens``: new prompt tokens computed (summed over prefill chunks);
        ``prefill_attn``: sum over chunks of ``chunk_len x (context_before + chunk_len / 2)``;
        ``decode_seqs``: sequences decoding one token; ``decode_kv_tokens``: KV tokens those
        sequences attend over in total; ``new_seqs``: sequences this iteration schedules from
        the waiting queue (each costs ``request_overhead_ms``). 0 for an empty batch.
        """
        tokens = prefill_tokens + decode_seqs
        if tokens <= 0:
            return 0.0
        if self.pp > 1:
            return self._pipelined_step(prefill_tokens, prefill_attn, decode_seqs, decode_kv_tokens, new_seqs)
        kernels = self._kernels(prefill_tokens, prefill_attn, decode_seqs, decode_kv_tokens, 1.0)
        if self.host_token:
            return self._shared_host(kernels, decode_seqs, new_seqs, tokens)
        busy = kernels + decode_seqs * self._c_seq
        host = decode_seqs * self._host_seq
        if host > busy:
            busy = host
        return busy + self._fixed + tokens * self._c_comm + new_seqs * self._request

    def decode_steps(self, decode_seqs: int, decode_kv_tokens: int, start: int, stop: int) -> list[float]:
        """``step_time(0, 0.0, decode_seqs, decode_kv_tokens + i * decode_seqs)`` for each ``i``
        from ``start`` to ``stop - 1`` (the same floats): the iterations of a decode leap, the
        KV growing by one token per sequence each time, timed in one call."""
        if decode_seqs <= 0 or self.pp > 1 or self.host_token:
            kv = decode_kv_tokens
            return [self.step_time(0, 0.0, decode_seqs, kv + i * decode_seqs) for i in range(start, stop)]
        d = decode_seqs
        # step_time's arithmetic, term for term and in its order, with what does not change
        # between the iterations worked out once (a product by share 1.0 and a sum with no
        # prefill change nothing).
        gemm = d * self._c_token + d * self._c_head
        if gemm < self._m_fixed:
            gemm = self._m_fixed
        c_pair, m_kv = self._c_pair, self._m_kv
        overhead = d * self._c_seq
        host = d * self._host_seq
        fixed, comm = self._fixed, d * self._c_comm
        kvs = range(decode_kv_tokens + start * d, decode_kv_tokens + stop * d, d)
        if not kvs:
            return []
        # The roof that binds at both ends of the range, by a margin no rounding reaches,
        # binds all along it (both are linear in ``kv``); and float sums and products of
        # positive numbers never decrease as ``kv`` grows, so a host time below the first
        # iteration's is below every one's. Then each iteration is one expression (the same
        # floats).
        a0, a1 = kvs[0] * c_pair, kvs[-1] * c_pair
        r0, r1 = (kvs[0] + d) * m_kv, (kvs[-1] + d) * m_kv
        if a0 > r0 * _MARGIN and a1 > r1 * _MARGIN and host <= gemm + a0 + overhead:
            return [gemm + kv * c_pair + overhead + fixed + comm for kv in kvs]
        if r0 > a0 * _MARGIN and r1 > a1 * _MARGIN and host <= gemm + r0 + overhead:
            return [gemm + (kv + d) * m_kv + overhead + fixed + comm for kv in kvs]
        steps: list[float] = []
        append = steps.append
        for kv in kvs:
            attn = kv * c_pair
            reads = (kv + d) * m_kv
            busy = gemm + (attn if attn > reads else reads) + overhead
            if host > busy:
                busy = host
            append(busy + fixed + comm)
        return steps

    def pipeline_share(self, prefill_tokens: int, decode_seqs: int) -> float:
        """With pipeline stages: the share of an iteration's tokens on a turn's critical path,
        its largest microbatch. The decoding sequences spread over ``pp`` microbatches (a lone
        sequence is a microbatch of its own: nothing overlaps it), and the prefill chunks make
        one microbatch. 1 without pipeline stages."""
        pp = self.pp
        if pp == 1:
            return 1.0
        n = decode_seqs + (1 if prefill_tokens else 0)
        share = -(-n // pp) / n
        if prefill_tokens:
            chunk = prefill_tokens / (prefill_tokens + decode_seqs)
            if chunk > share:
                share = chunk
        return share

    def _pipelined_step(
        self, prefill_tokens: int, prefill_attn: float, decode_seqs: int, decode_kv_tokens: int, new_seqs: int
    ) -> float:
        """:meth:`step_time` with pipeline stages: the per-token work (matmuls, attention, KV
        reads, all-reduces, stage hops) of the turn's largest microbatch; the weights, read
        once per microbatch by each stage, and the LM head, on the last stage for every
        sequence, as without stages."""
        tokens = prefill_tokens + decode_seqs
        share = self.pipeline_share(prefill_tokens, decode_seqs)
        kernels = self._kernels(prefill_tokens, prefill_attn, decode_seqs, decode_kv_tokens, share)
        per_token = tokens * share * (self._c_comm + self._c_hop)
        if self.host_token:
            d = kernels if kernels > decode_seqs * self._host_seq else decode_seqs * self._host_seq
            return self._shared_device(d + self._fixed_comm + per_token, decode_seqs, new_seqs)
        busy = kernels + decode_seqs * self._c_seq
        host = decode_seqs * self._host_seq
        if host > busy:
            busy = host
        return busy + self._fixed + per_token + new_seqs * self._request

    def _kernels(
        self, prefill_tokens: int, prefill_attn: float, decode_seqs: int, decode_kv_tokens: int, share: float
    ) -> float:
        """The kernels' time (matmuls and attention, each under its own roof) for ``share`` of
        the per-token work (:meth:`pipeline_share`; 1 without pipeline stages)."""
        tokens = prefill_tokens + decode_seqs
        gemm = tokens * self._c_token * share + decode_seqs * self._c_head
        if gemm < self._m_fixed:
            gemm = self._m_fixed
        attn = (prefill_attn + decode_kv_tokens) * self._c_pair * share
        kv = float(decode_kv_tokens + tokens)  # as int * float would convert it
        if prefill_tokens:
            kv += prefill_attn / prefill_tokens
        kv *= self._m_kv * share
        return gemm + (attn if attn > kv else kv)

    def _shared_host(self, device: float, decode_seqs: int, new_seqs: int, tokens: int) -> float:
        """The iteration's time with a shared host core (the module docstring's quadratic);
        the host roof, when the profile also has one, still bounds the device path."""
        host_roof = decode_seqs * self._host_seq
        if host_roof > device:
            device = host_roof
        return self._shared_device(device + self._fixed_comm + tokens * self._c_comm, decode_seqs, new_seqs)

    def _shared_device(self, d: float, decode_seqs: int, new_seqs: int) -> float:
        """The quadratic's larger root for a device path of ``d`` seconds (communication
        included)."""
        h = self._fixed - self._fixed_comm + decode_seqs * self._c_seq + new_seqs * self._request
        cn = (decode_seqs + new_seqs) * self.host_token
        s = d + h + cn
        return 0.5 * (s + math.sqrt(s * s - 4.0 * d * cn))

    def host_share(self, step: float, decode_seqs: int, new_seqs: int) -> float:
        """The share of the host core an iteration of ``step`` seconds spends streaming its
        sampled tokens (0 without ``host_token_us``)."""
        if step <= 0.0:
            return 0.0
        return (decode_seqs + new_seqs) * self.host_token / step

    def breakdown(
        self,
        prefill_tokens: int,
        prefill_attn: float,
        decode_seqs: int,
        decode_kv_tokens: int,
        new_seqs: int = 0,
    ) -> StepBreakdown:
        """:meth:`step_time` split into its parts (for reports and tests; not for the hot path)."""
        tokens = prefill_tokens + decode_seqs
        if tokens <= 0:
            return StepBreakdown(0.0, 0.0, 0.0, 0.0, 0.0)
        share = self.pipeline_share(prefill_tokens, decode_seqs)
        compute = (
            tokens * self._c_token + (prefill_attn + decode_kv_tokens) * self._c_pair
        ) * share + decode_seqs * self._c_head
        kv = decode_kv_tokens + tokens + (prefill_attn / prefill_tokens if prefill_tokens else 0.0)
        memory = self._m_fixed + kv * self._m_kv * share
        seq = decode_seqs * self._c_seq
        host = decode_seqs * self._host_seq
        request = new_seqs * self._request
        overhead = self._fixed - self._fixed_comm + seq + request
        comm = self._fixed_comm + tokens * share * (self._c_comm + self._c_hop)
        kernels = self._kernels(prefill_tokens, prefill_attn, decode_seqs, decode_kv_tokens, share)
        total = self.step_time(prefill_tokens, prefill_attn, decode_seqs, decode_kv_tokens, new_seqs)
        return StepBreakdown(compute, memory, overhead, comm, total, host, request, seq, kernels)

    def prefill_time(self, tokens: int, context: int = 0) -> float:
        """Seconds to prefill ``tokens`` prompt tokens in one iteration after ``context`` tokens
        already cached (a prefix-cache hit or an earlier chunk)."""
        return self.step_time(tokens, tokens * (context + tokens / 2), 0, 0)

    def decode_time(self, batch: int, context: int) -> float:
        """Seconds of one decode iteration of ``batch`` sequences, each attending over
        ``context`` tokens."""
        return self.step_time(0, 0.0, batch, batch * context)

    def decode_crossover_batch(self, context: int = 0) -> float | None:
        """Decode batch size at which an iteration turns from memory-bound to compute-bound
        when each sequence attends over ``context`` tokens; ``None`` when it never does (the
        KV reads grow faster than the FLOPs)."""
        per_seq_compute = self._c_token + self._c_head + context * self._c_pair
        per_seq_memory = (context + 1) * self._m_kv
        if per_seq_compute <= per_seq_memory:
            return None
        return self._m_fixed / (per_seq_compute - per_seq_memory)

    def __repr__(self) -> str:
        return (
            f"CostModel({self.model.spec} on {self.tp * self.pp}x {self.hardware.name}"
            f"{f' (PP {self.pp})' if self.pp > 1 else ''}, "
            f"compute in {self.compute_precision})"
        )
