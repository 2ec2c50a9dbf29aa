"""KV cache groups: the rules of each attention type that shares one block pool (vLLM V1, 0.33).

A model that mixes attention types gives each type its own KV cache group. Every request holds
one block table per group, all drawn from the same pool. The groups differ in three rules:
- which leading tokens the next token no longer attends to (their positions hold the null
  block, and the real block goes back to the pool);
- how a prefix hit is searched for in the cached blocks;
- how many blocks a request can hold at once, which caps what admission reserves for it.

Full attention attends to every earlier token; a sliding window of W tokens to the last W
(itself included); chunked local attention with chunk C to the tokens of its own chunk.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lab.memory.block_table import blocks_for

NULL_BLOCK = -1  # a table position whose tokens are out of the window: no block held

# Block index -> the cached block of each group of one attention type, or None on a miss.
CachedAt = Callable[[int], tuple[int, ...] | None]
# One hit per attention type: a position is a tuple with a block per group, or None (null).
TypeHit = list[tuple[int, ...] | None]


def _check_tokens(what: str, value: object) -> None:
    if type(value) is not int or value < 1:
        raise ValueError(f"{what} is a positive number of tokens, got {value!r}")


@dataclass(frozen=True)
class FullAttention:
    kind = "full"

    def skipped_tokens(self, num_computed: int) -> int:
        """Leading tokens out of the window of the next token to compute (token num_computed)."""
        return 0

    def admission_cap(self, block_size: int, max_num_batched_tokens: int,
                      max_model_len: int) -> int | None:
        """The most blocks one request holds at once, or None when it keeps every block."""
        return None

    def longest_hit(self, cached_at: CachedAt, max_length: int, block_size: int) -> TypeHit:
        """The leading cached blocks, left to right, stopping at the first miss (the hash chain
        guarantees nothing after a miss can be cached)."""
        hit: TypeHit = []
        for i in range(max_length // block_size):
            blocks = cached_at(i)
            if blocks is None:
                break
            hit.append(blocks)
        return hit


@dataclass(frozen=True)
class SlidingWindow:
    window: int
    kind = "sliding_window"

    def __post_init__(self) -> None:
        _check_tokens("a sliding window", self.window)

    def skipped_tokens(self, num_computed: int) -> int:
        # The window of token c is [c - W + 1, c]: everything before it is skipped.
        return max(0, num_computed - self.window + 1)

    def admission_cap(self, block_size: int, max_num_batched_tokens: int,
                      max_model_len: int) -> int | None:
        # The W - 1 tokens before the next one plus a step's tokens in flight; one more block
        # because the window rarely starts on a block boundary.
        return blocks_for(min(self.window - 1 + max_num_batched_tokens, max_model_len),
                          block_size) + 1

    def longest_hit(self, cached_at: CachedAt, max_length: int, block_size: int) -> TypeHit:
        """Right to left: the last block boundary (at most max_length) that ends a run of cached
        blocks covering the window before it; the positions before the run are null. Without
        such a run, a shorter run that starts at position 0 is still a hit."""
        needed = blocks_for(self.window - 1, block_size)  # the token itself is not cached
        num_blocks = max_length // block_size
        hit: TypeHit = [None] * num_blocks
        run = 0
        for i in range(num_blocks - 1, -1, -1):
            blocks = cached_at(i)
            if blocks is None:
                run = 0
                continue
            hit[i] = blocks
            run += 1
            if run >= needed:
                return hit[:i + run]
        return hit[:run]


@dataclass(frozen=True)
class ChunkedLocal:
    chunk: int
    kind = "chunked_local"

    def __post_init__(self) -> None:
        _check_tokens("an attention chunk", self.chunk)

    def skipped_tokens(self, num_computed: int) -> int:
        # Token c attends only within its chunk, which starts at c // C * C.
        return num_computed // self.chunk * self.chunk

    def admission_cap(self, block_size: int, max_num_batched_tokens: int,
                      max_model_len: int) -> int | None:
        return blocks_for(min(self.chunk + max_num_batched_tokens, max_model_len), block_size)

    def longest_hit(self, cached_at: CachedAt, max_length: int, block_size: int) -> TypeHit:
        """Every block before the last chunk start at or below max_length counts as computed
        (null); from there, cached blocks left to right up to max_length."""
        start = max_length // self.chunk * self.chunk // block_size
        hit: TypeHit = [None] * start
        for i in range(start, max_length // block_size):
            blocks = cached_at(i)
            if blocks is None:
                break
            hit.append(blocks)
        return hit


GroupSpec = FullAttention | SlidingWindow | ChunkedLocal


def group_spec(entry: dict) -> GroupSpec:
    """A group from its description in a trace's config.kv_cache_groups, e.g.
    {"kind": "sliding_window", "window": 128}; a clear error for anything else."""
    if not isinstance(entry, dict):
        raise ValueError(f"a KV cache group is described by a dict, got {entry!r}")
    kind = entry.get("kind")
    if kind == "full":
        return FullAttention()
    if kind == "sliding_window":
        return SlidingWindow(entry.get("window"))
    if kind == "chunked_local":
        return ChunkedLocal(entry.get("chunk"))
    raise ValueError(f"unknown KV cache group kind {kind!r}: expected 'full', "
                     f"'sliding_window' or 'chunked_local'")
