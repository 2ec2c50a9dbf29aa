"""A paged-attention call ready to launch: its kernel calls (what the ahead-of-time compile check
compiles, bench/aot.py) and where the output lands."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kernels.backend import kernel_launch


@dataclass(frozen=True)
class KernelCall:
    """One kernel launch: the @triton.jit function, its grid, arguments and keyword arguments
    (constexprs and launch options)."""

    kernel: Any
    grid: tuple[int, int, int]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class Launch:
    """The kernel calls of one paged-attention call and its output."""

    out: torch.Tensor  # [num_tokens, num_heads, head_dim]
    calls: tuple[KernelCall, ...]
    rows: torch.Tensor | None = None  # a layout's own float32 (token, head) rows, copied to out

    def run(self) -> torch.Tensor:
        with kernel_launch():
            for call in self.calls:
                call.kernel[call.grid](*call.args, **call.kwargs)
        if self.rows is not None:
            num_tokens, num_heads, head_dim = self.out.shape
            self.out.copy_(self.rows[:num_tokens * num_heads, :head_dim].view(self.out.shape))
        return self.out
