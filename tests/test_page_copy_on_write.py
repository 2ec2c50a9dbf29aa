"""The Copy-on-write page from the entry point: ref counts, copies and memory follow the engine."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest

from lab.figures.style import HIGHLIGHT_COLOR
from lab.memory.kv_pool import PoolConfig
from lab.scenarios.copy_on_write import BranchConfig, CopyOnWriteStory
from tests.page_helpers import assert_link_keeps, figures, metrics

PAGE = "pages/copy_on_write.py"


def expected(frame) -> dict[str, str]:
    shared = sum(b.ref_count > 1 for b in frame.snapshot.blocks)
    return {"Live branches": str(len(frame.live)), "Blocks in use": str(frame.blocks_used),
            "Shared blocks": str(shared),
            "Block copies so far": str(frame.copies)}


def pool_figure(at: AppTest) -> dict:
    return figures(at)["cow_pool"]


def test_step_back_reset_follow_the_engine(open_page) -> None:
    frames = CopyOnWriteStory(BranchConfig(), 0).frames()
    at = open_page()
    assert not at.exception and not at.error
    assert metrics(at) == expected(frames[0]) and metrics(at)["Blocks in use"] == "2"
    at.button(key="step_forward").click().run()
    assert metrics(at) == expected(frames[1])
    # The copy is on screen: the shared source block and the three copies are outlined.
    tiles = next(t for t in pool_figure(at)["data"] if t.get("name") == "tiles")
    outlined = [c for c in tiles["marker"]["line"]["color"] if c == HIGHLIGHT_COLOR]
    assert len(outlined) == 4
    assert any("copy-on-write copies it to block(s) **2, 3, 4**" in m.value for m in at.markdown)
    assert any(m.value.startswith(":green-badge[") for m in at.markdown)
    at.button(key="step_forward").click().run()
    at.button(key="step_back").click().run()
    assert metrics(at) == expected(frames[1])
    at.button(key="step_reset").click().run()
    assert metrics(at) == expected(frames[0])
    assert not at.exception


def test_link_restores_beam_search(open_page) -> None:
    query = dict(mode="Beam search", branches="3", prompt_len="20", block_size="8", step="4",
                 seed="2")
    cfg = BranchConfig(PoolConfig(num_blocks=32, block_size=8), mode="beam", num_branches=3,
                       prompt_len=20)
    frames = CopyOnWriteStory(cfg, 2).frames()
    at = open_page(**query)
    assert not at.exception
    assert metrics(at) == expected(frames[4])
    assert_link_keeps(at, query)


def test_pool_too_small_shows_a_message(open_page) -> None:
    at = open_page(branches="8", prompt_len="128", new_tokens="48", num_blocks="8")
    assert not at.exception
    assert "cannot run" in at.error[0].value and "the pool has 8" in at.error[0].value
    assert not figures(at)
