"""The guide's capacity sheet: from a GPU's memory to KV blocks, tokens and concurrent sequences.

The plain formula view. `gpu_memory_utilization` is a fraction of the whole card (not of what
is free): the engine may use `total x utilization` bytes. From that it subtracts the weights
(this rank's shard) and a reserve for activations, CUDA graphs and the runtime; the rest is the
KV budget. The budget is cut into blocks of `block_size` slots across all layers:

    num_blocks = budget // block_bytes      tokens = num_blocks x block_size
    max concurrency at context T = num_blocks / blocks one T-token sequence needs

A recurrent layer's state (Mamba hybrids) is not in blocks in this view: it is counted as the
blocks its bytes would fill, once per sequence.

`lab.sizing.vllm_sheet` does the same step by step the way vLLM v1 computes and logs it (the
memory CUDA reports, KV-cache groups, concurrency at max_model_len); the page shows both.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from lab.sizing.kv_formula import KVLayout
from lab.sizing.model_spec import ModelSpec
from lab.sizing.weights import weight_bytes_per_gpu

__all__ = ["GIB", "GPU", "CapacitySheet", "capacity_sheet", "fitting_tp", "kv_budget_sheet",
           "lab_pool", "load_gpus", "weight_bytes_per_gpu"]

GIB = 1 << 30
MIB = 1 << 20
GPUS_PATH = Path(__file__).resolve().parents[2] / "assets" / "gpus.json"
# What the block-table walkthrough (pages/block_tables.py) can animate.
LAB_MAX_BLOCKS, LAB_MIN_BLOCKS, LAB_MAX_BLOCK_SIZE = 64, 4, 64


@dataclass(frozen=True)
class GPU:
    name: str
    memory_gib: float
    marketed: str
    source: str
    bandwidth_gbs: float  # memory bandwidth, decimal GB/s (data sheet)
    bf16_tflops: float  # dense BF16 tensor rate, TFLOP/s (data sheet, no sparsity)
    cuda_total_mib: int  # what torch.cuda.mem_get_info() reports as total, in MiB
    cuda_source: str

    @property
    def memory_bytes(self) -> int:
        """The driver's total (nvidia-smi), what the guide's formula starts from."""
        return int(self.memory_gib * GIB)

    @property
    def cuda_bytes(self) -> int:
        """The total vLLM's MemorySnapshot reads (torch.cuda.mem_get_info)."""
        return self.cuda_total_mib * MIB


@cache
def load_gpus(path: Path = GPUS_PATH) -> dict[str, GPU]:
    """GPU presets by name, from assets/gpus.json."""
    entries = json.loads(path.read_text())["gpus"]
    return {e["name"]: GPU(e["name"], float(e["memory_gib"]), e["marketed"], e["source"],
                           float(e["bandwidth_gbs"]), float(e["bf16_tflops"]),
                           int(e["cuda_total_mib"]), e["cuda_source"]) for e in entries}


def blocks_for_budget(budget_bytes: int, block_bytes: int) -> int:
    return max(0, budget_bytes) // block_bytes


@dataclass(frozen=True)
class CapacitySheet:
    gpu_bytes: int
    utilization: float
    weight_bytes: int
    reserve_bytes: int
    block_size: int
    block_bytes: int  # one block across all layers (this rank)
    context: int
    num_blocks: int
    seq_blocks: float  # blocks one `context`-token sequence needs (all-layer blocks)

    @property
    def usable_bytes(self) -> int:
        return int(self.gpu_bytes * self.utilization)

    @property
    def kv_budget_bytes(self) -> int:
        """May be negative: then the weights and reserve alone do not fit."""
        return self.usable_bytes - self.weight_bytes - self.reserve_bytes

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def max_concurrency(self) -> float:
        return self.num_blocks / self.seq_blocks


def capacity_sheet(layout: KVLayout, *, gpu_bytes: int, utilization: float, weight_bytes: int,
                   reserve_bytes: int, block_size: int, context: int) -> CapacitySheet:
    if not 0 < utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {utilization}")
    if block_size < 1 or context < 1:
        raise ValueError("block size and context must be at least 1")
    block_bytes = layout.block_bytes(block_size)
    budget = int(gpu_bytes * utilization) - weight_bytes - reserve_bytes
    # A windowed layer holds fewer blocks than a full one; count in all-layer block units, and
    # a recurrent state as the blocks its bytes would fill.
    seq_blocks = (layout.layer_blocks(context, block_size) / layout.kv_layers
                  + layout.state_bytes / block_bytes)
    return CapacitySheet(gpu_bytes, utilization, weight_bytes, reserve_bytes, block_size,
                         block_bytes, context, blocks_for_budget(budget, block_bytes), seq_blocks)


def kv_budget_sheet(layout: KVLayout, kv_budget_bytes: int, block_size: int,
                    context: int) -> CapacitySheet:
    """A sheet from a KV budget already known (e.g. the number vLLM logs at start-up)."""
    return capacity_sheet(layout, gpu_bytes=kv_budget_bytes, utilization=1.0, weight_bytes=0,
                          reserve_bytes=0, block_size=block_size, context=context)


def fitting_tp(spec: ModelSpec, weight_dtype: str, usable_bytes: int, reserve_bytes: int,
               choices: Sequence[int]) -> int | None:
    """The smallest tensor-parallel degree among `choices` whose weight shard and reserve
    leave room for KV blocks (None: none of them does)."""
    return next((tp for tp in sorted(choices)
                 if spec.weight_bytes(tp, weight_dtype) + reserve_bytes < usable_bytes), None)


def lab_pool(num_blocks: int, max_blocks: int = LAB_MAX_BLOCKS) -> tuple[int, int]:
    """(blocks in the walkthrough's pool, real blocks each one stands for)."""
    if num_blocks <= max_blocks:
        return num_blocks, 1
    scale = -(-num_blocks // max_blocks)
    return num_blocks // scale, scale
