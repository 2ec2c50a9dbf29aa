"""The paged-attention call's contract: the checks every input passes before a launch.

`check_paged_inputs` validates a call (shapes, dtypes, devices, block tables that stay inside
the cache) and raises a ValueError naming the bad argument; what it learned is an
`AttentionShapes`, enough to launch the kernel. The dense reference runs the same checks.

Reading lengths and block tables back from a GPU waits for it (a host sync). A caller that
already knows them on the host (the model's step: its scheduler built the tensors from Python
lists) hands them over as a `HostBatch`, and the checks read nothing from the device: a step
validates once, then launches every layer without a sync (and can be captured in a CUDA graph).

Which keys a query sees, as vLLM 0.33 computes them. Causal attention: the query at position p
sees the keys at positions [0, p]. A layer of one of two local kinds sees fewer:
- a sliding window W (gpt-oss, Gemma-3): (p - W, p], the last W positions, its own included.
  vLLM's attention backends pass FlashAttention the window (W - 1, 0), and its sliding-window
  KV cache manager drops the first c - W + 1 tokens once c are computed;
- chunked local attention with chunk C (Llama-4's attention_chunk_size): [p // C * C, p], the
  keys of its own chunk up to itself; vLLM drops every token before c // C * C.
The block-table entries of a sequence that hold no key its first new token (the one at
seq_len - q) can see are not used: vLLM puts its null block there (the traces write -1), and
neither the checks nor the kernels read them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.backend import backend

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
NO_LIMIT = 2**31 - 1  # a window or chunk no position reaches: every key since position 0


def first_visible_key(position: int | torch.Tensor, sliding_window: int = NO_LIMIT,
                      chunk: int = NO_LIMIT) -> int | torch.Tensor:
    """The first key position a query at `position` sees (an int, or an int64 tensor of them),
    for a sliding window or chunk (NO_LIMIT: none); it sees every key from there to its own."""
    in_window, in_chunk = position - sliding_window + 1, position // chunk * chunk
    if isinstance(position, torch.Tensor):
        return torch.maximum(in_window, in_chunk).clamp(min=0)
    return max(in_window, in_chunk, 0)


@dataclass(frozen=True)
class AttentionShapes:
    """What the checks learned about a paged-attention call; enough to launch it."""

    num_tokens: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_seqs: int
    block_size: int
    seq_lens: tuple[int, ...]  # context per sequence, its new tokens included
    query_lens: tuple[int, ...]  # new tokens per sequence
    scale: float
    sliding_window: int | None = None  # a query sees the last W positions (see above)
    attention_chunk_size: int | None = None  # a query sees its chunk up to itself

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens, default=0)

    @property
    def local(self) -> bool:
        """A sliding window or chunked local attention: some queries see fewer keys."""
        return self.sliding_window is not None or self.attention_chunk_size is not None

    @property
    def limits(self) -> tuple[int, int]:
        """(sliding window, chunk) with NO_LIMIT where there is none, as the kernels take them."""
        return self.sliding_window or NO_LIMIT, self.attention_chunk_size or NO_LIMIT

    def first_keys(self) -> tuple[int, ...]:
        """Per sequence, the first key position its first new token sees: the keys before it
        are not read (their block-table entries may be null)."""
        return tuple(first_visible_key(s - q, *self.limits)
                     for s, q in zip(self.seq_lens, self.query_lens))

    @property
    def visible_keys(self) -> int:
        """Keys the batch's new tokens see, over every sequence: the keys a kernel may read."""
        return sum(self.seq_lens) - sum(self.first_keys())


