"""Cache operations: write new K/V into their slots, and copy whole physical blocks.

`write_kv` stores token i's K/V at slot_mapping[i] = physical_block * block_size + offset
(a negative slot means "skip this token"). `copy_blocks` copies physical block src into dst for
every (src, dst) pair: the copy in copy-on-write, or a block being moved.

Checking the slots reads them back from the device (a host sync, which no CUDA graph can
capture). A caller that built them from a host list checks the list once (`check_slots`) and
writes every layer with `check=False`; the other checks read only shapes and dtypes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import kernels.backend  # noqa: F401  (sets TRITON_INTERPRET before triton loads)
from kernels.backend import backend, kernel_launch

CACHE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)


@triton.jit
def _write_kv_kernel(key_cache_ptr, value_cache_ptr, key_ptr, value_ptr, slot_mapping_ptr,
                     ROW: tl.constexpr, ROW_PAD: tl.constexpr, BLOCK_T: tl.constexpr):
    # One program writes BLOCK_T tokens. In a contiguous cache, slot s starts at element s * ROW
    # (ROW: a slot's num_kv_heads * head_dim values, or the 8-byte words they fill), and token t's
    # K (or V) row starts at t * ROW in key (value). slot_mapping is the wrapper's int64 copy,
    # padded with -1 (skip) to whole programs, so reading it needs no mask.
    # Index arithmetic is int64 from the program id on: the interpreter checks every int32 add,
    # sub and mul for overflow (seven more ops each).
    tokens = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None]  # [T, 1]
    slots = tl.load(slot_mapping_ptr + tokens)  # [T, 1]
    cols = tl.arange(0, ROW_PAD)[None, :]  # [1, R]
    mask = (slots >= 0) & (cols < ROW)  # [T, R]: skipped tokens and padding
    dst = slots * ROW + cols  # [T, R]
    src = tokens * ROW + cols  # [T, R]
    tl.store(key_cache_ptr + dst, tl.load(key_ptr + src, mask=mask), mask=mask)
    tl.store(value_cache_ptr + dst, tl.load(value_ptr + src, mask=mask), mask=mask)


@triton.jit
def _copy_blocks_kernel(key_cache_ptr, value_cache_ptr, src_dst_ptr, num_pairs, block_numel,
                        PAIRS: tl.constexpr, CHUNK: tl.constexpr):
    # Program (tile of pairs, chunk) copies one chunk of each pair's contiguous physical block,
    # K and V. A GPU takes one pair a program; the interpreter, every pair at once.
    pairs = tl.program_id(0).to(tl.int64) * PAIRS + tl.arange(0, PAIRS)[:, None]  # [P, 1] int64
    pair_ok = pairs < num_pairs
    src = tl.load(src_dst_ptr + 2 * pairs, mask=pair_ok, other=0).to(tl.int64) * block_numel
    dst = tl.load(src_dst_ptr + 2 * pairs + 1, mask=pair_ok, other=0).to(tl.int64) * block_numel
    offs = tl.program_id(1).to(tl.int64) * CHUNK + tl.arange(0, CHUNK)[None, :]  # [1, C]
    mask = pair_ok & (offs < block_numel)  # [P, C]
    tl.store(key_cache_ptr + dst + offs, tl.load(key_cache_ptr + src + offs, mask=mask), mask=mask)
    tl.store(value_cache_ptr + dst + offs, tl.load(value_cache_ptr + src + offs, mask=mask),
             mask=mask)


def _check_caches(key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
    for name, t in (("key_cache", key_cache), ("value_cache", value_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name}: expected a 4-D tensor "
                             "[num_blocks, block_size, num_kv_heads, head_dim]")
        if t.dtype not in CACHE_DTYPES:
            raise ValueError(f"{name}: dtype must be float32/float16/bfloat16, got {t.dtype}")
        if not t.is_contiguous():
            raise ValueError(f"{name}: must be contiguous")
        if min(t.shape) < 1:
            raise ValueError(f"{name}: every dimension must be >= 1, got {tuple(t.shape)}")
    if value_cache.shape != key_cache.shape or value_cache.dtype != key_cache.dtype:
        raise ValueError(f"value_cache: {tuple(value_cache.shape)} {value_cache.dtype} differs "
                         f"from key_cache {tuple(key_cache.shape)} {key_cache.dtype}")
    if value_cache.device != key_cache.device:
        raise ValueError(f"value_cache: is on {value_cache.device}, "
                         f"key_cache on {key_cache.device}")
    if backend().is_cuda and key_cache.device.type != "cuda":
        raise ValueError("key_cache: the compiled Triton backend needs CUDA tensors, "
                         f"got {key_cache.device}")


def _check_index(name: str, t: object, ndim: int, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor) or t.dim() != ndim or t.dtype not in INDEX_DTYPES:
        raise ValueError(f"{name}: expected a {ndim}-D int32/int64 tensor")
    if t.device != device:
        raise ValueError(f"{name}: is on {t.device} but the caches are on {device}")


def _as_words(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The same bytes as 8-byte words when every tensor's head rows split into whole, aligned
    words; else the tensors as they are. A write only moves bytes, and moving float32 as words
    halves the elements to move (what the interpreter pays for; a GPU moves wider words too)."""
    def fits(t: torch.Tensor) -> bool:
        return (t.shape[-1] * t.element_size()) % 8 == 0 and (
            t.storage_offset() * t.element_size()) % 8 == 0
    if all(fits(t) for t in tensors):
        return tuple(t.view(torch.int64) for t in tensors)
    return tensors


