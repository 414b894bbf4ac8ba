"""The paged KV cache's bookkeeping: one pool of fixed-size blocks, shared between requests by prefix hash.

Full blocks are keyed by a chained hash (the previous block's hash, this block's tokens, the request's cache
salt), so a block's key covers every token before it. Blocks are refcounted; a block whose last user leaves
goes back to the free queue but keeps its hash, so a later request with the same prefix can take it back
until it is evicted (least recently freed first).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from backend.engine.sequence import Sequence

BlockKey = tuple[int | None, tuple[int, ...], str | None]


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None  # set while the block is findable in the prefix cache
    key: BlockKey | None = None  # what the hash was computed from, to verify a hit


class BlockPool:
    """Allocates KV blocks to sequences and finds cached prefixes. Not thread-safe: the step loop owns it."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of at least one token, got {num_blocks}x{block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Free blocks in eviction order: the head is taken first.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[int, int] = {}  # hash -> block_id
        self.prefix_queries = 0  # prompt tokens looked up
        self.prefix_hits = 0  # of which found in the cache

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _key(self, seq: Sequence, index: int, parent: int | None) -> BlockKey:
        start = index * self.block_size
        return (parent, tuple(seq.token_ids[start : start + self.block_size]), seq.cache_salt)

    def _match_prefix(self, seq: Sequence) -> tuple[list[int], list[int]]:
        """Cached blocks (and their hashes) covering the prompt, never its last token."""
        hits: list[int] = []
        hashes: list[int] = []
        if not self.enable_prefix_caching:
            return hits, hashes
        parent: int | None = None
        for index in range((seq.num_tokens - 1) // self.block_size):
            key = self._key(seq, index, parent)
            block_id = self._cached.get(hash(key))
            if block_id is None or self.blocks[block_id].key != key:
                break
            parent = hash(key)
            hits.append(block_id)
            hashes.append(parent)
        return hits, hashes

    def allocate(self, seq: Sequence, reserve: int = 0) -> bool:
        """Give a waiting sequence blocks for all its tokens, reusing cached ones; False if they do not fit
        with `reserve` blocks left over. On success seq.num_computed_tokens is the cached prefix length.
        """
        assert not seq.block_table, f"{seq} already holds blocks"
        hits, hashes = self._match_prefix(seq)
        revived = sum(1 for b in hits if self.blocks[b].ref_count == 0)
        fresh = self.blocks_for(seq.num_tokens) - len(hits)
        if fresh + revived + reserve > self.num_free:
            return False
        for block_id in hits:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self._free[block_id]
            block.ref_count += 1
        seq.block_table = hits + [self._take() for _ in range(fresh)]
        seq.block_hashes = hashes
        seq.num_computed_tokens = len(hits) * self.block_size
        self.prefix_queries += seq.num_tokens
        self.prefix_hits += seq.num_computed_tokens
        return True

    def can_grow(self, seq: Sequence, num_tokens: int, reserve: int = 0) -> bool:
        """Whether the sequence can hold num_tokens and `reserve` blocks stay free."""
        return self.blocks_for(num_tokens) - len(seq.block_table) + reserve <= self.num_free

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """Add blocks so the sequence can hold num_tokens; the caller checked can_grow."""
        for _ in range(self.blocks_for(num_tokens) - len(seq.block_table)):
            seq.block_table.append(self._take())

    def shrink(self, seq: Sequence, num_tokens: int) -> None:
        """Return the tail blocks beyond what num_tokens need (blocks that held only rejected drafts)."""
        while len(seq.block_table) > max(1, self.blocks_for(num_tokens)):
            block = self.blocks[seq.block_table.pop()]
            assert block.ref_count == 1 and block.hash is None, f"{block} is shared or cached"
            block.ref_count = 0
            self._free[block.block_id] = None
            self._free.move_to_end(block.block_id, last=False)

    def fork(self, parent: Sequence, child: Sequence, num_blocks: int) -> None:
        """Let `child` share the parent's first `num_blocks` (full, computed) blocks; it writes only blocks of
        its own after them, so a shared block is never written twice."""
        assert not child.block_table, f"{child} already holds blocks"
        shared = parent.block_table[:num_blocks]
        for block_id in shared:
            self.blocks[block_id].ref_count += 1
        child.block_table = list(shared)
        child.block_hashes = parent.block_hashes[:num_blocks]
        child.num_computed_tokens = num_blocks * self.block_size

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Make the sequence's newly completed blocks findable; call after their KV was written."""
        if not self.enable_prefix_caching:
            return
        for index in range(len(seq.block_hashes), seq.num_computed_tokens // self.block_size):
            key = self._key(seq, index, seq.block_hashes[-1] if seq.block_hashes else None)
            block_hash = hash(key)
            seq.block_hashes.append(block_hash)
            # Another request may have computed the same block first; keep its copy as the shared one.
            if block_hash not in self._cached:
                block = self.blocks[seq.block_table[index]]
                block.hash, block.key = block_hash, key
                self._cached[block_hash] = block.block_id

    def free(self, seq: Sequence) -> None:
        """Release the sequence's blocks; cached ones stay reusable until evicted."""
        # Tail blocks are freed first, so they are evicted before the prefix that other requests share.
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {block_id} freed twice"
            if block.ref_count == 0:
                self._free[block_id] = None
                if block.hash is None:  # nothing to reuse: hand it out before any cached block
                    self._free.move_to_end(block_id, last=False)
        seq.block_table = []
        seq.block_hashes = []
        seq.num_computed_tokens = 0

    def _take(self) -> int:
        block_id, _ = self._free.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None:  # evict it from the prefix cache
            del self._cached[block.hash]
            block.hash = block.key = None
        block.ref_count = 1
        return block_id

    def check_invariants(self) -> None:
        """Assert the pool's internal consistency (tests and debugging)."""
        for block in self.blocks:
            assert block.ref_count >= 0
            assert (block.ref_count == 0) == (block.block_id in self._free), block
            if block.hash is not None:
                assert self._cached.get(block.hash) == block.block_id, block
                assert block.key is not None and hash(block.key) == block.hash
        for block_hash, block_id in self._cached.items():
            assert self.blocks[block_id].hash == block_hash
