"""The KV pool: real K and V tensors, per layer [num_blocks, block_size, num_kv_heads, head_dim].

This is vLLM's NHD layout. The pool only stores and moves bytes; which block belongs to whom is
the block pool's business. Writes and block copies run the Triton kernels of kernels/cache_ops.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.backend import device as active_device
from kernels.cache_ops import check_slots, copy_blocks, write_kv
from kernels.reference import gather_kv

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class PoolConfig:
    num_blocks: int = 64
    block_size: int = 16
    num_layers: int = 1
    num_kv_heads: int = 2
    head_dim: int = 64
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        for name in ("num_blocks", "block_size", "num_layers", "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.dtype not in DTYPES.values():
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype}")

    @property
    def bytes_per_token(self) -> int:
        """K and V, every layer: the guide's 2 x layers x KV heads x head dim x bytes."""
        element = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * element

    @property
    def bytes_per_block(self) -> int:
        return self.bytes_per_token * self.block_size


class KVPool:
    """K and V for every layer. Each is one tensor holding all layers' blocks end to end, so
    that a write or a block copy for all layers is one kernel launch (layer l's block b is
    block l * num_blocks + b of the whole); `key_caches[l]` / `value_caches[l]` are views of
    one layer, [num_blocks, block_size, num_kv_heads, head_dim], for the attention kernel."""

    def __init__(self, config: PoolConfig, device: torch.device | None = None) -> None:
        self.config = config
        self.device = device if device is not None else active_device()
        c = config
        shape = (c.num_layers * c.num_blocks, c.block_size, c.num_kv_heads, c.head_dim)
        self._keys = torch.zeros(shape, dtype=c.dtype, device=self.device)  # all layers' blocks
        self._values = torch.zeros(shape, dtype=c.dtype, device=self.device)
        self.key_caches = list(self._keys.view(c.num_layers, c.num_blocks, *shape[1:]).unbind(0))
        self.value_caches = list(
            self._values.view(c.num_layers, c.num_blocks, *shape[1:]).unbind(0))
        # first block id of each layer inside the whole tensor: [num_layers, 1]
        self._layer_base = torch.arange(c.num_layers, device=self.device)[:, None] * c.num_blocks

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self._keys, self._values))

    @property
    def num_slots(self) -> int:
        """Slots of one layer: num_blocks * block_size."""
        return self.config.num_blocks * self.config.block_size

    def write(self, slot_mapping: list[int] | torch.Tensor, keys: torch.Tensor,
              values: torch.Tensor) -> None:
        """Store new K/V in their slots, every layer, in one launch.

        keys, values: [num_layers, n, num_kv_heads, head_dim]; slot_mapping: n slots (a list
        is checked on the host, a tensor on its device).
        """
        c = self.config
        expected = (c.num_layers, len(slot_mapping), c.num_kv_heads, c.head_dim)
        for name, t in (("keys", keys), ("values", values)):
            if tuple(t.shape) != expected:
                raise ValueError(f"{name} must have shape {expected}, got {tuple(t.shape)}")
        check_slots(slot_mapping, self.num_slots)  # one layer's; the others are offsets of it
        slots = torch.as_tensor(slot_mapping, dtype=torch.int64, device=self.device)  # [n]
        all_slots = (slots[None, :] + self._layer_base * c.block_size).reshape(-1)  # [L * n]
        write_kv(self._keys, self._values,
                 keys.reshape(-1, c.num_kv_heads, c.head_dim).to(self.device, c.dtype).contiguous(),
                 values.reshape(-1, c.num_kv_heads, c.head_dim).to(self.device, c.dtype)
                 .contiguous(), all_slots, check=False)

    def write_layer(self, layer: int, slot_mapping: torch.Tensor, keys: torch.Tensor,
                    values: torch.Tensor) -> None:
        """Store one layer's new K/V ([n, num_kv_heads, head_dim]) at slots the caller checked
        (`check_slots`, once per step): nothing is read back, so a CUDA graph can capture it."""
        write_kv(self.key_caches[layer], self.value_caches[layer], keys, values, slot_mapping,
                 check=False)

    def copy_block(self, src: int, dst: int) -> None:
        """Copy one physical block into another, every layer (copy-on-write, relocation)."""
        pairs = self._layer_base + torch.tensor([[src, dst]], device=self.device)  # [L, 2]
        copy_blocks(self._keys, self._values, pairs)

    def read_slots(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of every layer at these slots, one gather each: [num_layers, *slots.shape,
        num_kv_heads, head_dim]."""
        c = self.config
        rows = (c.num_layers, c.num_blocks * c.block_size, c.num_kv_heads * c.head_dim)
        out = (c.num_layers, *slots.shape, c.num_kv_heads, c.head_dim)
        flat = slots.reshape(-1)  # [n]
        # index_select over whole slot rows: ~3x faster on a CPU than advanced indexing
        return (self._keys.view(rows).index_select(1, flat).view(out),
                self._values.view(rows).index_select(1, flat).view(out))

    def gather(self, block_table: list[int], length: int,
               layer: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Read a sequence's K/V back through its block table: each [length, kv_heads, head_dim]."""
        table = torch.as_tensor(block_table, dtype=torch.int32, device=self.device)
        return (gather_kv(self.key_caches[layer], table, length),
                gather_kv(self.value_caches[layer], table, length))