def check_slots(slot_mapping: torch.Tensor | list[int], num_slots: int) -> None:
    """Every written (non-negative) slot inside the cache's num_slots, none twice. A tensor is
    read back from its device; a list is checked on the host."""
    if isinstance(slot_mapping, torch.Tensor):
        valid = slot_mapping[slot_mapping >= 0]  # [num_written]
        top = int(valid.max()) if valid.numel() else -1
        repeated = valid.numel() and valid.unique().numel() != valid.numel()
    else:
        valid = [s for s in slot_mapping if s >= 0]
        top, repeated = max(valid, default=-1), len(set(valid)) != len(valid)
    if top >= num_slots:
        raise ValueError(f"slot_mapping: slot {top} is outside the {num_slots} slots of the "
                         "cache")
    if repeated:
        raise ValueError("slot_mapping: the same slot appears twice")


def write_kv(key_cache: torch.Tensor, value_cache: torch.Tensor, key: torch.Tensor,
             value: torch.Tensor, slot_mapping: torch.Tensor, *, check: bool = True) -> None:
    """Store key[i], value[i] ([n, num_kv_heads, head_dim]) at slot slot_mapping[i], in place.

    check=False skips reading the slots back (`check_slots`): the caller checked them.
    """
    _check_caches(key_cache, value_cache)
    num_blocks, block_size, num_kv_heads, head_dim = key_cache.shape
    n = key.shape[0] if isinstance(key, torch.Tensor) and key.dim() else -1
    for name, t in (("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != (n, num_kv_heads, head_dim):
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name}: expected shape [n, {num_kv_heads}, {head_dim}] "
                             f"(n = key.shape[0]), got {shape}")
        if t.dtype != key_cache.dtype:
            raise ValueError(f"{name}: dtype {t.dtype} differs from the cache dtype "
                             f"{key_cache.dtype}")
        if t.device != key_cache.device:
            raise ValueError(f"{name}: is on {t.device} but the caches are on {key_cache.device}")
        if not t.is_contiguous():
            raise ValueError(f"{name}: must be contiguous")
    _check_index("slot_mapping", slot_mapping, 1, key_cache.device)
    if slot_mapping.shape[0] != n:
        raise ValueError(f"slot_mapping: has {slot_mapping.shape[0]} slots for {n} tokens")
    if n == 0:
        return
    if check:
        check_slots(slot_mapping, num_blocks * block_size)
    key_cache, value_cache, key, value = _as_words(key_cache, value_cache, key, value)
    row = key_cache[0, 0].numel()  # elements (words or values) per slot: all KV heads
    row_pad = triton.next_power_of_2(row)
    # Tokens per program: a GPU keeps a tile near 8192 elements; the interpreter takes more.
    tile = 8192 if key_cache.is_cuda else 1 << 16
    block_t = min(triton.next_power_of_2(n), max(1, tile // row_pad))
    programs = triton.cdiv(n, block_t)
    slots = torch.full((programs * block_t,), -1, dtype=torch.int64, device=key_cache.device)
    slots[:n] = slot_mapping  # [programs * BLOCK_T]
    with kernel_launch():
        _write_kv_kernel[(programs,)](
            key_cache, value_cache, key, value, slots, ROW=row, ROW_PAD=row_pad, BLOCK_T=block_t,
        )


def copy_blocks(key_cache: torch.Tensor, value_cache: torch.Tensor,
                src_dst: torch.Tensor) -> None:
    """Copy physical block src into dst (K and V) for each row (src, dst) of src_dst [m, 2]."""
    _check_caches(key_cache, value_cache)
    _check_index("src_dst", src_dst, 2, key_cache.device)
    if src_dst.shape[1] != 2:
        raise ValueError(f"src_dst: expected shape [m, 2], got {tuple(src_dst.shape)}")
    m = src_dst.shape[0]
    if m == 0:
        return
    num_blocks = key_cache.shape[0]
    if int(src_dst.min()) < 0 or int(src_dst.max()) >= num_blocks:
        raise ValueError(f"src_dst: block ids must lie in [0, {num_blocks})")
    dst = src_dst[:, 1]  # [m]
    if dst.unique().numel() != m:
        raise ValueError("src_dst: a destination block appears twice")
    if bool(torch.isin(src_dst[:, 0], dst[src_dst[:, 0] != dst]).any()):
        raise ValueError("src_dst: a block is both a source and another pair's destination")
    key_cache, value_cache = _as_words(key_cache, value_cache)
    block_numel = key_cache[0].numel()
    # A GPU copies a block in chunks of 4096 elements, a pair a program; the interpreter copies
    # whole blocks, as many pairs a program as fit in 2^18 elements.
    if key_cache.is_cuda:
        chunk, pairs = min(triton.next_power_of_2(block_numel), 4096), 1
    else:
        chunk = triton.next_power_of_2(block_numel)
        pairs = min(triton.next_power_of_2(m), max(1, (1 << 18) // chunk))
    with kernel_launch():
        _copy_blocks_kernel[(triton.cdiv(m, pairs), triton.cdiv(block_numel, chunk))](
            key_cache, value_cache, src_dst.contiguous(), m, block_numel, PAIRS=pairs, CHUNK=chunk,
        )
