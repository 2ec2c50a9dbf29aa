"""Small builders shared by the engine tests, and a recorder of host syncs."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kernels.backend import device
from lab.memory.cache_manager import KVCacheManager
from lab.memory.kv_pool import PoolConfig
from lab.serving.synthetic_kv import SyntheticKV

DEVICE = device()  # the backend's: tests build their tensors where the kernels run
aten = torch.ops.aten


def make_manager(num_blocks: int = 16, block_size: int = 4, num_layers: int = 1,
                 prefix: bool = True, **kw) -> KVCacheManager:
    config = PoolConfig(num_blocks=num_blocks, block_size=block_size, num_layers=num_layers,
                        num_kv_heads=2, head_dim=8, **kw)
    return KVCacheManager(config, DEVICE, enable_prefix_cache=prefix)


def prefill(m: KVCacheManager, kv: SyntheticKV, prompt: list[int]) -> int:
    """Admit a prompt and write K/V for its uncached positions; return the sequence id."""
    seq = m.add_sequence(prompt)
    start = seq.num_cached_tokens
    k, v = kv.keys_values(prompt[start:], start)
    m.write(seq.seq_id, start, k, v)
    return seq.seq_id


def decode(m: KVCacheManager, kv: SyntheticKV, seq_id: int, token: int) -> int:
    slot = m.append_token(seq_id, token)
    pos = len(m.sequences[seq_id]) - 1
    k, v = kv.keys_values([token], pos)
    m.write(seq_id, pos, k, v)
    return slot


class HostSyncs(TorchDispatchMode):
    """Records, on any device, the calls that would make the host wait for a GPU: `reads` of a
    value back (item, bool, int, tolist, cpu, numpy) and ops whose output size depends on the
    data (boolean masks, nonzero, unique, repeat_interleave without output_size); `uploads`
    of host data (torch.tensor of a list: a copy no CUDA graph can capture).

        with HostSyncs() as syncs:
            ...
        assert syncs.reads == []
    """

    READS = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default,
             aten._unique2.default, aten.unique_dim.default, aten.unique_consecutive.default}
    METHODS = ("tolist", "cpu", "numpy")  # a CPU tensor answers these without an op

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []
        self.uploads: list[str] = []
        self._saved: dict[str, object] = {}  # torch.Tensor's own attributes (None: inherited)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        masked = func is aten.index.Tensor and any(
            i is not None and i.dtype == torch.bool for i in args[1])
        sized = func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None
        if func in self.READS or masked or sized:
            self.reads.append(str(func))
        elif func is aten.lift_fresh.default:
            self.uploads.append(str(func))
        return func(*args, **kwargs)

    def __enter__(self) -> HostSyncs:
        for name in self.METHODS:
            self._saved[name] = vars(torch.Tensor).get(name)
            method = getattr(torch.Tensor, name)

            def recorded(t: torch.Tensor, *a, _method=method, _name=name, **kw):
                self.reads.append(f"Tensor.{_name}")
                return _method(t, *a, **kw)
            setattr(torch.Tensor, name, recorded)
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        for name, method in self._saved.items():
            if method is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, method)
        super().__exit__(*exc)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Exactly equal, wherever each lives (pool reads are on the backend's device, the seeded
    K/V they are compared with on the CPU)."""
    return torch.equal(a.cpu(), b.cpu())
