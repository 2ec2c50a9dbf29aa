"""The model's KV cache kept in the lab's paged KV pool, managed by the same KVCacheManager
(block pool, forks, copy-on-write, prefix cache) that every other page drives.

Each forward step, for each layer:
- "Triton kernel" layers have the new tokens' K/V stored in the pool by the cache-write kernel,
  then run the Triton `paged_attention` kernel, which reads K/V through the block tables. The
  last of them is also run through the float64 dense reference, and the error kept.
- "torch gather" layers read the earlier tokens' K/V from the same pool through the same block
  tables (one vectorized gather, for every layer at once, at the first such layer), place the
  new tokens' K/V beside them, and run plain attention.
On a GPU the kernel serves every layer, each writing its own K/V first. The Triton interpreter
is too slow for 30 layers per token on a CPU, so there the kernel serves the last layer: by
then every layer's new K/V is known, and one `KVCacheManager.write_batch` (KVPool.write, one
launch of the cache-write kernel) stores them all before the kernel reads the pool. The
manager commits the new positions, which registers blocks that became full in the prefix cache.

The step knows its lengths, slots and block tables on the host (the sequences' lists), so it
checks them there once, and plans the kernel once (at its first kernel layer); a layer then
only launches kernels, reading nothing back from the device (on a GPU: no host sync, and the
layers can be captured in a CUDA graph). The float64 check of the kernel runs in `store`,
after the layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from kernels.attention_plan import AttentionPlan
from kernels.backend import backend
from kernels.cache_ops import check_slots
from kernels.paged_attention import plan_call, prepare_launch
from kernels.paged_inputs import AttentionShapes, HostBatch, check_paged_inputs
from kernels.reference import AttentionCheck, compare, dense_attention
from lab.memory.block_table import Sequence
from lab.memory.cache_manager import KVCacheManager
from lab.memory.kv_pool import PoolConfig
from lab.model.step_layout import StepLayout, context_attention
from lab.model.transformer import ModelConfig

KERNEL = "Triton paged_attention kernel"
GATHER = "torch gather through the block tables"
# Which layers the Triton kernel serves: every layer (the CUDA default), one layer per step
# (the CPU default: the interpreter is slow), or none (benchmarks only: paging cost alone).
KernelPlan = Literal["every layer", "one layer", "none"]


def pool_config_for(model: ModelConfig, num_blocks: int, block_size: int = 16,
                    dtype: torch.dtype = torch.float32) -> PoolConfig:
    """A KV pool shaped for this model: every layer, its KV heads and head dim."""
    return PoolConfig(num_blocks=num_blocks, block_size=block_size, num_layers=model.num_layers,
                      num_kv_heads=model.num_kv_heads, head_dim=model.head_dim, dtype=dtype)


@dataclass(frozen=True)
class ForwardReport:
    """Which implementation served which layers in one forward step, and the kernel's error."""

    index: int
    num_seqs: int
    num_tokens: int
    kernel_layers: tuple[int, ...]
    gather_layers: tuple[int, ...]
    checked_layer: int | None  # the kernel layer compared with the float64 dense reference
    check: AttentionCheck | None


