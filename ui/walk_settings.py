"""The walkthrough's settings row, shared by the pages that replay it (block tables, attention).

Block size, prompt and output of request A, number of requests and pool size, each a
query-param widget (`ui.state.int_param`), so a link reopens the same walk.
"""

from __future__ import annotations

from collections.abc import Mapping

import streamlit as st

from lab.memory.kv_pool import PoolConfig
from lab.scenarios.block_tables import BlockTablesStory, WalkParams, WalkTooBig
from ui.scenario import or_stop
from ui.state import int_param, is_classroom

POOL, CLASSROOM_POOL = 64, 24  # blocks


def walk_settings(*, output_len: int, help: Mapping[str, str] | None = None) -> WalkParams:
    """Five widgets in a row; `output_len` is the page's default output of A, `help` its
    tooltips by query parameter (block_size, prompt_len, output_len, requests, num_blocks)."""
    tip = (help or {}).get
    cols = st.columns(5)
    block_size = int_param("Block size", "block_size", default=16, min_value=1, max_value=64,
                           container=cols[0], help=tip("block_size"))
    prompt_len = int_param("Prompt of A", "prompt_len", default=30, min_value=1,
                           max_value=256, container=cols[1], help=tip("prompt_len"))
    output = int_param("Output of A", "output_len", default=output_len, min_value=1,
                       max_value=256, container=cols[2], help=tip("output_len"))
    num_requests = int_param("Requests", "requests", default=3, min_value=1, max_value=6,
                             container=cols[3], help=tip("requests"))
    # On a projector a smaller pool leaves room for the block tables beside it.
    pool = CLASSROOM_POOL if is_classroom() else POOL
    num_blocks = int_param("Pool (blocks)", "num_blocks", default=pool, min_value=4,
                           max_value=256, widget="number", container=cols[4],
                           help=tip("num_blocks"))
    return WalkParams(PoolConfig(num_blocks=num_blocks, block_size=block_size),
                      prompt_len=prompt_len, output_len=output, num_requests=num_requests)


def check_walk(params: WalkParams, seed: int) -> None:
    """Stop the page with the engine's message when the walk cannot fit its pool."""
    or_stop(BlockTablesStory(params, seed).check_fits, errors=WalkTooBig, message="{error}")
