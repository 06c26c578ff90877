"""The reference scheduler's recurrent-state group [SCHED-9]: a model with recurrent layers
(chapter 09) keeps its states in the same block pool as its KV (chapter 08), and a row's
table in the state group is two pages: the state the row reads, and the state it writes.

A running request holds one page of the group, its running state, from its first row
until it ends or is preempted. A row advances it in place (its table `[null, running]`),
except a row that starts at a checkpoint, which reads one page and writes a fresh one
(`[read, running]`):

  * the first row after a prefix hit reads the cached state the hit ends at and writes a
    copy of its own (copy-on-write: a hit never shares the state a request writes);
  * the first row without a hit writes a fresh page zeroed to the empty state;
  * the row that starts at the request's checkpoint (`checkpoint_end`: the last whole
    block of its prompt short of the prompt's last token, where the attention groups'
    prefix cache serves a resend of the prompt, `admission_match_limit` and BLOCK-9's
    retention) reads its running page and moves on to a fresh one, and that page is then
    cached as the state of those tokens. The scheduler ends a prefill chunk there, so
    that a row starts there.

A checkpoint is a cached block of the pool, keyed by the chained hash of the tokens it
has read and the state group's id, so the pool keeps and evicts it as any cached block
(lazily, least recently released first). A prefix hit ends at one (STATE-5: the hit of
several groups is their minimum).

What a page holds is chapter 09's stand-in for a recurrent layer (`state_digest` of the
tokens read, STATE-4), on a tensor: the reference plays the model, as an adapter does
for a real engine, and a row shows the state it reads (`Row.state_read`).
"""

from dataclasses import replace

import torch

from kvspec.spec.block_pool import NULL_BLOCK, BlockPoolSnapshot, PartialBlocks
from kvspec.spec.lifecycle import admission_match_limit
from kvspec.spec.state import advance_state, is_checkpoint_boundary, state_digest

from .block_pool_engine import BlockPoolEngine, BlockRequest