class PagedStep:
    """One forward step over the paged pool; the model calls it once per layer."""

    def __init__(self, cache: PagedKVCache, seqs: list[Sequence]) -> None:
        self.cache = cache
        self.seqs = seqs
        pool = cache.manager.pool
        self.device = pool.device
        query_lens = [len(s) - s.num_written for s in seqs]
        seq_lens = [len(s) for s in seqs]
        self.layout = StepLayout(tuple(query_lens), tuple(seq_lens), self.device)
        new_tokens = [t for s in seqs for t in s.tokens[s.num_written:]]
        self.token_ids = torch.tensor(new_tokens, device=self.device)  # [num_tokens]
        slots = [slot for s in seqs for slot in s.slots(s.num_written, len(s))]
        check_slots(slots, pool.num_slots)  # on the host, once: the layers write unchecked
        self.slot_mapping = torch.tensor(slots, dtype=torch.int64, device=self.device)  # [T]
        self.block_tables = cache.manager.block_table_tensor([s.seq_id for s in seqs])  # [S, W]
        self.seq_lens = self.layout.seq_lens_tensor  # [S] int32
        self.query_start_loc = self.layout.query_start_loc  # [S + 1] int32
        self.host = HostBatch.from_tables(seq_lens, query_lens, cache.manager.block_size,
                                          [s.block_table for s in seqs])
        self.attention: tuple[AttentionShapes, AttentionPlan] | None = None  # at layer one
        last = cache.num_layers - 1
        self.kernel_layers = {"every layer": tuple(range(cache.num_layers)),
                              "one layer": (last,), "none": ()}[cache.kernel_plan]
        self.checked_layer = last if self.kernel_layers else None
        self.checked: tuple[torch.Tensor, ...] | None = None  # its query, output and caches
        self.written = False  # every layer's new K/V in the pool and committed
        # Gather layers read every layer's earlier K/V through the block tables at once.
        self.context: tuple[torch.Tensor, torch.Tensor] | None = None  # [L, S, C, KV, D] each
        self.keys: list[torch.Tensor] = []  # per layer [T, KV, D]
        self.values: list[torch.Tensor] = []
        self.check: AttentionCheck | None = None

    def __call__(self, layer: int, query: torch.Tensor, key: torch.Tensor,
                 value: torch.Tensor) -> torch.Tensor:
        self.keys.append(key)
        self.values.append(value)
        pool = self.cache.manager.pool
        if layer in self.kernel_layers:
            if self.cache.kernel_plan == "every layer":
                pool.write_layer(layer, self.slot_mapping, key, value)  # this layer's
            else:  # the last layer: every layer's new K/V is known, written in one launch
                self._write_all()
            key_cache, value_cache = pool.key_caches[layer], pool.value_caches[layer]
            out = self._attend(query, key_cache, value_cache)  # [T, H, D]
            if layer == self.checked_layer:
                self.checked = (query, out, key_cache, value_cache)
            return out
        if self.context is None:
            self.context = pool.read_slots(self._context_slots())
        keys, values = self.context[0][layer], self.context[1][layer]  # [S, C, KV, D]
        keys[self.layout.token_seq, self.layout.positions] = key  # new tokens, not stored yet
        values[self.layout.token_seq, self.layout.positions] = value
        return context_attention(query, keys, values, self.layout)  # [T, H, D]

    def _tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.block_tables, self.seq_lens, self.query_start_loc

    def _attend(self, query: torch.Tensor, key_cache: torch.Tensor,
                value_cache: torch.Tensor) -> torch.Tensor:
        """The Triton kernel on this layer; the first call checks the inputs (on the host
        values) and plans the launch for every layer."""
        if self.attention is None:
            shapes = check_paged_inputs(query, key_cache, value_cache, *self._tensors(),
                                        host=self.host)
            plan = plan_call(shapes, query, self.block_tables, self.seq_lens,
                             whole_batch=self.cache.whole_batch)
            self.attention = shapes, plan
        shapes, plan = self.attention
        return prepare_launch(plan, shapes, query, key_cache, value_cache,
                              *self._tensors()).run()

    def _context_slots(self) -> torch.Tensor:
        """[S, C]: the slot of each context position of each sequence."""
        bs = self.cache.manager.block_size
        pos = torch.arange(max(self.layout.seq_lens), device=self.device)  # [C]
        physical = self.block_tables[:, pos // bs].long()  # [S, C]
        return physical * bs + pos % bs

    def _write_all(self) -> None:
        """Write every layer's new K/V into the pool (KVPool.write, one launch) and commit it."""
        keys = torch.stack(self.keys)  # [num_layers, T, KV, D]
        values = torch.stack(self.values)
        self.cache.manager.write_batch([s.seq_id for s in self.seqs], keys, values)
        self.written = True

    def store(self) -> ForwardReport:
        """Finish the step's writes (whatever the layers did not write yet), check the kernel's
        layer against the float64 reference, and report it."""
        if self.cache.kernel_plan == "every layer":  # each layer wrote its own K/V
            for seq in self.seqs:
                self.cache.manager.commit(seq.seq_id, len(seq))
        elif not self.written:
            self._write_all()
        if self.checked is not None:
            query, out, key_cache, value_cache = self.checked
            reference = dense_attention(query, key_cache, value_cache, *self._tensors())
            self.check = compare(out, reference, self.layout.num_seqs)
        all_layers = range(len(self.keys))
        return ForwardReport(self.cache.num_steps, self.layout.num_seqs, len(self.token_ids),
                             self.kernel_layers,
                             tuple(i for i in all_layers if i not in self.kernel_layers),
                             self.checked_layer, self.check)


class PagedKVCache:
    """The `SequenceCache` for generation, over a KVCacheManager whose pool fits the model."""

    def __init__(self, manager: KVCacheManager, model: ModelConfig,
                 kernel_plan: KernelPlan | None = None) -> None:
        c = manager.config
        expected = (model.num_layers, model.num_kv_heads, model.head_dim)
        if (c.num_layers, c.num_kv_heads, c.head_dim) != expected:
            raise ValueError(f"the pool holds (layers, KV heads, head dim) = "
                             f"{(c.num_layers, c.num_kv_heads, c.head_dim)}, the model needs "
                             f"{expected}: build it with pool_config_for(model)")
        self.manager = manager
        self.num_layers = model.num_layers
        if kernel_plan is None:
            kernel_plan = "every layer" if backend().is_cuda else "one layer"
        if kernel_plan not in ("every layer", "one layer", "none"):
            raise ValueError(f"unknown kernel plan {kernel_plan!r}")
        self.kernel_plan: KernelPlan = kernel_plan
        # The kernel's program layout (kernels/attention_plan.py); None: the backend's default
        # (whole batch in the interpreter). False runs a GPU's per-sequence layout anywhere.
        self.whole_batch: bool | None = None
        self.num_steps = 0
        self.reports: list[ForwardReport] = []

    def add(self, prompt: list[int]) -> int:
        return self.manager.add_sequence(prompt).seq_id

    def fork(self, seq_id: int) -> int:
        return self.manager.fork(seq_id).seq_id

    def append(self, seq_id: int, token: int) -> None:
        self.manager.append_token(seq_id, token)

    def begin_step(self, seq_ids: list[int]) -> PagedStep:
        return PagedStep(self, [self.manager.sequences[i] for i in seq_ids])

    def end_step(self, step: PagedStep) -> None:
        self.reports.append(step.store())
        self.num_steps += 1
