"""The Fragmentation page from the entry point: counters follow the engine, links restore."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest

from lab.memory.kv_pool import PoolConfig
from lab.scenarios.fragmentation import FragConfig, FragmentationStory, run_waste
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


def test_a_finished_side_says_so_and_the_end_gives_the_waste_over_the_run(open_page) -> None:
    frames = list(FragmentationStory(FragConfig(), 0).frames())
    paged_done = next(f.step for f in frames if f.paged.finished == 12)
    at = open_page(step=str(paged_done + 8))  # contiguous still serving, paged done
    shown = metrics(at)
    assert shown["Wasted: paged"] == f"{round(run_waste(frames, 'paged'))}% avg"
    assert shown["Wasted: contiguous"].endswith("%") and "avg" not in shown["Wasted: contiguous"]
    notes = [a["text"] for a in figures(at)["frag_map"]["layout"]["annotations"]]
    assert any(f"finished at step {paged_done}; every block is back" in t for t in notes)
    last = len(frames) - 1
    at.slider(key="step").set_value(last).run()
    shown = metrics(at)
    waste = {name: round(run_waste(frames, name)) for name in ("contiguous", "paged")}
    assert shown["Wasted: contiguous"] == f"{waste['contiguous']}% avg"
    assert shown["Wasted: paged"] == f"{waste['paged']}% avg"
    assert waste["contiguous"] > waste["paged"] > 0  # not 0% / 0% of an empty pool
    delta = next(m for m in at.metric if m.label == "Wasted: paged").delta
    assert delta == f"{waste['paged'] - waste['contiguous']:+d} points over the run"
    notes = [a["text"] for a in figures(at)["frag_map"]["layout"]["annotations"]]
    assert sum("back in the free pool" in t for t in notes) == 2  # both rows say so
    assert "every reservation and every block is back in the free pool" in " ".join(
        m.value for m in at.markdown)


def test_the_block_size_question_names_what_it_needs_and_endorses_no_size(open_page) -> None:
    at = open_page()
    question = next(r for r in at.radio if r.key == "frag_doubling_guess")
    assert not any(option.isdigit() for option in question.options)  # not "pick a size"
    text = " ".join(m.value for m in at.markdown)
    assert "prompt (16-96 tokens)" in text and "one to 160 output tokens" in text
    assert "from 16 to 32" in text
    at.button(key="frag_doubling_show").click().run()
    said = " ".join(i.value for i in at.info)
    assert "entries about halve, the empty tail about doubles" in said
    assert "no universal block size" in said
    assert "5.3 → 2.9 entries" in said  # the engine's numbers for this workload


def test_requests_past_the_palette_are_striped_not_repeated(open_page) -> None:
    at = open_page(step="20")
    bars = figures(at)["frag_map"]["data"][0]
    looks = {}
    for hover, color, pattern in zip(bars["hovertext"], bars["marker"]["color"],
                                     bars["marker"]["pattern"]["shape"]):
        if hover.startswith("R") and "stored" in hover:
            looks[hover.split(":")[0]] = (color, pattern)
        elif "of R" in hover and "filled" in hover:
            looks[hover.split("of ")[1].split(":")[0]] = (color, pattern)
    assert {"R3", "R11"} <= set(looks)  # both on the map at step 20
    assert len(set(looks.values())) == len(looks)  # no two requests alike
    assert looks["R11"][0] == looks["R3"][0] and looks["R11"][1] and not looks["R3"][1]
