"""The Prefix cache page from the entry point: hits, cached blocks, evictions follow the engine."""

from __future__ import annotations

from lab.memory.kv_pool import PoolConfig
from lab.scenarios.prefix_cache import PrefixCacheStory, PrefixConfig
from tests.page_helpers import assert_link_keeps, figures, metrics

PAGE = "pages/prefix_cache.py"


def expected(frame, num_blocks: int = 16) -> dict[str, str]:
    usage = frame.snapshot.usage
    return {"Hit rate (prompt tokens)": f"{100 * frame.hit_rate:.0f}%",
            "Blocks in use": f"{usage.blocks_used} / {num_blocks}",
            "Free but cached": str(usage.blocks_cached_free),
            "Evictions so far": str(frame.evictions)}


def test_step_back_reset_follow_the_engine(open_page) -> None:
    frames = PrefixCacheStory(PrefixConfig(), 0).frames()
    at = open_page(step="1")
    assert not at.exception and not at.error
    assert metrics(at) == expected(frames[1])
    at.button(key="step_forward").click().run()
    assert metrics(at) == expected(frames[2])
    assert frames[2].admissions[0].hit_tokens == 16  # the second request reuses two blocks
    assert any("16 tokens found in the cache" in m.value for m in at.markdown)
    assert any(m.value.startswith(":green-badge[") for m in at.markdown)
    at.button(key="step_back").click().run()
    assert metrics(at) == expected(frames[1])
    at.button(key="step_reset").click().run()
    assert metrics(at) == expected(frames[0])
    assert not at.exception


def test_link_restores_a_state_with_evictions(open_page) -> None:
    query = dict(num_blocks="10", requests="10", step="18", seed="1")
    cfg = PrefixConfig(PoolConfig(num_blocks=10, block_size=8), num_requests=10)
    frames = PrefixCacheStory(cfg, 1).frames()
    assert frames[18].evictions > 0
    at = open_page(**query)
    assert not at.exception
    assert metrics(at) == expected(frames[18], 10)
    assert_link_keeps(at, query)


def test_pool_too_small_shows_a_message(open_page) -> None:
    at = open_page(num_blocks="4", system_len="64")
    assert not at.exception
    assert "cannot run" in at.error[0].value and "pool has 4" in at.error[0].value
    assert not figures(at)
