"""Why the guide's plain capacity sheet and vLLM's own computation give different numbers.

Each difference is one sentence with this model's numbers, so the learner sees which of the
engine's rules moved the result: the memory CUDA reports, where concurrency is measured, what
a sliding-window layer reserves, how hybrid models share blocks, the padding layers, and the
block size an MLA backend forces.
"""

from __future__ import annotations

from lab.sizing.capacity import CapacitySheet
from lab.sizing.kv_formula import KVLayout
from lab.sizing.vllm_sheet import GIB, VllmSheet, gib


def differences(layout: KVLayout, plain: CapacitySheet, sheet: VllmSheet,
                asked_block_size: int, max_num_seqs: int = 0) -> list[str]:
    """Sentences naming each rule on which the two sheets part, with this model's numbers."""
    spec, out = layout.spec, []
    if sheet.total_memory and sheet.total_memory != plain.gpu_bytes:
        gap = plain.gpu_bytes - sheet.total_memory
        out.append(f"Memory: vLLM multiplies what CUDA reports ({gib(sheet.total_memory)}), "
                   f"{gib(abs(gap))} {'less' if gap > 0 else 'more'} than the "
                   f"{gib(plain.gpu_bytes)} the driver lists, by gpu_memory_utilization.")
    if sheet.weights_memory and sheet.other_memory == plain.reserve_bytes:
        out.append(f"Reserve: both take off your {gib(sheet.other_memory)} estimate; vLLM "
                   "measures its own in a profile run (activation peak of one "
                   f"{sheet.max_num_batched_tokens:,}-token batch, non-torch memory, CUDA "
                   "graphs), and the log's 'Available KV cache memory' is the result.")
    if sheet.block_size != asked_block_size and spec.state:
        out.append(f"Block size: {sheet.block_size}, not {asked_block_size}: one attention "
                   f"page ({sheet.page_size_bytes:,} B) must hold a {spec.state.label} state "
                   f"({sheet.state_page_bytes:,} B), so vLLM raises the block size and pads "
                   "the state page to the attention page.")
    elif sheet.block_size != asked_block_size:
        out.append(f"Block size: {sheet.block_size}, not {asked_block_size}: MLA runs on "
                   "FlashMLA here, which needs 64-token blocks.")
    if plain.context != sheet.max_model_len:
        out.append(f"Concurrency is logged at max_model_len = {sheet.max_model_len:,} tokens "
                   f"per request, not at your {plain.context:,}: vLLM assumes every request "
                   "may grow to the longest context it accepts.")
    if len(sheet.groups) > 1:
        out.append(f"KV-cache groups: the {sheet.num_layers} layers form {len(sheet.groups)} "
                   f"groups of {sheet.group_size} that share one pool of blocks; every "
                   f"{sheet.block_size} tokens take a block in each group, so vLLM logs "
                   f"blocks // {len(sheet.groups)} × {sheet.block_size} = "
                   f"{sheet.num_tokens:,} tokens, where the plain sheet counts each block as "
                   f"{plain.block_size} tokens of every layer ({plain.num_tokens:,}).")
    if warnings := sheet.padding_warnings():
        empty = sum(g.pages_per_request * (sheet.group_size - g.num_layers)
                    for g in sheet.groups)
        share = empty / (sheet.blocks_per_request * sheet.group_size)
        quoted = " and ".join(f"'{w}'" for w in warnings)
        out.append(f"Padding: groups must hold {sheet.group_size} layers each, so vLLM warns "
                   f"{quoted}; in one {sheet.max_model_len:,}-token request the empty "
                   f"slots are {share:.1%} of its blocks' memory.")
    if spec.num_sliding_layers:
        need = min(spec.sliding_window - 1 + sheet.max_num_batched_tokens, sheet.max_model_len)
        out.append(f"Sliding window: vLLM reserves min(window − 1 + max_num_batched_tokens, "
                   f"max_model_len) = min({spec.sliding_window - 1:,} + "
                   f"{sheet.max_num_batched_tokens:,}, {sheet.max_model_len:,}) = {need:,} "
                   "tokens (+1 block) per sliding layer, room for a whole prefill chunk; the "
                   f"plain sheet keeps min(context, window) = "
                   f"{layout.window_tokens(plain.context):,}.")
    if spec.num_chunked_layers:
        need = min(spec.attention_chunk_size + sheet.max_num_batched_tokens,
                   sheet.max_model_len)
        out.append(f"Chunked local: vLLM reserves min(chunk + max_num_batched_tokens, "
                   f"max_model_len) = min({spec.attention_chunk_size:,} + "
                   f"{sheet.max_num_batched_tokens:,}, {sheet.max_model_len:,}) = {need:,} "
                   "tokens per chunked layer; the plain sheet keeps min(context, chunk) = "
                   f"{layout.chunk_tokens(plain.context):,}.")
    if spec.state:
        out.append(_state_sentence(layout, sheet))
    if max_num_seqs and sheet.max_concurrency > max_num_seqs:
        out.append(f"Running requests: the log's {sheet.max_concurrency:,.0f}x is memory "
                   f"only; the scheduler runs at most max_num_seqs = {max_num_seqs:,} "
                   "requests at once (vllm serve's default on this card).")
    if not sheet.fits_one_request and sheet.available_kv_memory > 0:
        out.append(f"vLLM would refuse to start: one {sheet.max_model_len:,}-token request "
                   f"needs {sheet.needed_memory / GIB:.2f} GiB of KV cache; the estimated "
                   f"maximum model length is {sheet.estimated_max_model_len():,}.")
    return out


def _state_sentence(layout: KVLayout, sheet: VllmSheet) -> str:
    """How many state pages a request holds in vLLM, against the plain sheet's bytes."""
    state = layout.spec.state
    held = {"none": "one state page per layer (prefix caching is off)",
            "align": "two state pages per layer (prefix caching on, mamba_cache_mode align)",
            "all": "a state page per block of max_model_len (prefix caching on, "
                   "mamba_cache_mode all)"}[sheet.mode]
    return (f"{state.label} state: a request holds {held}, each padded to "
            f"{sheet.page_size_bytes:,} B; the plain sheet counts the state's own "
            f"{layout.state_bytes:,} B per sequence ({state.num_layers} × "
            f"{state.page_bytes(layout.tp):,} B).")
