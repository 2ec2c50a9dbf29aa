"""The Prefix cache page from the entry point: hits, cached blocks, evictions follow the engine."""

from __future__ import annotations

from lab.memory.kv_pool import PoolConfig
from lab.scenarios.prefix_cache import PrefixCacheStory, PrefixConfig
from tests.page_helpers import assert_link_keeps, figures, metrics

PAGE = "pages/prefix_cache.py"


def expected(frame, num_blocks: int = 8) -> dict[str, str]:
    usage = frame.snapshot.usage
    return {"Hit rate (prompt tokens)": f"{100 * frame.hit_rate:.0f}%",
            "Blocks in use": f"{usage.blocks_used} / {num_blocks}",
            "Free but cached": str(usage.blocks_cached_free),
            "Evictions so far": str(frame.evictions)}


def test_step_back_reset_follow_the_engine(open_page) -> None:
    frames = PrefixCacheStory(PrefixConfig(), 0).frames()
    at = open_page(step="5")
    assert not at.exception and not at.error
    assert metrics(at) == expected(frames[5])
    at.button(key="step_forward").click().run()
    assert metrics(at) == expected(frames[6])
    assert frames[6].admissions[0].hit_tokens == 32  # app A's two system-prompt blocks, cached
    assert any("32 tokens found in the cache" in m.value for m in at.markdown)
    assert any(m.value.startswith(":green-badge[") for m in at.markdown)
    at.button(key="step_back").click().run()
    assert metrics(at) == expected(frames[5])
    at.button(key="step_reset").click().run()
    assert metrics(at) == expected(frames[0])
    assert not at.exception


def test_the_default_run_shows_an_eviction(open_page) -> None:
    frames = PrefixCacheStory(PrefixConfig(), 0).frames()
    at = open_page(step=str(len(frames) - 1))
    assert int(metrics(at)["Evictions so far"]) == frames[-1].evictions > 0
    assert "every block is back in the free queue" in " ".join(m.value for m in at.markdown)


def test_cached_tiles_say_whose_prompt_they_hold(open_page) -> None:
    at = open_page(step="3")
    pool = figures(at)["prefix_pool"]
    texts = [t for trace in pool["data"] if trace.get("mode") == "text" for t in trace["text"]]
    # After R0 (app A) and R1 (app B) finish, their system prompts' full blocks stay cached.
    for held in ("A·L0", "A·L1", "B·L0", "B·L1"):
        assert any(t.endswith(f"cached {held}") for t in texts), (held, texts)
    assert "A·L0: block L0 of app A's system prompt" in " ".join(m.value for m in at.markdown)


def test_the_question_is_asked_once_the_step_before_its_admission(open_page) -> None:
    def asked(at) -> bool:
        return any("How many of its prompt tokens" in m.value for m in at.markdown)

    at = open_page(step="7")
    assert not asked(at)
    at.button(key="step_forward").click().run()  # step 8
    assert not asked(at)
    at.button(key="step_forward").click().run()  # step 9: R5 is admitted at step 10
    assert asked(at)
    text = next(m.value for m in at.markdown if "How many of its prompt tokens" in m.value)
    for needed in ("step 10", "R5", "app B's 36-token system prompt", "43 prompt tokens",
                   "blocks of 16", "pool at step 9", "B·L0"):
        assert needed in text, needed
    at.button(key="prefix_hits_show").click().run()
    why = at.info[0].value
    assert "engine says **0**" in why and "B·L0 had been evicted at step 8" in why
    at.button(key="step_forward").click().run()  # step 10: the verdict stays at its step
    assert at.info and "engine says **0**" in at.info[0].value
    at.button(key="step_forward").click().run()  # step 11: closed
    assert not asked(at) and not at.info


def test_an_unanswered_question_holds_back_only_its_own_step(open_page) -> None:
    at = open_page(step="10")
    assert at.get("form")  # asked, and the step's pool is held back
    at.button(key="step_forward").click().run()
    assert not at.get("form")  # step 11: closed, nothing held back any more
    assert "prefix_pool" in figures(at)


def test_link_restores_a_state_with_evictions(open_page) -> None:
    query = dict(num_blocks="10", requests="10", step="18", seed="1")
    cfg = PrefixConfig(PoolConfig(num_blocks=10, block_size=16), num_requests=10)
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
