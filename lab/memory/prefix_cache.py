"""Prefix caching: full blocks are named by a hash chained over every earlier token.

Two requests share a physical block only if the block's tokens AND everything before them are
identical, which is what the chain guarantees. The last prompt token is never taken from the
cache: its query must be computed to produce the first output token, so at most
(len(prompt) - 1) // block_size leading blocks can hit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from lab.memory.block_pool import BlockHash, BlockPool

HashFn = Callable[[str | None, tuple[int, ...]], str]


def hash_block(parent: str | None, tokens: tuple[int, ...]) -> str:
    """A stable 16-digit hex name for (parent hash, token ids): Python's tuple hash, which for
    ints is the same in every process (unlike str hashes, so the parent goes in as an int).
    Collisions are caught by comparing tokens (`BlockPool.lookup`), never served."""
    return "%016x" % (hash((int(parent, 16) if parent else -1, tokens)) & 0xFFFF_FFFF_FFFF_FFFF)


def block_hash(tokens: Sequence[int], index: int, block_size: int, parent: str | None,
               hash_fn: HashFn = hash_block) -> BlockHash:
    """The BlockHash of full block `index` of tokens; `parent` is block index - 1's hash."""
    block = tuple(tokens[index * block_size:(index + 1) * block_size])
    assert len(block) == block_size, "only full blocks are hashed"
    return BlockHash(hash_fn(parent, block), parent, block)


def chain(tokens: Sequence[int], block_size: int, num_blocks: int,
          hash_fn: HashFn = hash_block) -> Iterator[BlockHash]:
    """BlockHash of each of the first num_blocks full blocks of tokens, lazily (a lookup
    stops at the first miss)."""
    parent = None
    for i in range(num_blocks):
        h = block_hash(tokens, i, block_size, parent, hash_fn)
        yield h
        parent = h.value


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
