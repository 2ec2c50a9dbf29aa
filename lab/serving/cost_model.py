"""Simulated time for one scheduler iteration: a roofline over the model and the GPU.

One iteration runs the model once over every token scheduled in it (decode tokens and prefill
chunks together). It must

- read every weight once and every scheduled sequence's cached K/V once, and write the new
  tokens' K/V:   bytes = weight bytes + (context tokens read + new tokens) x KV bytes per token
- do the arithmetic: 2 FLOPs per parameter per new token (one multiply-add per weight), plus
  attention: 4 x layers x heads x head_dim FLOPs per (query, key) pair (Q.K and P.V).

    time = max(bytes / bandwidth, FLOPs / peak rate) + bookkeeping

The block size has a price on both sides (the guide's "real tradeoff"), so a paged pool pays
for its blocks as well as saving memory:

- the kernel's work per block: every block a sequence's attention visits costs, beyond its
  K/V bytes, a table lookup and a loop turn that bandwidth does not hide. We charge it as
  reading BLOCK_VISIT_TOKENS more tokens of K/V per block visited: 3.2 tokens, so that at the
  default block size of 16 paged attention reads cost 20% more than dense ones, the overhead
  the vLLM paper measured for its kernel against FasterTransformer's (Kwon et al., SOSP 2023,
  section 7.1: 20-26% higher attention latency). At block size 1 the reads cost 4.2x, at 256
  about 1%.
- the allocator's metadata work: the scheduler runs on the CPU between iterations, and every
  block it takes (or region it reserves) costs `block_op_s` of bookkeeping.

Larger blocks waste more of the pool instead (their last block's tail), which the scheduler sees
as fewer sequences admitted.

Decode iterations with small batches are memory-bound (the weights dominate); prefill and large
batches become compute-bound. This is a teaching model: no kernel efficiency factors, no
communication, no CPU overhead beyond the allocator's; MoE models are charged for all their
weights (an upper bound).
Model geometry and weights come from the calculator's presets (lab/sizing/: model_spec.py,
kv_formula.py, capacity.py); the bandwidth and peak rate of each GPU preset are data-sheet
figures kept in assets/gpus.json.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from lab.sizing.capacity import load_gpus
from lab.sizing.kv_formula import kv_layout
from lab.sizing.model_spec import ModelSpec

Bound = Literal["memory", "compute"]


BLOCK_VISIT_TOKENS = 3.2  # per block visited: 20% of a 16-token block's reads (see above)
# CPU seconds per block taken: it is allocated and later freed, two block operations of the
# lab allocator's, each a couple of microseconds of Python (bench/allocator.py measures them;
# its time per block op includes token appends, so this errs on the generous side).
BLOCK_OP_S = 4e-6


@dataclass(frozen=True)
class IterationCost:
    seconds: float
    memory_s: float
    compute_s: float
    bookkeeping_s: float = 0.0  # the allocator's CPU work before the iteration

    @property
    def bound(self) -> Bound:
        return "compute" if self.compute_s > self.memory_s else "memory"


@dataclass(frozen=True)
class CostModel:
    weight_bytes: int
    kv_bytes_per_token: int
    flops_per_token: float  # 2 x parameters
    attn_flops_per_pair: float  # 4 x layers x query heads x head_dim
    bandwidth: float  # bytes / s
    peak_flops: float  # FLOP / s
    label: str = ""
    block_visit_tokens: float = BLOCK_VISIT_TOKENS
    block_op_s: float = BLOCK_OP_S

    def iteration(self, new_tokens: int, context_tokens: int, attn_pairs: int,
                  block_visits: int = 0, block_ops: int = 0) -> IterationCost:
        """Cost of one iteration computing `new_tokens` tokens whose sequences hold
        `context_tokens` tokens in all (new ones included), with `attn_pairs` (query, key)
        pairs; the kernel visits `block_visits` blocks (summed over sequences) and the
        allocator took `block_ops` blocks or regions for it."""
        kv_tokens = context_tokens + new_tokens + block_visits * self.block_visit_tokens
        bytes_moved = self.weight_bytes + kv_tokens * self.kv_bytes_per_token
        flops = new_tokens * self.flops_per_token + attn_pairs * self.attn_flops_per_pair
        memory_s, compute_s = bytes_moved / self.bandwidth, flops / self.peak_flops
        bookkeeping_s = block_ops * self.block_op_s
        return IterationCost(max(memory_s, compute_s) + bookkeeping_s, memory_s, compute_s,
                             bookkeeping_s)

    def crossover_batch(self, context: int) -> float:
        """Decode batch size at which compute time reaches memory time (each sequence holding
        `context` tokens): past it, more live sequences stop paying off."""
        per_seq_bytes = (context + 1) * self.kv_bytes_per_token
        per_seq_flops = self.flops_per_token + context * self.attn_flops_per_pair
        # weight/bw + b * per_seq_bytes/bw = b * per_seq_flops/peak
        gap = per_seq_flops / self.peak_flops - per_seq_bytes / self.bandwidth
        return float("inf") if gap <= 0 else (self.weight_bytes / self.bandwidth) / gap


class Cost(Protocol):
    """What the scheduler asks of a cost model: how long one iteration takes."""

    label: str

    def iteration(self, new_tokens: int, context_tokens: int, attn_pairs: int,
                  block_visits: int = 0, block_ops: int = 0) -> IterationCost: ...


@dataclass(frozen=True)
class StepClock:
    """Every iteration takes one unit of time, so the clock counts iterations and arrival
    times are step numbers: the walkthrough pages' steps, with no model or GPU behind them."""

    label: str = "one step per iteration"

    def iteration(self, new_tokens: int, context_tokens: int, attn_pairs: int,
                  block_visits: int = 0, block_ops: int = 0) -> IterationCost:
        return IterationCost(1.0, 1.0, 0.0)


def attention_pairs(query_len: np.ndarray | int, seq_len: np.ndarray | int) -> np.ndarray | int:
    """(query, key) pairs of causal attention for the last query_len of seq_len tokens
    (elementwise on arrays)."""
    return query_len * seq_len - query_len * (query_len - 1) // 2


def cost_model(spec: ModelSpec, gpu_name: str, *, kv_dtype: str = "fp16",
               tp: int = 1) -> CostModel:
    """The cost model of `spec` on one GPU preset (weights sharded over `tp` GPUs)."""
    gpus = load_gpus()
    if gpu_name not in gpus:
        raise ValueError(f"no rates for GPU {gpu_name!r}; choose one of {', '.join(gpus)}")
    if spec.num_params <= 0:
        raise ValueError(f"{spec.name} has no parameter count: the cost model needs one")
    gpu = gpus[gpu_name]
    layout = kv_layout(spec, kv_dtype, tp)
    head_dim = layout.vector_len if spec.is_mla else spec.head_dim
    return CostModel(
        weight_bytes=spec.weight_bytes(tp),
        kv_bytes_per_token=layout.bytes_per_token,
        flops_per_token=2.0 * spec.num_params / tp,
        attn_flops_per_pair=4.0 * spec.num_layers * spec.num_attention_heads * head_dim / tp,
        bandwidth=gpu.bandwidth_gbs * 1e9, peak_flops=gpu.bf16_tflops * 1e12,
        label=f"{spec.name} on {gpu_name}" + (f" (TP {tp})" if tp > 1 else ""))
