"""The hybrid KV cache manager: several KV cache groups over one block pool (vLLM V1, 0.33).

It is what vLLM 0.33's KVCacheManager does over its HybridKVCacheCoordinator, with one
single-type manager per group (full attention, sliding window, chunked local):
- a request holds a block table per group; every group takes its blocks from the one pool;
- each time a request gets slots, every group first drops the positions its next token no
  longer attends to: they become the null block (-1) and their blocks are freed at once;
- a full block is cached per group, under (block hash, group), when it is allocated;
- a prefix hit must hold for every group: full attention finds its run first, the windowed
  group searches within that length, and the shorter result is the hit of all.

The scheduler sees only the methods below (find_prefix_hit, can_admit, allocate_slots, free,
block_tables), the same ones with one full-attention group as with several groups.
"""

from __future__ import annotations

from collections.abc import Sequence

from lab.memory.block_pool import BlockHash, BlockPool
from lab.memory.block_table import blocks_for
from lab.memory.cache_manager import GroupBlocks
from lab.memory.events import EventLog
from lab.memory.kv_cache_groups import NULL_BLOCK, CachedAt, FullAttention, GroupSpec, group_spec
from lab.memory.prefix_cache import HashFn, block_hash, chain, hash_block


def group_hash(h: BlockHash, group: int) -> BlockHash:
    """A full block's prefix-cache key in one group: (block hash, group id). The same token
    block therefore has one cached copy per group."""
    return BlockHash(f"{h.value}/{group}", h.parent, h.tokens)


