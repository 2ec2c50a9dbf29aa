"""One tile of keys attended with the online softmax: the arithmetic both program layouts of
the paged-attention kernel share (kernels/paged_attention.py, kernels/whole_batch.py).

A program keeps, for each of its rows, a running max m, a running sum l and an unnormalised
output acc. A tile's scores (masked keys at -inf) and values fold in: the new max rescales what
was summed under the old one by 2^(m_old - m_new), so the tiles can come one at a time and the
output is acc / l at the end. The kernel works in base 2 (exp2, with the softmax scale
multiplied by log2(e)); kernels/reference.py replays the same steps in float64.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import kernels.backend  # noqa: F401  (sets TRITON_INTERPRET before triton loads)

LOG2E = 1.4426950408889634
NEG_BIG = tl.constexpr(-1.0e30)  # running-max start: finite, so a row with no key gives no NaN
_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def dot_dtype(dtype: torch.dtype, dot_f32: bool) -> tl.dtype:
    """What the kernels multiply in: the cache's dtype, or float32 where the plan says so (the
    interpreter cannot multiply bfloat16)."""
    return tl.float32 if dot_f32 else _TL_DTYPES[dtype]


@triton.jit
def attend_tile(q, k, v, visible, m_i, l_i, acc, qk_scale, PRECISION: tl.constexpr):
    """Queries q [M, D] against a tile of keys k [N, D] and values v [N, D], where visible
    [M, N] (or [1, N]) says which key each row may see; fold the tile into the running state
    m_i, l_i [M, 1] and acc [M, D] (float32) and return the new state."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [M, N] base 2
    s = tl.where(visible, s, float("-inf"))
    # tl.reduce with the combine functions tl.max and tl.sum use (on float32 they are just
    # this): the same code compiled, and the interpreter runs it as one numpy call, where a
    # call of the @jit tl.max first re-patches the whole language.
    m_new = tl.maximum(m_i, tl.reduce(s, 1, tl.standard._elementwise_max, keep_dims=True))
    alpha = tl.exp2(m_i - m_new)  # [M, 1] rescales what was summed under the old max
    p = tl.exp2(s - m_new)  # [M, N]; 0 where not visible
    l_i = l_i * alpha + tl.reduce(p, 1, tl.standard._sum_combine, keep_dims=True)
    acc = acc * alpha + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc
