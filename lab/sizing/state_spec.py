"""The per-sequence state of recurrent layers: what vLLM keeps for Mamba1, Mamba2 and Gated
DeltaNet layers instead of a KV cache (one `MambaSpec` page per layer and request).

A recurrent layer does not store a vector per token. It keeps two tensors per sequence, the
same size at 10 tokens as at 100,000 (vLLM's MambaStateShapeCalculator):
- a convolution state, the last `conv_kernel - 1` inputs of the short causal convolution;
- a temporal (SSM) state, the recurrence the layer carries from token to token.

Shapes per tensor-parallel rank (`tp`), as vLLM lays them out:
- Mamba1 (Jamba): conv (kernel - 1, d_inner / tp), ssm (d_inner / tp, d_state);
- Mamba2 (Granite-4.0-H, Nemotron-H, Falcon-H1): conv (kernel - 1, (d_inner + 2 x groups x
  d_state) / tp), ssm (heads / tp, head_dim, d_state); groups that do not split over the ranks
  are replicated until they do (extra_groups_for_head_shards);
- Gated DeltaNet (Qwen3-Next): conv (kernel - 1, (2 x key_heads x key_dim + value_heads x
  value_dim) / tp), ssm (value_heads / tp, value_dim, key_dim).
The conv state takes mamba_cache_dtype and the ssm state mamba_ssm_cache_dtype; both default
to the model's dtype, except Nemotron-H, whose ssm state vLLM keeps in float32 unless the
config says otherwise (NemotronHForCausalLMConfig).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

STATE_KINDS = {"mamba1": "Mamba1", "mamba2": "Mamba2", "gdn": "Gated DeltaNet"}
DTYPE_NAMES = {2: "bf16", 4: "fp32"}
STATE_LIMIT = 1 << 20  # any larger state dimension is not a real model's


@dataclass(frozen=True)
class RecurrentState:
    kind: str  # a key of STATE_KINDS
    num_layers: int  # recurrent layers, each keeping one state per sequence
    conv_kernel: int
    d_inner: int = 0  # Mamba1 / Mamba2 inner width (heads x head_dim for Mamba2)
    groups: int = 0  # Mamba2 B/C groups; Gated DeltaNet key heads
    heads: int = 0  # Mamba2 heads; Gated DeltaNet value heads
    head_dim: int = 0  # Mamba2 head dim; Gated DeltaNet value head dim
    state_size: int = 0  # Mamba d_state; Gated DeltaNet key head dim
    conv_bytes: int = 2  # bytes per element of the conv state
    ssm_bytes: int = 2  # bytes per element of the ssm state
    chunk_size: int = 0  # the model's mamba chunk size (0: vLLM's default of 2048)
    prefix_caching_all: bool = False  # vLLM caches a state per block under prefix caching

    @property
    def label(self) -> str:
        return STATE_KINDS.get(self.kind, self.kind)

    def _groups(self, tp: int) -> int:
        """Mamba2 groups after replication so every rank's heads have theirs."""
        return self.groups if self.groups % tp == 0 else tp

    def conv_dim(self, tp: int = 1) -> int:
        if self.kind == "mamba1":
            return self.d_inner // tp
        if self.kind == "mamba2":
            return (self.d_inner + 2 * self._groups(tp) * self.state_size) // tp
        return (2 * self.groups * self.state_size + self.heads * self.head_dim) // tp

    def shapes(self, tp: int = 1) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(conv state shape, ssm state shape) on one of `tp` ranks."""
        conv = (self.conv_kernel - 1, self.conv_dim(tp))
        if self.kind == "mamba1":
            return conv, (self.d_inner // tp, self.state_size)
        if self.kind == "mamba2":
            return conv, (self.heads // tp, self.head_dim, self.state_size)
        return conv, (self.heads // tp, self.head_dim, self.state_size)

    def splits_evenly(self, tp: int) -> bool:
        """vLLM divides these widths by tp exactly (and refuses a split that does not)."""
        if self.kind == "mamba1":
            widths = [self.d_inner]
        elif self.kind == "mamba2":
            widths = [self.d_inner + 2 * self._groups(tp) * self.state_size, self.heads]
        else:
            widths = [2 * self.groups * self.state_size + self.heads * self.head_dim,
                      self.heads]
        return all(w % tp == 0 for w in widths)

    def conv_state_bytes(self, tp: int = 1) -> int:
        return prod(self.shapes(tp)[0]) * self.conv_bytes

    def ssm_state_bytes(self, tp: int = 1) -> int:
        return prod(self.shapes(tp)[1]) * self.ssm_bytes

    def page_bytes(self, tp: int = 1) -> int:
        """One layer's state for one sequence (MambaSpec.page_size_bytes, unpadded)."""
        return self.conv_state_bytes(tp) + self.ssm_state_bytes(tp)

    def sequence_bytes(self, tp: int = 1) -> int:
        """Every recurrent layer's state for one sequence."""
        return self.num_layers * self.page_bytes(tp)


def state_errors(state: RecurrentState) -> dict[str, str]:
    """Every problem with a state description (empty when it is valid)."""
    if state.kind not in STATE_KINDS:
        return {"state": f"kind must be one of {', '.join(STATE_KINDS)}, got {state.kind!r}"}
    errors = {}
    for name in ("num_layers", "conv_kernel", "d_inner", "groups", "heads", "head_dim",
                 "state_size", "chunk_size"):
        value = getattr(state, name)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= STATE_LIMIT:
            errors[f"state.{name}"] = f"must be a whole number from 0 to {STATE_LIMIT:,}"
    if errors:
        return errors
    needed = {"mamba1": ("d_inner", "state_size"),
              "mamba2": ("d_inner", "groups", "heads", "head_dim", "state_size"),
              "gdn": ("groups", "heads", "head_dim", "state_size")}[state.kind]
    for name in ("num_layers", "conv_kernel", *needed):
        if getattr(state, name) < 1:
            errors[f"state.{name}"] = f"a {state.label} layer needs {name} above 0"
    for name in ("conv_bytes", "ssm_bytes"):
        if getattr(state, name) not in DTYPE_NAMES:
            errors[f"state.{name}"] = "must be 2 (bf16 / fp16) or 4 (fp32)"
    return errors
