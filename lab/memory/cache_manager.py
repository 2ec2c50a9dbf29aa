"""The KV-cache manager: sequences and their block tables over a real block pool and KV pool.

It follows the guide: blocks are allocated as tokens arrive, fork shares every block,
a write into a shared partial block copies that one block first (copy-on-write), and full
blocks are named by a hash chain so later requests can reuse them (prefix caching).
Each mutator checks that it can succeed before it changes anything.
"""

from __future__ import annotations

import itertools

import torch

from lab.memory.block_pool import BlockPool, KVCacheError, PoolExhausted
from lab.memory.block_table import Sequence, blocks_for
from lab.memory.events import EventLog
from lab.memory.kv_pool import KVPool, PoolConfig
from lab.memory.prefix_cache import HashFn, block_hash, hash_block, longest_hit
from lab.memory.snapshot import Snapshot, take_snapshot


class UnknownSequence(KVCacheError, KeyError):
    __str__ = Exception.__str__  # the message as it is, not KeyError's repr of it


class LiveSequences(dict[int, Sequence]):
    """Sequence id -> live sequence; a missing id is a typed error, at dict speed otherwise."""

    def __missing__(self, seq_id: int) -> Sequence:
        raise UnknownSequence(f"no live sequence with id {seq_id}")


class KVCacheManager:
    def __init__(self, config: PoolConfig, device: torch.device | None = None,
                 enable_prefix_cache: bool = True, hash_fn: HashFn = hash_block,
                 store_kv: bool = True, record_events: bool = True) -> None:
        self.config = config
        self.block_size = config.block_size
        self.events = EventLog(keep=record_events)
        self.blocks = BlockPool(config.num_blocks, self.events)
        # store_kv=False: allocator-only mode for large replays, with no tensors at all.
        self.pool = KVPool(config, device) if store_kv else None
        self.enable_prefix_cache = enable_prefix_cache
        self.hash_fn = hash_fn
        self.sequences = LiveSequences()
        self._ids = itertools.count()
        self.prefix_query_tokens = 0  # prompt tokens looked up in the prefix cache
        self.prefix_hit_tokens = 0  # of those, tokens whose K/V was found

    # -- admission -------------------------------------------------------------------------
    def _prefix_hits(self, prompt: list[int]) -> list[int]:
        if not self.enable_prefix_cache:
            return []
        return longest_hit(self.blocks, prompt, self.block_size, self.hash_fn)

    def prefix_hits(self, tokens: list[int]) -> list[int]:
        """The cached blocks matching the leading full blocks of tokens (never the last token)."""
        return self._prefix_hits(tokens)

    def blocks_needed(self, prompt: list[int]) -> int:
        return self.blocks_to_admit(len(prompt), self._prefix_hits(prompt))

    def can_allocate(self, num_tokens: int) -> bool:
        return self.blocks.can_allocate(blocks_for(num_tokens, self.block_size))

    def add_sequence(self, prompt: list[int]) -> Sequence:
        """Admit a prompt: reuse cached leading blocks, allocate the rest."""
        return self.admit(prompt, len(prompt), self._prefix_hits(prompt))

    def admit(self, tokens: list[int], end: int, hits: list[int]) -> Sequence:
        """A new sequence holding tokens[:end]: the hit blocks (a prefix-cache hit on `tokens`)
        take a reference first, then blocks from the free queue for the rest of the span.
        A chunked prefill admits only its first chunk's span; the lookup saw all `tokens`."""
        if not tokens or set(map(type, tokens)) != {int} or min(tokens) < 0:
            raise ValueError("prompt must be a non-empty list of non-negative token ids")
        needed = self.blocks_to_admit(end, hits)
        if needed > self.blocks.num_free:
            raise PoolExhausted(needed, self.blocks.num_free)
        seq = Sequence(next(self._ids), self.block_size, tokens=list(tokens[:end]))
        for block_id in hits:
            self.blocks.touch(block_id, seq.seq_id)
        fresh = self.blocks.allocate(blocks_for(end, self.block_size) - len(hits), seq.seq_id)
        seq.block_table = hits + fresh
        seq.num_cached_tokens = seq.num_written = len(hits) * self.block_size
        seq.block_hashes = [self.blocks.block_hash[b].value for b in hits]
        if self.enable_prefix_cache:
            self.prefix_query_tokens += len(tokens)
            self.prefix_hit_tokens += seq.num_cached_tokens
        self.sequences[seq.seq_id] = seq
        return seq

    def blocks_to_admit(self, num_tokens: int, hits: list[int]) -> int:
        """Free blocks that holding num_tokens with these hit blocks takes: the blocks past the
        hits, plus the hits sitting in the free queue (taking them out uses free blocks)."""
        if not hits:  # most admissions (and every one without a prefix cache)
            return blocks_for(num_tokens, self.block_size)
        idle_hits = sum(self.blocks.ref_counts[b] == 0 for b in hits)
        return blocks_for(num_tokens, self.block_size) - len(hits) + idle_hits

    # -- growth ----------------------------------------------------------------------------
    def append_token(self, seq_id: int, token: int) -> int:
        """Add one token; return the slot its K/V goes to. A block is allocated only when the
        last one is full; a shared, partially filled last block is copied first."""
        seq = self.sequences[seq_id]
        tokens, table = seq.tokens, seq.block_table
        offset = len(tokens) % self.block_size
        # Room in an unshared last block (every token but one per block) needs no pool call.
        if offset == 0 or self.blocks.ref_counts[table[-1]] > 1:
            self._make_room(seq, len(tokens) + 1)
        tokens.append(token)
        slot = table[-1] * self.block_size + offset
        if self.events.keep:
            self.events.emit("append", seq_id, table[-1], pos=len(tokens) - 1, slot=slot)
        return slot

    def extend(self, seq_id: int, tokens: list[int]) -> None:
        """Add tokens (decode steps, or a chunk of prompt); `Sequence.slots` gives their slots.
        All blocks needed are checked first, so on PoolExhausted nothing has changed."""
        seq = self.sequences[seq_id]
        pos = len(seq.tokens)
        self._make_room(seq, pos + len(tokens))
        seq.tokens += tokens
        if self.events.keep:
            for p, slot in enumerate(seq.slots(pos, len(seq.tokens)), start=pos):
                self.events.emit("append", seq_id, slot // self.block_size, pos=p, slot=slot)

    def _make_room(self, seq: Sequence, end: int) -> None:
        """Blocks for positions [.., end), copying a shared partial last block first: both
        checked before either happens."""
        bs, table = self.block_size, seq.block_table
        new_blocks = blocks_for(end, bs) - len(table)
        cow = len(seq.tokens) % bs != 0 and self.blocks.ref_counts[table[-1]] > 1
        if new_blocks <= 0 and not cow:  # the common case: room in an unshared last block
            return
        new_blocks = max(new_blocks, 0)
        if cow:
            if 1 + new_blocks > self.blocks.num_free:
                raise PoolExhausted(1 + new_blocks, self.blocks.num_free)
            self._copy_on_write(seq)
        table += self.blocks.allocate(new_blocks, seq.seq_id)  # raises before any change

    def _copy_on_write(self, seq: Sequence) -> None:
        shared = seq.block_table[-1]
        (fresh,) = self.blocks.allocate(1, seq.seq_id)
        if self.pool is not None:
            self.pool.copy_block(shared, fresh)
        self.blocks.free([shared], seq.seq_id)  # ref count > 1, so it stays live
        seq.block_table[-1] = fresh
        self.events.emit("copy", seq.seq_id, fresh, src=shared, dst=fresh)

    def write(self, seq_id: int, start: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store K/V for positions [start, start + n) of a sequence, every layer.

        keys, values: [num_layers, n, num_kv_heads, head_dim]. Writes continue where the
        sequence's K/V ends. Blocks that become full are registered in the prefix cache.
        """
        seq = self.sequences[seq_id]
        n = keys.shape[1] if keys.dim() == 4 else -1
        self._check_continues(seq, start, n)
        self._store([(seq, start + n)], keys, values)

    def write_batch(self, seq_ids: list[int], keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store the K/V of every listed sequence's unwritten positions in one launch.

        keys, values: [num_layers, n, num_kv_heads, head_dim], the sequences' new tokens laid
        end to end in the order of seq_ids.
        """
        seqs = [self.sequences[i] for i in seq_ids]
        n = sum(len(s) - s.num_written for s in seqs)
        if keys.dim() != 4 or keys.shape[1] != n:
            raise ValueError(f"keys must hold the {n} unwritten positions of sequences "
                             f"{seq_ids}, got shape {tuple(keys.shape)}")
        self._store([(s, len(s)) for s in seqs], keys, values)

    def _store(self, spans: list[tuple[Sequence, int]], keys: torch.Tensor,
               values: torch.Tensor) -> None:
        """Write positions [num_written, end) of each (sequence, end), then commit them."""
        if self.pool is None:
            raise KVCacheError("this manager stores no K/V (store_kv=False): use commit()")
        slots = [slot for seq, end in spans for slot in seq.slots(seq.num_written, end)]
        self.pool.write(slots, keys, values)
        for seq, end in spans:
            self.commit(seq.seq_id, end)

    def commit(self, seq_id: int, upto: int) -> None:
        """Mark K/V of positions [.., upto) as present; newly full blocks join the prefix
        cache. write() calls it; allocator-only replays call it directly."""
        seq = self.sequences[seq_id]
        if not seq.num_written <= upto <= len(seq.tokens):
            self._check_continues(seq, seq.num_written, upto - seq.num_written)  # raises
        seq.num_written = upto
        self.cache_blocks(seq_id, upto)

    def cache_blocks(self, seq_id: int, upto: int) -> None:
        """Register the full blocks of positions [.., upto) not named yet in the prefix cache.
        vLLM V1 does it when it allocates a step's blocks, before the model writes their K/V,
        so a request admitted in the same step can already hit them."""
        seq = self.sequences[seq_id]
        if upto // self.block_size > len(seq.block_hashes) and self.enable_prefix_cache:
            self._register_full_blocks(seq, upto)

    @staticmethod
    def _check_continues(seq: Sequence, start: int, n: int) -> None:
        if start != seq.num_written or n < 0 or start + n > len(seq):
            raise ValueError(f"write of positions [{start}, {start + n}) does not continue "
                             f"sequence {seq.seq_id}: {seq.num_written} written of {len(seq)}")

    def _register_full_blocks(self, seq: Sequence, upto: int) -> None:
        """Cache every full block before `upto` past the ones already named (no
        de-duplication: a block whose content another block holds is cached too, as vLLM
        does)."""
        hashes = seq.block_hashes
        parent = hashes[-1] if hashes else None
        for i in range(len(hashes), upto // self.block_size):
            h = block_hash(seq.tokens, i, self.block_size, parent, self.hash_fn)
            self.blocks.cache(seq.block_table[i], h, seq.seq_id)
            hashes.append(parent := h.value)

    def fork(self, seq_id: int) -> Sequence:
        """A new branch sharing every block of its parent (ref count + 1, nothing copied)."""
        parent = self.sequences[seq_id]
        if parent.num_written != len(parent):
            raise KVCacheError(f"cannot fork sequence {seq_id}: K/V of "
                               f"{len(parent) - parent.num_written} token(s) not written yet")
        child = Sequence(next(self._ids), self.block_size, list(parent.tokens),
                         list(parent.block_table), parent.num_written, parent.num_cached_tokens,
                         list(parent.block_hashes), parent_id=seq_id)
        for block_id in child.block_table:
            self.blocks.share(block_id, child.seq_id)
        self.sequences[child.seq_id] = child
        return child

    def free(self, seq_id: int) -> None:
        """Release a finished (or preempted) sequence, tail block first as vLLM does: its
        partial block goes to the front of the free queue, its cached blocks to the back with
        the tail nearest the front, so a prefix outlives the blocks that continue it."""
        seq = self.sequences[seq_id]
        self.blocks.free(seq.block_table[::-1], seq_id)
        del self.sequences[seq_id]

    # -- reading ---------------------------------------------------------------------------
    def block_table_tensor(self, seq_ids: list[int]) -> torch.Tensor:
        """Block tables padded with 0: int32 [num_seqs, max_blocks]."""
        tables = [self.sequences[i].block_table for i in seq_ids]
        width = max((len(t) for t in tables), default=0)
        rows = [t + [0] * (width - len(t)) for t in tables]
        device = self.pool.device if self.pool is not None else None
        return torch.tensor(rows, dtype=torch.int32, device=device).reshape(-1, width)

    def read_kv(self, seq_id: int, layer: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        seq = self.sequences[seq_id]
        if self.pool is None:
            raise KVCacheError("this manager stores no K/V (store_kv=False)")
        return self.pool.gather(seq.block_table, seq.num_written, layer)

    def snapshot(self) -> Snapshot:
        return take_snapshot(self.blocks, self.sequences.values(), self.block_size)

    # -- invariants ------------------------------------------------------------------------
    def check_invariants(self) -> None:
        self.blocks.check_invariants()
        holders = [0] * self.config.num_blocks
        for seq in self.sequences.values():
            assert seq.num_blocks == blocks_for(len(seq), self.block_size), seq
            assert len(set(seq.block_table)) == seq.num_blocks, "a block twice in one table"
            assert seq.num_written <= len(seq)
            for block_id in seq.block_table:
                holders[block_id] += 1
        assert holders == self.blocks.ref_counts, "ref counts differ from block-table holders"


GroupBlocks = tuple[list[int], ...]  # one list of block ids per KV cache group; -1: null block


class SingleGroupCache:
    """vLLM V1's KV cache manager as its scheduler sees it (`get_computed_blocks`,
    `allocate_slots`, `free` in vllm/v1/core/kv_cache_manager.py), for one full-attention KV
    cache group over a KVCacheManager. Requests are named by their id; a manager of several
    groups answers the same calls with one block list per group."""

    num_groups = 1

    def __init__(self, manager: KVCacheManager) -> None:
        self.manager = manager
        self.block_size = manager.block_size
        self.seq_of: dict[int, int] = {}  # request id -> the manager's sequence

    @property
    def num_free(self) -> int:
        return self.manager.blocks.num_free

    def find_prefix_hit(self, tokens: list[int]) -> tuple[int, GroupBlocks]:
        """The hit on tokens: whole cached blocks, at most len(tokens) - 1 tokens (0 with
        prefix caching off), and the hit blocks. Changes nothing."""
        hits = self.manager.prefix_hits(tokens)
        return len(hits) * self.block_size, (hits,)

    def blocks_to_admit(self, num_tokens: int, hit: GroupBlocks) -> int:
        return self.manager.blocks_to_admit(num_tokens, hit[0])

    def can_admit(self, num_tokens: int, hit_tokens: int, hit: GroupBlocks,
                  reserve: int = 0) -> bool:
        """The whole current sequence fits (scheduler_reserve_full_isl), `reserve` blocks kept
        free besides (a watermark)."""
        return self.blocks_to_admit(num_tokens, hit) + reserve <= self.num_free

    def allocate_slots(self, req_id: int, tokens: list[int], num_computed: int,
                       num_new_tokens: int, hit: GroupBlocks | None = None,
                       reserve: int = 0) -> GroupBlocks | None:
        """Blocks for tokens [.., num_computed + num_new_tokens): on a request's admission its
        hit blocks first. The blocks newly appended (on admission: the whole table), or None
        when the pool cannot give them with `reserve` blocks left (then nothing changed).
        Full blocks up to the end are hashed now, before the model runs."""
        m, end = self.manager, num_computed + num_new_tokens
        seq_id = self.seq_of.get(req_id)
        if seq_id is None:
            hits = hit[0] if hit else []
            if m.blocks_to_admit(end, hits) + reserve > m.blocks.num_free:
                return None
            seq = m.admit(tokens, end, list(hits))
            self.seq_of[req_id] = seq.seq_id
            new = list(seq.block_table)
        else:
            seq = m.sequences[seq_id]
            held = len(seq.block_table)
            need = blocks_for(end, self.block_size) - held
            if need > 0 and need + reserve > m.blocks.num_free:
                return None
            if end > len(seq.tokens):
                if m.events.keep:  # each token's slot as an event, for the pages
                    m.extend(seq_id, tokens[len(seq.tokens):end])
                else:  # a replay's hot path: no copy-on-write here (V1 forks nothing)
                    if need > 0:
                        seq.block_table += m.blocks.allocate(need, seq_id)
                    seq.tokens += tokens[len(seq.tokens):end]
            new = seq.block_table[held:]
        if m.enable_prefix_cache:
            m.cache_blocks(seq.seq_id, end)
        return (new,)

    def free(self, req_id: int) -> None:
        """Finish or preemption: its blocks released, last block first."""
        self.manager.free(self.seq_of.pop(req_id))

    def block_tables(self, req_id: int) -> GroupBlocks:
        return (list(self.manager.sequences[self.seq_of[req_id]].block_table),)

    def requests(self) -> list[int]:
        """The requests holding blocks, in the order they were admitted."""
        return list(self.seq_of)
