"""One forward step over several sequences: which new tokens belong to which sequence, and plain
attention over each sequence's contiguous context.

A step feeds `query_lens[s]` new tokens of sequence s, the last ones of its `seq_lens[s]`-token
context (a prefill feeds the whole prompt, a decode step one token). The new tokens of all
sequences are laid end to end: [num_tokens] with num_tokens = sum(query_lens), the layout the
paged-attention kernel takes (query_start_loc marks where each sequence's tokens start).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class StepLayout:
    query_lens: tuple[int, ...]  # new tokens per sequence
    seq_lens: tuple[int, ...]  # context per sequence, new tokens included
    device: torch.device
    positions: torch.Tensor = field(init=False)  # [num_tokens] position of each new token
    token_seq: torch.Tensor = field(init=False)  # [num_tokens] sequence index of each new token

    def __post_init__(self) -> None:
        if len(self.query_lens) != len(self.seq_lens) or not self.query_lens:
            raise ValueError("a step needs query_lens and seq_lens for one or more sequences")
        if any(q < 1 or s < q for q, s in zip(self.query_lens, self.seq_lens)):
            raise ValueError(f"each sequence needs 1 <= new tokens <= context, got "
                             f"{self.query_lens} / {self.seq_lens}")
        positions = [p for q, s in zip(self.query_lens, self.seq_lens) for p in range(s - q, s)]
        token_seq = [i for i, q in enumerate(self.query_lens) for _ in range(q)]
        object.__setattr__(self, "positions", torch.tensor(positions, device=self.device))
        object.__setattr__(self, "token_seq", torch.tensor(token_seq, device=self.device))

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def query_start_loc(self) -> torch.Tensor:
        """int32 [num_seqs + 1]: where each sequence's new tokens start."""
        starts = [0, *itertools.accumulate(self.query_lens)]
        return torch.tensor(starts, dtype=torch.int32, device=self.device)

    @property
    def seq_lens_tensor(self) -> torch.Tensor:
        return torch.tensor(self.seq_lens, dtype=torch.int32, device=self.device)  # [num_seqs]

    @property
    def last_token_index(self) -> torch.Tensor:
        """[num_seqs] index of each sequence's last new token (its logits pick the next token)."""
        ends = list(itertools.accumulate(self.query_lens))
        return torch.tensor(ends, device=self.device) - 1


def context_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                      layout: StepLayout) -> torch.Tensor:
    """Causal attention of the new tokens over contiguous per-sequence contexts.

    query [num_tokens, num_heads, head_dim]; keys, values [num_seqs, C, num_kv_heads, head_dim]
    with C >= max(seq_lens) (rows padded past each seq_len).
    Returns [num_tokens, num_heads, head_dim].
    """
    num_seqs, ctx, num_kv_heads, head_dim = keys.shape
    max_q = max(layout.query_lens)
    starts = layout.query_start_loc[:-1].long()  # [num_seqs]
    row = torch.arange(query.shape[0], device=query.device) - starts[layout.token_seq]  # [T]
    padded_q = query.new_zeros(num_seqs, max_q, *query.shape[1:])  # [S, max_q, H, D]
    padded_q[layout.token_seq, row] = query
    seq_lens = layout.seq_lens_tensor.long()
    q_lens = torch.tensor(layout.query_lens, device=query.device)
    q_pos = seq_lens[:, None] - q_lens[:, None] + torch.arange(max_q, device=query.device)
    # A padded query row sees every position; real rows see their causal prefix only.
    key_pos = torch.arange(ctx, device=query.device)  # [C]
    mask = key_pos[None, None, :] <= q_pos[:, :, None]  # [S, max_q, C]
    out = F.scaled_dot_product_attention(
        padded_q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
        attn_mask=mask[:, None], enable_gqa=True)  # [S, H, max_q, D]
    return out.transpose(1, 2)[layout.token_seq, row]  # [T, H, D]
