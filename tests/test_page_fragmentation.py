"""The Fragmentation page from the entry point: counters follow the engine, links restore."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest

from lab.memory.kv_pool import PoolConfig
from lab.scenarios.fragmentation import FragConfig, FragmentationStory
from tests.page_helpers import assert_link_keeps, figures, metrics

PAGE = "pages/fragmentation.py"


def expected(frame, total: int = 12) -> dict[str, str]:
    c, p = frame.contiguous, frame.paged
    return {"Finished: contiguous": f"{c.finished} / {total}",
            "Finished: paged": f"{p.finished} / {total}",
            "Wasted: contiguous": f"{round(100 * (c.internal + c.external) / c.capacity)}%",
            "Wasted: paged": f"{round(100 * (p.internal + p.external) / p.capacity)}%"}


def badges(at: AppTest) -> list[str]:
    return [m.value for m in at.markdown if "badge[" in m.value]


def test_step_back_reset_follow_the_engine(open_page) -> None:
    frames = FragmentationStory(FragConfig(), 0).frames()
    at = open_page()
    assert not at.exception and not at.error
    assert metrics(at) == expected(frames[0])
    assert at.slider(key="step").max == len(frames) - 1
    for step in (1, 2):
        at.button(key="step_forward").click().run()
        assert metrics(at) == expected(frames[step])
    assert badges(at) and badges(at)[0].startswith(":green-badge[")
    at.button(key="step_back").click().run()
    assert metrics(at) == expected(frames[1])
    at.slider(key="step").set_value(40).run()  # scrub
    assert metrics(at) == expected(frames[40])
    done = next(f.step for f in frames if f.paged.finished == 12)
    at.slider(key="step").set_value(done).run()  # paged has drained: no waste comparison
    assert f"Paged finished all 12 requests at step {done}" in " ".join(
        c.value for c in at.caption)
    assert not next(m for m in at.metric if m.label == "Wasted: paged").delta
    at.button(key="step_reset").click().run()
    assert metrics(at) == expected(frames[0])
    assert not at.exception


def test_link_restores_the_same_state(open_page) -> None:
    query = dict(block_size="8", requests="10", max_output="200", step="15", seed="3")
    cfg = FragConfig(PoolConfig(num_blocks=768 // 8, block_size=8), num_requests=10,
                     max_output=200)
    frames = FragmentationStory(cfg, 3).frames()
    first = open_page(**query)
    assert not first.exception
    assert metrics(first) == expected(frames[15], total=10)
    assert first.slider(key="step").value == 15
    assert_link_keeps(first, query)


def test_impossible_settings_show_a_message(open_page) -> None:
    at = open_page(pool_slots="128", max_output="1000")
    assert not at.exception
    assert "cannot run" in at.error[0].value and "holds only 128" in at.error[0].value
    assert not figures(at)


def test_a_setting_that_changes_the_run_keeps_the_step(open_page) -> None:
    at = open_page(step="40")
    last = at.slider(key="step").max
    at.number_input(key="max_output").set_value(200).run()  # a longer run: a new slider range
    assert at.slider(key="step").max != last
    assert at.slider(key="step").value == 40