class StateGroup:
    """[SCHED-9] The state pages of one scheduler's requests, in its engine's block pool."""

    def __init__(self, engine: BlockPoolEngine):
        self.engine = engine
        self.pool = engine.pool
        self.bs = engine.bs
        self.group = len(engine.groups)
        """The state group's id, after the attention groups: its checkpoints' keys are (hash, group)."""
        self.digest = torch.zeros(self.pool.num_blocks, dtype=torch.int64, device=self.pool.device)
        """The state each page holds (state_digest), on the pages the group holds or caches."""
        self.tables: dict[str, torch.Tensor] = {}
        """Per request that holds state pages: [the page its row reads (null between rows), its running page]."""

    def table(self, rid: str) -> tuple[int, ...]:
        return tuple(self.tables[rid].tolist()) if rid in self.tables else (NULL_BLOCK, NULL_BLOCK)

    # -- where a request's state is kept ----------------------------------------------------

    def checkpoint_end(self, request: BlockRequest) -> int:
        """The tokens its checkpoint has read: a resend of its prompt hits whole blocks short
        of the prompt's last token, so a state there serves the hit the attention groups cache."""
        return admission_match_limit(request.prompt_len) // self.bs * self.bs

    def chunk(self, request: BlockRequest, start: int, tokens: int) -> int:
        """A row's tokens, ended at the request's checkpoint so that the next row starts there."""
        end = self.checkpoint_end(request)
        return end - start if start < end < start + tokens else tokens

    def copies(self, request: BlockRequest, start: int) -> bool:
        """Whether the row starting at `start` writes a fresh page: its first row, or the one
        that leaves its running page as its checkpoint."""
        running = self.table(request.rid)[1]
        return running == NULL_BLOCK or (start == self.checkpoint_end(request)
                                         and is_checkpoint_boundary(start, self.bs))

    def pages_needed(self, request: BlockRequest, start: int, checkpoint: int = NULL_BLOCK) -> int:
        """The free pages the row takes: a fresh page where it copies, and the checkpoint a
        prefix hit reads where that is free (cached, not held)."""
        return self.copies(request, start) + self.pool.free_among([checkpoint] if checkpoint else [])

    # -- a prefix hit -----------------------------------------------------------------------

    def find_hit(self, request: BlockRequest, limit_tokens: int) -> tuple[int, list[list[int]], int, int]:
        """[STATE-5] The longest prefix hit of at most `limit_tokens` tokens that every group
        accepts: one the attention groups take (BlockPoolEngine.find_hit) that ends at a
        cached state. Its length, the attention groups' blocks and junction, and the
        checkpoint it reads (the null page without a hit)."""
        for blocks in range(limit_tokens // self.bs, 0, -1):
            checkpoint = self.pool.cached_block((request.hashes[blocks - 1], self.group))
            if checkpoint is None:
                continue
            hit, adopted, junction = self.engine.find_hit(request, blocks * self.bs)
            if hit == blocks * self.bs:
                return hit, adopted, junction, checkpoint
        return 0, [[] for _ in self.engine.groups], 0, NULL_BLOCK

    def adopt(self, request: BlockRequest, checkpoint: int) -> None:
        """A hit's checkpoint, held by the request until its first row has read it; taken
        before any new page, which could otherwise take it from the free queue."""
        if checkpoint != NULL_BLOCK:
            self.pool.claim([checkpoint])
        self.tables[request.rid] = torch.tensor([checkpoint, NULL_BLOCK], dtype=torch.int64, device=self.pool.device)

    # -- a row ------------------------------------------------------------------------------

    def open_row(self, request: BlockRequest, start: int) -> int:
        """The row's table in the group, its fresh page taken (the caller counted it:
        pages_needed); returns the state the row reads."""
        read, running = self.table(request.rid)
        if running == NULL_BLOCK:  # its first row: a copy of the hit's checkpoint, or the empty state
            running = self.pool.take(1)[0]
            if read == NULL_BLOCK:
                self.digest[running] = state_digest(())
        elif self.copies(request, start):  # its checkpoint: the running page keeps the state of `start` tokens
            read, running = running, self.pool.take(1)[0]
        self.tables[request.rid] = torch.tensor([read, running], dtype=torch.int64, device=self.pool.device)
        return int(self.digest[running if read == NULL_BLOCK else read])

    def write(self, request: BlockRequest, start: int, tokens: int) -> None:
        """[STATE-4] The model's forward: the running page holds the state read, advanced by
        the row's tokens. A page read is given back, cached as the state of `start` tokens."""
        read, running = self.table(request.rid)
        digest = int(self.digest[running if read == NULL_BLOCK else read])
        for token in request.tokens[start:start + tokens]:
            digest = advance_state(digest, token)
        self.digest[running] = digest
        if read != NULL_BLOCK:
            if self.pool.key_of(read) is None:  # its own checkpoint (a hit's is cached already)
                self.pool.store(read, (request.hashes[start // self.bs - 1], self.group))
            self.pool.release([read])
            self.tables[request.rid][0] = NULL_BLOCK

    def release(self, request: BlockRequest) -> None:
        """Give back every page it holds (it ended, or was preempted)."""
        if request.rid in self.tables:
            self.pool.release([page for page in self.tables.pop(request.rid).tolist() if page != NULL_BLOCK])

    # -- what it shows ----------------------------------------------------------------------

    def attention_snapshot(self, snapshot: BlockPoolSnapshot) -> BlockPoolSnapshot:
        """[OBS-4] Chapter 08's snapshot of the attention groups: a partial view of every
        block less those the state group holds or caches, as chapter 09 shows a shared
        block pool with state, so that BLOCK-1 .. BLOCK-9 read what they read without it."""
        view = snapshot.block_pool
        state = ({page for table in self.tables.values() for page in table.tolist() if page != NULL_BLOCK}
                 | {block for _, group, block in view.cache_map if group == self.group})
        shown = {index: block for index, block in enumerate(view.blocks) if index not in state}
        attention = replace(view, blocks=PartialBlocks(len(view.blocks), shown), free_count=view.free_count,
                            free_queue=tuple(block for block in view.free_queue if block not in state),
                            cache_map=tuple(entry for entry in view.cache_map if entry[1] != self.group),
                            replayed_map=tuple(entry for entry in view.replayed_map if entry[1] != self.group))
        return replace(snapshot, block_pool=attention)