class HybridKVCacheManager:
    def __init__(self, groups: Sequence[GroupSpec], num_blocks: int, block_size: int,
                 max_num_batched_tokens: int, max_model_len: int,
                 enable_prefix_cache: bool = True, hash_fn: HashFn = hash_block,
                 record_events: bool = True) -> None:
        groups = tuple(groups)
        if not groups or not all(isinstance(g, GroupSpec) for g in groups):
            raise ValueError(f"groups must be a non-empty list of KV cache groups, got {groups!r}")
        for name, value in (("block_size", block_size), ("max_model_len", max_model_len),
                            ("max_num_batched_tokens", max_num_batched_tokens)):
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.groups = groups
        self.num_groups = len(groups)
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_prefix_cache = enable_prefix_cache
        self.hash_fn = hash_fn
        self.events = EventLog(keep=record_events)
        self.blocks = BlockPool(num_blocks, self.events)
        self.admission_caps = tuple(g.admission_cap(block_size, max_num_batched_tokens,
                                                    max_model_len) for g in groups)
        # Attention types (groups with equal specs are searched together), full attention
        # first: its left-to-right run bounds what the other types need to search.
        types: dict[GroupSpec, list[int]] = {}
        for i, g in enumerate(groups):
            types.setdefault(g, []).append(i)
        self._types = sorted(types.items(), key=lambda t: not isinstance(t[0], FullAttention))
        self._tables: dict[int, list[list[int]]] = {}  # request -> a block table per group
        self._num_cached: dict[int, list[int]] = {}  # request -> positions cached, per group
        self._hashes: dict[int, list[BlockHash]] = {}  # request -> hash chain of its full blocks

    @classmethod
    def from_config(cls, config: dict, **kwargs) -> HybridKVCacheManager:
        """From a conformance trace's `config` (one full-attention group when it names none)."""
        groups = [group_spec(g) for g in config.get("kv_cache_groups", [{"kind": "full"}])]
        return cls(groups, config["num_blocks"], config["block_size"],
                   config["max_num_batched_tokens"], config["max_model_len"],
                   enable_prefix_cache=config.get("enable_prefix_caching", True), **kwargs)

    # -- queries ---------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return self.blocks.num_free

    def block_tables(self, req_id: int) -> GroupBlocks:
        """The request's block table in each group (empty lists when it holds no blocks)."""
        tables = self._tables.get(req_id)
        return tuple(list(t) for t in tables) if tables else self._empty()

    def requests(self) -> list[int]:
        """The requests holding blocks, in the order they were admitted."""
        return list(self._tables)

    def _empty(self) -> GroupBlocks:
        return tuple([] for _ in self.groups)

    # -- prefix hits -----------------------------------------------------------------------
    def _cached_at(self, hashes: list[BlockHash], group_ids: Sequence[int]) -> CachedAt:
        lookup = self.blocks.lookup

        def at(i: int) -> tuple[int, ...] | None:
            found = tuple(lookup(group_hash(hashes[i], g)) for g in group_ids)
            return None if None in found else found
        return at

    def _lookup_hashes(self, tokens: list[int]) -> tuple[int, list[BlockHash]]:
        """The longest hit allowed (the last token is always computed) and the hashes of the
        full blocks within it."""
        if not tokens:
            raise ValueError("a prefix lookup needs at least one token")
        max_length = len(tokens) - 1
        return max_length, list(chain(tokens, self.block_size, max_length // self.block_size,
                                      self.hash_fn))

    def find_prefix_hit(self, tokens: list[int]) -> tuple[int, GroupBlocks]:
        """The hit in tokens (whole blocks, at most len(tokens) - 1, the same for every group)
        and each group's hit blocks, null before a window. Changes nothing.

        Each attention type either accepts the current length or shortens it, and the search
        repeats until no type shortens it (with full attention and one other type, the second
        round only confirms the first)."""
        if not self.enable_prefix_cache:
            return 0, self._empty()
        max_length, hashes = self._lookup_hashes(tokens)
        bs = self.block_size
        found: list[list[int] | None] = [None] * self.num_groups
        hit_length = max_length
        while True:
            length = hit_length
            for spec, ids in self._types:
                if isinstance(spec, FullAttention) and found[ids[0]] is not None:
                    length = length // bs * bs  # a full run cut shorter is still a hit
                    continue
                hit = spec.longest_hit(self._cached_at(hashes, ids), length, bs)
                length = len(hit) * bs
                for k, g in enumerate(ids):
                    found[g] = [NULL_BLOCK if b is None else b[k] for b in hit]
            if length >= hit_length:
                break
            hit_length = length
        for g, spec in enumerate(self.groups):
            if isinstance(spec, FullAttention) and found[g] is not None:
                del found[g][hit_length // bs:]
        return hit_length, tuple(f if f is not None else [] for f in found)

    def group_hits(self, tokens: list[int]) -> tuple[int, ...]:
        """The hit each group would find on its own with the same limit (len(tokens) - 1):
        it shows which group limited the combined hit. Changes nothing."""
        if not self.enable_prefix_cache:
            return (0,) * self.num_groups
        max_length, hashes = self._lookup_hashes(tokens)
        return tuple(len(spec.longest_hit(self._cached_at(hashes, (g,)), max_length,
                                          self.block_size)) * self.block_size
                     for g, spec in enumerate(self.groups))

    # -- admission and growth --------------------------------------------------------------
    def _blocks_to_take(self, g: int, table: list[int] | None, num_tokens: int,
                        hit: list[int], num_computed: int, capped: bool = False) -> int:
        """Free blocks group g uses to give a request slots for num_tokens: new blocks, plus
        hit blocks that sit in the free queue (taking one out uses it up). `table` is None for
        a request being admitted; `capped` bounds a windowed group at its admission cap."""
        required = blocks_for(num_tokens, self.block_size)
        cap = self.admission_caps[g]
        if capped and cap is not None:
            required = min(required, cap)
        if table is not None:  # a running request: no new hit, its nulls are positions too
            return max(required - len(table), 0)
        skipped = self.groups[g].skipped_tokens(num_computed) // self.block_size
        refs = self.blocks.ref_counts
        idle_hits = sum(b != NULL_BLOCK and refs[b] == 0 for b in hit[skipped:])
        return max(required - max(skipped, len(hit)), 0) + idle_hits

    def blocks_to_admit(self, num_tokens: int, hit: GroupBlocks) -> int:
        """Free blocks the whole current sequence of a request being admitted counts
        (scheduler_reserve_full_isl): summed over groups, the blocks it needs minus its hit
        blocks plus the hit blocks in the free queue, a windowed group counting at most its
        admission cap (its old blocks are recycled as the window moves)."""
        hit_tokens = len(hit[0]) * self.block_size if hit else 0
        hit = self._check_hit(hit, hit_tokens)
        num_tokens = min(num_tokens, self.max_model_len)
        return sum(self._blocks_to_take(g, None, num_tokens, hit[g], hit_tokens, capped=True)
                   for g in range(self.num_groups))

    def can_admit(self, num_tokens: int, hit_tokens: int, hit: GroupBlocks,
                  reserve: int = 0) -> bool:
        """Whether the whole current sequence fits at admission, `reserve` blocks kept free
        besides (a watermark)."""
        self._check_hit(hit, hit_tokens)
        return self.blocks_to_admit(num_tokens, hit) + reserve <= self.num_free

    def _check_hit(self, hit: GroupBlocks | None, hit_tokens: int) -> GroupBlocks:
        if hit is None or not any(hit):
            hit = self._empty()
        if len(hit) != self.num_groups or any(len(h) * self.block_size != hit_tokens
                                              for h in hit if h or hit_tokens):
            raise ValueError(f"a hit of {hit_tokens} tokens holds {hit_tokens // self.block_size}"
                             f" positions in each of the {self.num_groups} groups, got {hit!r}")
        return hit

    def allocate_slots(self, req_id: int, tokens: list[int], num_computed: int,
                       num_new_tokens: int, hit: GroupBlocks | None = None, reserve: int = 0
                       ) -> GroupBlocks | None:
        """Slots for tokens [.., num_computed + num_new_tokens) of a request; `tokens` is its
        whole current token list. On admission num_computed is the hit and `hit` its blocks,
        which take a reference first (positions before a window stay null).

        Returns the blocks newly appended per group (block_tables gives the whole tables), or
        None when the pool cannot give them with `reserve` blocks left besides:
        then no block was taken, but out-of-window blocks were still freed, as vLLM frees them
        before it counts (the request no longer needs them either way). Full blocks up to
        num_computed + num_new_tokens are cached now, before the model runs, as vLLM does."""
        if type(num_new_tokens) is not int or num_new_tokens < 1:
            raise ValueError(f"num_new_tokens must be a positive int, got {num_new_tokens!r}")
        end = num_computed + num_new_tokens
        if type(num_computed) is not int or num_computed < 0 or end > len(tokens):
            raise ValueError(f"tokens [{num_computed}, {end}) are not in the request's "
                             f"{len(tokens)} tokens")
        tables = self._tables.get(req_id)
        if tables is None:
            hit = self._check_hit(hit, num_computed)
        elif hit is not None and any(hit):
            raise ValueError(f"request {req_id} is running: a prefix hit comes only at admission")
        else:
            self.free_out_of_window(req_id, num_computed)
        slots = min(end, self.max_model_len)
        needed = sum(self._blocks_to_take(g, None if tables is None else tables[g], slots,
                                          hit[g] if tables is None else [], num_computed)
                     for g in range(self.num_groups))
        if needed and needed + reserve > self.num_free:
            return None
        if tables is None:
            tables = [self._take_hit(req_id, g, hit[g], num_computed)
                      for g in range(self.num_groups)]
            self._tables[req_id] = tables
            self._num_cached[req_id] = [len(t) for t in tables]
        new = tuple(self._grow(req_id, table, slots) for table in tables)
        if self.enable_prefix_cache:
            self._cache_full_blocks(req_id, tokens, min(end, len(tokens)))
        return new

    def _take_hit(self, req_id: int, g: int, hit: list[int], num_computed: int) -> list[int]:
        """Group g's table on admission: null where its window has already passed, then the
        hit blocks, each taking a reference (a free one leaves the free queue)."""
        skipped = self.groups[g].skipped_tokens(num_computed) // self.block_size
        kept = hit[skipped:]
        for block_id in kept:
            if block_id != NULL_BLOCK:
                self.blocks.touch(block_id, req_id)
        return [NULL_BLOCK] * skipped + kept

    def _grow(self, req_id: int, table: list[int], num_tokens: int) -> list[int]:
        fresh = self.blocks.allocate(max(blocks_for(num_tokens, self.block_size) - len(table), 0),
                                     req_id)
        table += fresh
        return fresh

    def _cache_full_blocks(self, req_id: int, tokens: list[int], upto: int) -> None:
        """Cache, in every group, the request's full blocks below token `upto` not cached yet
        (no de-duplication; a null position has nothing to cache)."""
        full = upto // self.block_size
        cached = self._num_cached[req_id]
        if min(cached) >= full:
            return
        hashes = self._hashes.setdefault(req_id, [])
        parent = hashes[-1].value if hashes else None
        for i in range(len(hashes), full):
            hashes.append(block_hash(tokens, i, self.block_size, parent, self.hash_fn))
            parent = hashes[-1].value
        for g, table in enumerate(self._tables[req_id]):
            for i in range(cached[g], full):
                if table[i] != NULL_BLOCK:
                    self.blocks.cache(table[i], group_hash(hashes[i], g), req_id)
            cached[g] = max(cached[g], full)

    # -- release ---------------------------------------------------------------------------
    def free_out_of_window(self, req_id: int, num_computed: int) -> None:
        """Every group drops the leading positions the next token (token num_computed) does not
        attend to: each becomes the null block and its block is freed at once, the position
        nearest the window first. allocate_slots calls it before counting new blocks."""
        for g, table in enumerate(self._tables.get(req_id, ())):
            skipped = min(self.groups[g].skipped_tokens(num_computed) // self.block_size,
                          len(table))
            dropped = []
            for i in range(skipped - 1, -1, -1):
                if table[i] == NULL_BLOCK:  # every position before it was dropped already
                    break
                dropped.append(table[i])
                table[i] = NULL_BLOCK
            if dropped:
                self.blocks.free(dropped, req_id)

    def free(self, req_id: int) -> None:
        """Finish or preemption: every group's blocks are released, group by group in group
        order, each table's last position first; null positions hold nothing to release. A
        request holding no blocks is a no-op, as in vLLM."""
        for table in self._tables.pop(req_id, ()):
            self.blocks.free([b for b in reversed(table) if b != NULL_BLOCK], req_id)
        self._num_cached.pop(req_id, None)
        self._hashes.pop(req_id, None)

    # -- invariants ------------------------------------------------------------------------
    def check_invariants(self) -> None:
        self.blocks.check_invariants()
        holders = [0] * self.blocks.num_blocks
        for req_id, tables in self._tables.items():
            for table in tables:
                held = [b for b in table if b != NULL_BLOCK]
                assert len(set(held)) == len(held), f"request {req_id}: a block twice in a table"
                for b in held:
                    holders[b] += 1
        assert holders == self.blocks.ref_counts, "ref counts differ from block-table holders"
