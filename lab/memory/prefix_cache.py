"""Prefix caching: full blocks are named by a hash chained over every earlier token.

Two requests share a physical block only if the block's tokens AND everything before them are
identical, which is what the chain guarantees. The last prompt token is never taken from the
cache: its query must be computed to produce the first output token, so at most
(len(prompt) - 1) // block_size leading blocks can hit.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

from lab.memory.block_pool import BlockHash, BlockPool

HashFn = Callable[[str | None, tuple[int, ...]], str]


def hash_block(parent: str | None, tokens: tuple[int, ...]) -> str:
    """A short, stable hex name for (parent hash, token ids)."""
    data = (parent or "root").encode() + b"|" + ",".join(map(str, tokens)).encode()
    return hashlib.sha256(data).hexdigest()[:16]


def chain(tokens: Sequence[int], block_size: int, num_blocks: int,
          hash_fn: HashFn = hash_block, parent: str | None = None) -> list[BlockHash]:
    """BlockHash of each of the first num_blocks full blocks of tokens."""
    hashes = []
    for i in range(num_blocks):
        block = tuple(tokens[i * block_size:(i + 1) * block_size])
        assert len(block) == block_size, "only full blocks are hashed"
        h = BlockHash(hash_fn(parent, block), parent, block)
        hashes.append(h)
        parent = h.value
    return hashes


def longest_hit(blocks: BlockPool, prompt: Sequence[int], block_size: int,
                hash_fn: HashFn = hash_block) -> list[int]:
    """Physical ids of the cached blocks matching the prompt's leading full blocks."""
    hits = []
    for h in chain(prompt, block_size, (len(prompt) - 1) // block_size, hash_fn):
        block_id = blocks.lookup(h)
        if block_id is None:
            break
        hits.append(block_id)
    return hits
