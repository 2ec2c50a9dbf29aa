"""A real model's KV cache groups on the Mixed attention page (lab/scenarios/mixed_models.py),
worked by hand from the published configs."""

from __future__ import annotations

import pytest

from lab.scenarios.mixed_models import available_models, model_groups


def test_every_model_of_the_selector_has_a_preset() -> None:
    assert len(available_models()) == 4


def test_gpt_oss_20b_is_two_groups_of_twelve_layers() -> None:
    m = model_groups("GPT-OSS-20B")
    # 24 layers alternate sliding window 128 and full attention: 12 and 12, one group each.
    assert (m.block_size, m.why, m.group_size) == (16, "", 12)
    assert m.page_bytes == 16 * 2 * 8 * 64 * 2  # block x K and V x 8 KV heads x 64 x bf16
    full, window = m.groups
    assert (full.kind, full.num_layers, full.pages_per_request) == ("full attention", 12,
                                                                    32_768 // 16)
    # ceil(min(128 - 1 + 8,192, 32,768) / 16) + 1: the window rarely starts on a block.
    assert (window.kind, window.limit, window.pages_per_request) == ("sliding window", 128,
                                                                     -(-8_319 // 16) + 1)


def test_llama_4_scout_chunks_and_qwen3_next_raises_the_block() -> None:
    scout = model_groups("Llama-4-Scout")  # 48 layers: 36 chunked (8,192), 12 full
    assert [g.kind for g in scout.groups] == ["full attention"] + ["chunked local"] * 3
    assert scout.groups[1].pages_per_request == (8_192 + 8_192) // 16
    qwen = model_groups("Qwen3-Next-80B-A3B")  # a Gated DeltaNet state must fit one page
    assert qwen.block_size > 16 and qwen.block_size % 16 == 0 and "raises" in qwen.why
    assert qwen.page_bytes == qwen.block_size * 2 * 2 * 256 * 2  # 2 KV heads of 256, bf16


def test_an_unknown_model_gets_a_clear_error() -> None:
    with pytest.raises(ValueError, match="choose one of"):
        model_groups("GPT-5")


def test_the_page_shows_the_chosen_model(open_app_page) -> None:
    at = open_app_page("pages/mixed_attention.py", model="Llama-4-Scout")
    assert not at.exception
    table = next(m.value for m in at.markdown if "pages per request |" in m.value)
    assert "| 1 | chunked local | 12 | chunk 8,192 | 1,024 |" in table