@dataclass(frozen=True)
class HostBatch:
    """What the caller knows on the host about the tensors it passes (it vouches that they
    hold these values): each sequence's context length and new tokens, and the smallest and
    largest physical block id the used block-table entries hold (no used entry: 0 and -1)."""

    seq_lens: tuple[int, ...]
    query_lens: tuple[int, ...]
    min_block: int = 0
    max_block: int = -1

    @classmethod
    def from_tables(cls, seq_lens: list[int], query_lens: list[int], block_size: int,
                    tables: list[list[int]], sliding_window: int | None = None,
                    attention_chunk_size: int | None = None) -> HostBatch:
        """From each sequence's block table (physical ids, at least its used entries: those
        from its first new token's first visible key on, see `first_visible_key`)."""
        limits = (sliding_window or NO_LIMIT, attention_chunk_size or NO_LIMIT)
        used = [b for table, n, q in zip(tables, seq_lens, query_lens)
                for b in table[first_visible_key(n - q, *limits) // block_size:
                               -(-n // block_size)]]
        return cls(tuple(seq_lens), tuple(query_lens), min(used, default=0),
                   max(used, default=-1))


def _fail(name: str, message: str) -> ValueError:
    return ValueError(f"{name}: {message}")


def _check_tensor(name: str, t: object, ndim: int, dtypes: tuple[torch.dtype, ...]) -> None:
    if not isinstance(t, torch.Tensor):
        raise _fail(name, f"expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise _fail(name, f"expected {ndim} dimensions, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise _fail(name, f"dtype must be one of {[str(d) for d in dtypes]}, got {t.dtype}")
    if t.numel() and t.stride(-1) != 1:
        raise _fail(name, "last dimension must be contiguous (stride 1)")


def _check_limit(name: str, value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or not 1 <= value < NO_LIMIT):
        raise _fail(name, f"must be None or a whole number of positions >= 1, got {value!r}")


def check_paged_inputs(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                       block_tables: torch.Tensor, seq_lens: torch.Tensor,
                       query_start_loc: torch.Tensor, scale: float | None = None,
                       host: HostBatch | None = None, sliding_window: int | None = None,
                       attention_chunk_size: int | None = None) -> AttentionShapes:
    """Validate a paged-attention call; raise ValueError naming the bad argument.

    host: the lengths and block ids, known to the caller, so that nothing is read back from
    the device; None reads them from seq_lens, query_start_loc and block_tables.
    sliding_window, attention_chunk_size: a local attention layer's limit (at most one; see
    the module's docstring); the entries before a sequence's first visible block are unused.
    """
    _check_limit("sliding_window", sliding_window)
    _check_limit("attention_chunk_size", attention_chunk_size)
    if sliding_window is not None and attention_chunk_size is not None:
        raise _fail("sliding_window", "a layer has a sliding window or a chunk, not both")
    _check_tensor("query", query, 3, FLOAT_DTYPES)
    for name, t in (("key_cache", key_cache), ("value_cache", value_cache)):
        _check_tensor(name, t, 4, FLOAT_DTYPES)
        if t.dtype != query.dtype:
            raise _fail(name, f"dtype {t.dtype} differs from query dtype {query.dtype}")
    _check_tensor("block_tables", block_tables, 2, (torch.int32,))
    _check_tensor("seq_lens", seq_lens, 1, (torch.int32,))
    _check_tensor("query_start_loc", query_start_loc, 1, (torch.int32,))
    named = {"key_cache": key_cache, "value_cache": value_cache, "block_tables": block_tables,
             "seq_lens": seq_lens, "query_start_loc": query_start_loc}
    for name, t in named.items():
        if t.device != query.device:
            raise _fail(name, f"is on {t.device} but query is on {query.device}")
    if backend().is_cuda and query.device.type != "cuda":
        raise _fail("query", f"the compiled Triton backend needs CUDA tensors, got {query.device}")

    num_tokens, num_heads, head_dim = query.shape
    num_blocks, block_size, num_kv_heads, cache_head_dim = key_cache.shape
    if value_cache.shape != key_cache.shape or value_cache.stride() != key_cache.stride():
        raise _fail("value_cache", f"shape/strides {tuple(value_cache.shape)}/"
                    f"{value_cache.stride()} differ from key_cache {tuple(key_cache.shape)}/"
                    f"{key_cache.stride()}")
    if min(num_blocks, block_size, num_kv_heads, cache_head_dim) < 1:
        raise _fail("key_cache", f"every dimension must be >= 1, got {tuple(key_cache.shape)}")
    if cache_head_dim != head_dim:
        raise _fail("key_cache", f"head_dim {cache_head_dim} differs from query's {head_dim}")
    if num_heads < 1 or num_heads % num_kv_heads:
        raise _fail("query", f"num_heads {num_heads} is not a multiple of num_kv_heads "
                    f"{num_kv_heads}")
    num_seqs = seq_lens.shape[0]
    if block_tables.shape[0] != num_seqs:
        raise _fail("block_tables", f"has {block_tables.shape[0]} rows for {num_seqs} sequences")
    if query_start_loc.shape[0] != num_seqs + 1:
        raise _fail("query_start_loc", f"needs {num_seqs + 1} entries, got "
                    f"{query_start_loc.shape[0]}")

    if host is None:
        starts = query_start_loc.tolist()
        query_lens = [b - a for a, b in zip(starts, starts[1:])]
        if starts[0] != 0 or starts[-1] != num_tokens or min(query_lens, default=0) < 0:
            raise _fail("query_start_loc", f"must rise from 0 to num_tokens={num_tokens}, got "
                        f"{starts}")
        lens = seq_lens.tolist()
    else:
        lens, query_lens = list(host.seq_lens), list(host.query_lens)
        if len(lens) != num_seqs or len(query_lens) != num_seqs:
            raise _fail("seq_lens", f"the host batch has {len(lens)} lengths and "
                        f"{len(query_lens)} query lengths for {num_seqs} sequences")
        if min(query_lens, default=0) < 0 or sum(query_lens) != num_tokens:
            raise _fail("query_start_loc", f"query lengths {query_lens} must be >= 0 and add "
                        f"up to num_tokens={num_tokens}")
    short = [i for i, (s, q) in enumerate(zip(lens, query_lens)) if s < q]
    if short:
        i = short[0]
        raise _fail("seq_lens", f"sequence {i} has seq_len {lens[i]} < its {query_lens[i]} "
                    "new tokens")
    if scale is None:
        scale = head_dim ** -0.5
    elif not isinstance(scale, (int, float)) or not (0 < abs(float(scale)) < float("inf")):
        raise _fail("scale", f"must be a finite non-zero number, got {scale!r}")
    shapes = AttentionShapes(num_tokens, num_heads, num_kv_heads, head_dim, num_seqs,
                             block_size, tuple(lens), tuple(query_lens), float(scale),
                             sliding_window, attention_chunk_size)
    blocks_needed = [-(-s // block_size) for s in lens]
    if max(blocks_needed, default=0) > block_tables.shape[1]:
        raise _fail("block_tables", f"width {block_tables.shape[1]} < {max(blocks_needed)} "
                    f"blocks needed for seq_len {max(lens)}")
    if host is not None:
        outside = host.max_block >= host.min_block and (
            host.min_block < 0 or host.max_block >= num_blocks)
    elif num_seqs and block_tables.shape[1]:
        entry = torch.arange(block_tables.shape[1], device=block_tables.device)[None, :]
        first = [k // block_size for k in shapes.first_keys()]  # first used entry, per row
        used = ((entry < torch.tensor(blocks_needed, device=block_tables.device)[:, None])
                & (entry >= torch.tensor(first, device=block_tables.device)[:, None]))
        outside = bool((used & ((block_tables < 0) | (block_tables >= num_blocks))).any())
    else:
        outside = False
    if outside:
        raise _fail("block_tables", f"a used entry is outside [0, {num_blocks})")
    return shapes
