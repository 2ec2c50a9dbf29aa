"""write_kv and copy_blocks: written slots read back exactly, nothing else changes."""

from __future__ import annotations

import pytest
import torch

from kernels.cache_ops import copy_blocks, write_kv
from tests.engine_helpers import DEVICE

SHAPE = (9, 16, 2, 80)  # [num_blocks, block_size, num_kv_heads, head_dim]


def random_caches(dtype: torch.dtype = torch.float32,
                  seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(SHAPE, generator=gen).to(DEVICE, dtype),
            torch.randn(SHAPE, generator=gen).to(DEVICE, dtype))


def by_slot(cache: torch.Tensor) -> torch.Tensor:
    """[num_blocks * block_size, num_kv_heads, head_dim]: slot s = block * block_size + offset."""
    return cache.reshape(-1, SHAPE[2], SHAPE[3])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_write_kv_round_trip(dtype: torch.dtype, index_dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    key_cache, value_cache = random_caches(dtype)
    before_k, before_v = key_cache.clone(), value_cache.clone()
    n = 70
    slots = torch.randperm(SHAPE[0] * SHAPE[1], generator=gen)[:n]  # scattered over blocks
    slots[[3, 40]] = -1  # skipped tokens
    slots = slots.to(DEVICE)
    key = torch.randn(n, *SHAPE[2:], generator=gen).to(DEVICE, dtype)
    value = torch.randn(n, *SHAPE[2:], generator=gen).to(DEVICE, dtype)
    write_kv(key_cache, value_cache, key, value, slots.to(index_dtype))

    written = slots >= 0
    assert torch.equal(by_slot(key_cache)[slots[written]], key[written])
    assert torch.equal(by_slot(value_cache)[slots[written]], value[written])
    untouched = torch.ones(SHAPE[0] * SHAPE[1], dtype=torch.bool, device=DEVICE)
    untouched[slots[written]] = False
    assert torch.equal(by_slot(key_cache)[untouched], by_slot(before_k)[untouched])
    assert torch.equal(by_slot(value_cache)[untouched], by_slot(before_v)[untouched])


def test_write_kv_of_nothing_changes_nothing() -> None:
    key_cache, value_cache = random_caches()
    before = key_cache.clone()
    empty = torch.empty(0, *SHAPE[2:], device=DEVICE)
    write_kv(key_cache, value_cache, empty, empty, torch.empty(0, dtype=torch.int64,
                                                               device=DEVICE))
    one = torch.ones(1, *SHAPE[2:], device=DEVICE)
    write_kv(key_cache, value_cache, one, one, torch.tensor([-1], device=DEVICE))
    assert torch.equal(key_cache, before)


def test_copy_blocks_copies_only_listed_blocks() -> None:
    key_cache, value_cache = random_caches(seed=2)
    before_k, before_v = key_cache.clone(), value_cache.clone()
    copy_blocks(key_cache, value_cache,
                torch.tensor([[1, 4], [2, 7], [5, 5]], dtype=torch.int32, device=DEVICE))
    assert torch.equal(key_cache[4], before_k[1]) and torch.equal(value_cache[4], before_v[1])
    assert torch.equal(key_cache[7], before_k[2]) and torch.equal(value_cache[7], before_v[2])
    others = [0, 1, 2, 3, 5, 6, 8]
    assert torch.equal(key_cache[others], before_k[others])
    assert torch.equal(value_cache[others], before_v[others])


def on_device(*values: float) -> torch.Tensor:
    return torch.tensor(values, device=DEVICE)


K, V = random_caches()
ROW = torch.randn(2, *SHAPE[2:], device=DEVICE)
WRITE_ERRORS = [
    ("slot_mapping", dict(slot_mapping=on_device(0, SHAPE[0] * SHAPE[1]))),
    ("slot_mapping", dict(slot_mapping=on_device(5, 5))),
    ("slot_mapping", dict(slot_mapping=on_device(0.0, 1.0))),
    ("slot_mapping", dict(slot_mapping=on_device(0, 1, 2))),
    ("key", dict(key=ROW[:, :1])),
    ("value", dict(value=ROW.half())),
    ("key_cache", dict(key_cache=K.transpose(0, 1))),
    ("key_cache", dict(key_cache=K.to(torch.int32))),
    ("value_cache", dict(value_cache=V[:4])),
]


@pytest.mark.parametrize(("name", "changes"), WRITE_ERRORS,
                         ids=[f"{n}-{i}" for i, (n, _) in enumerate(WRITE_ERRORS)])
def test_write_kv_rejects_bad_input(name: str, changes: dict[str, torch.Tensor]) -> None:
    args = {"key_cache": K.clone(), "value_cache": V.clone(), "key": ROW, "value": ROW,
            "slot_mapping": on_device(0, 1)} | changes
    with pytest.raises(ValueError, match=f"^{name}:"):
        write_kv(**args)


@pytest.mark.parametrize("src_dst", [
    on_device([0, 1, 2]),  # not [m, 2]
    on_device([0, SHAPE[0]]),  # out of range
    on_device([0, 3], [1, 3]),  # one destination twice
    on_device([0, 3], [3, 4]),  # 3 is a destination and a source
    on_device([0.0, 3.0]),
])
def test_copy_blocks_rejects_bad_pairs(src_dst: torch.Tensor) -> None:
    key_cache, value_cache = random_caches()
    before = key_cache.clone()
    with pytest.raises(ValueError, match="^src_dst:"):
        copy_blocks(key_cache, value_cache, src_dst)
    assert torch.equal(key_cache, before)


@pytest.mark.parametrize("head_dim", [6, 5])  # 24 bytes a head row: whole 8-byte words; 20: not
def test_write_moves_the_same_bytes_with_or_without_words(head_dim: int) -> None:
    """write_kv moves float32 rows as 8-byte words when they split into whole words; either
    way every value lands bit for bit, NaN payloads and -0.0 included."""
    shape = (4, 2, 3, head_dim)  # [num_blocks, block_size, num_kv_heads, head_dim]
    key_cache, value_cache = torch.zeros(shape, device=DEVICE), torch.zeros(shape, device=DEVICE)
    key = torch.randn(3, 3, head_dim, device=DEVICE)
    key[0, 0, 0], key[1, 1, 1] = float("nan"), -0.0
    value = 2 * key
    write_kv(key_cache, value_cache, key, value, on_device(5, 0, 2))
    for cache, written in ((key_cache, key), (value_cache, value)):
        flat = cache.view(-1, 3, head_dim)  # [slots, KV, D]
        assert torch.equal(flat[[5, 0, 2]].view(torch.int32), written.view(torch.int32))
        assert flat[[1, 3, 4, 6, 7]].abs().sum() == 0  # no other slot touched


# Blocks of 5-float head rows move as floats; 64 x 8 x 128 blocks move as 8-byte words, 8
# pairs a program on the interpreter, so 40 pairs take 5 programs.
@pytest.mark.parametrize("shape", [(100, 4, 2, 5), (100, 64, 8, 128)], ids=["floats", "words"])
def test_copy_blocks_many_pairs(shape: tuple[int, int, int, int]) -> None:
    """Every destination gets its source's bytes; nothing else moves."""
    gen = torch.Generator().manual_seed(5)
    key_cache = torch.randn(shape, generator=gen).to(DEVICE)
    value_cache = torch.randn(shape, generator=gen).to(DEVICE)
    before_k, before_v = key_cache.clone(), value_cache.clone()
    order = torch.randperm(shape[0], generator=gen).to(DEVICE)
    src, dst, untouched = order[:40], order[40:80], order[80:]
    copy_blocks(key_cache, value_cache, torch.stack([src, dst], 1))
    assert torch.equal(key_cache[dst], before_k[src])
    assert torch.equal(value_cache[dst], before_v[src])
    assert torch.equal(key_cache[src], before_k[src])
    assert torch.equal(value_cache[src], before_v[src])
    assert torch.equal(key_cache[untouched], before_k[untouched])
