"""The capacity sheet: from a GPU's memory to KV blocks, tokens and concurrent sequences.

Follows vLLM's accounting. `gpu_memory_utilization` is a fraction of the whole card (not of
what is free): the engine may use `total x utilization` bytes. From that it subtracts the
weights (this rank's shard) and a reserve for activations, CUDA graphs and the runtime; the rest
is the KV budget. The budget is cut into blocks of `block_size` slots across all layers:

    num_blocks = budget // block_bytes      tokens = num_blocks x block_size
    max concurrency at context T = num_blocks / blocks one T-token sequence needs
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from lab.sizing.kv_formula import KVLayout

GIB = 1 << 30
GPUS_PATH = Path(__file__).resolve().parents[2] / "assets" / "gpus.json"
WEIGHT_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp8": 1.0, "int4": 0.5}  # per parameter
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

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)


@cache
def load_gpus(path: Path = GPUS_PATH) -> dict[str, GPU]:
    """GPU presets by name, from assets/gpus.json."""
    entries = json.loads(path.read_text())["gpus"]
    return {e["name"]: GPU(e["name"], float(e["memory_gib"]), e["marketed"], e["source"],
                           float(e["bandwidth_gbs"]), float(e["bf16_tflops"])) for e in entries}


def weight_bytes_per_gpu(num_params: int, weight_dtype: str, tp: int = 1) -> int:
    """This rank's shard of the weights: parameters x bytes per parameter / tp."""
    return -(-int(num_params * WEIGHT_BYTES[weight_dtype]) // tp)


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
    # A sliding layer holds fewer blocks than a full one; count in all-layer block units.
    seq_blocks = layout.layer_blocks(context, block_size) / layout.spec.num_layers
    return CapacitySheet(gpu_bytes, utilization, weight_bytes, reserve_bytes, block_size,
                         block_bytes, context, blocks_for_budget(budget, block_bytes), seq_blocks)


def kv_budget_sheet(layout: KVLayout, kv_budget_bytes: int, block_size: int,
                    context: int) -> CapacitySheet:
    """A sheet from a KV budget already known (e.g. the number vLLM logs at start-up)."""
    return capacity_sheet(layout, gpu_bytes=kv_budget_bytes, utilization=1.0, weight_bytes=0,
                          reserve_bytes=0, block_size=block_size, context=context)


def lab_pool(num_blocks: int, max_blocks: int = LAB_MAX_BLOCKS) -> tuple[int, int]:
    """(blocks in the walkthrough's pool, real blocks each one stands for)."""
    if num_blocks <= max_blocks:
        return num_blocks, 1
    scale = -(-num_blocks // max_blocks)
    return num_blocks // scale, scale
