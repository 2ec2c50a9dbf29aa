"""The lesson that travels (lab/figures/lesson.py): one HTML file holding plotly.js, every step's
figures, caption and kernel check, and the questions, loading nothing from a network; and the
pages' "Download this lesson", which builds it for their default stories within 5 MB."""

from __future__ import annotations

import base64
import gzip
import json
import re

import pytest

from lab.figures.blocks import pool_grid
from lab.figures.lesson import (
    MAX_LESSON_BYTES,
    PLOTLY_JS,
    Lesson,
    LessonQuestion,
    LessonStep,
    LessonTooLarge,
    StepView,
    lesson_html,
)
from lab.scenarios.block_tables import BlockTablesStory, WalkParams

HOSTILE = "</script><script>window.broken = true</script><!-- A & B"


def walk_lesson(extra_caption: str = "") -> tuple[Lesson, tuple]:
    story = BlockTablesStory(WalkParams(), 0)
    frames = story.frames()
    steps = [LessonStep(StepView({"pool": pool_grid(f.snapshot, f.seq_names)},
                                 [*story.caption(f), extra_caption] if extra_caption
                                 else story.caption(f),
                                 {"Blocks in use": str(f.snapshot.usage.blocks_used)}),
                        f"check at step {f.step}", True) for f in frames]
    question = LessonQuestion("How many blocks does A hold at step 1?", 2, "30 / 16, up.", 1)
    return Lesson(story.page, "Block tables", "seed 0", steps, [question]), frames


def unpacked(page: str) -> dict:
    data = re.search(r'<script id="lesson-data" type="text/plain">([^<]*)</script>', page)
    return json.loads(gzip.decompress(base64.b64decode(data.group(1))))


def scripts(page: str) -> list[str]:
    return re.findall(r"<script[^>]*>(.*?)</script>", page, flags=re.DOTALL)


def test_the_file_holds_every_step_its_caption_check_and_question() -> None:
    lesson, frames = walk_lesson()
    data = unpacked(lesson_html(lesson))
    assert len(data["steps"]) == len(frames) > 5
    for step, frame in zip(data["steps"], frames, strict=True):
        assert step["caption"] == BlockTablesStory(WalkParams(), 0).caption(frame)
        assert step["check"] == {"text": f"check at step {frame.step}", "ok": True}
        assert step["counters"] == [["Blocks in use", str(frame.snapshot.usage.blocks_used)]]
        assert step["figures"]["pool"]["data"] and step["figures"]["pool"]["layout"]
    assert data["steps"][1]["figures"] != data["steps"][2]["figures"]
    assert data["questions"] == [{"text": "How many blocks does A hold at step 1?", "answer": 2,
                                  "explanation": "30 / 16, up.", "reveal": 1, "choices": None,
                                  "holds": [], "until": None}]


def test_plotly_js_is_inlined_and_nothing_comes_from_a_network() -> None:
    page = lesson_html(walk_lesson()[0])
    plotly_js = PLOTLY_JS.read_text()
    assert plotly_js[:2000] in page and plotly_js[-2000:] in page  # the installed copy, whole
    assert len(scripts(page)) == 3  # the data, plotly.js, the player: no script from elsewhere
    # Outside plotly.js (whose text names URLs of features a lesson never uses) nothing that
    # loads and no address at all: not in the page, the player, or the data.
    rest = page.replace(scripts(page)[1], "")
    assert not re.search(r"<(link|img|iframe|object|embed)\b", rest)
    assert not re.search(r"\bsrc\s*=", rest)
    assert not re.search(r"https?:", rest)
    assert "http" not in json.dumps(unpacked(page))
    assert "default-src 'none'" in page  # and the browser is told to load nothing else


def test_a_caption_with_a_closing_script_tag_stays_text() -> None:
    page = lesson_html(walk_lesson(HOSTILE)[0])
    assert "window.broken" not in page  # packed, it is not even text an HTML parser reads
    assert page.count("</script>") == 3
    assert unpacked(page)["steps"][3]["caption"][-1] == HOSTILE


def test_a_lesson_past_its_limit_is_refused_with_its_size() -> None:
    lesson = walk_lesson()[0]
    assert len(lesson_html(lesson).encode()) < MAX_LESSON_BYTES
    with pytest.raises(LessonTooLarge, match="MB"):
        lesson_html(lesson, max_bytes=1_000_000)
    with pytest.raises(ValueError, match="at least one step"):
        lesson_html(Lesson("block_tables", "t", "s", []))


# -- the pages: their default story's lesson, built on one click, within the limit -------------
PAGES = ["block_tables", "attention", "fragmentation", "prefix_cache", "unknown_ending",
         "copy_on_write", "scheduler"]


@pytest.mark.parametrize("page", PAGES)
def test_each_page_builds_its_default_lesson_within_five_megabytes(open_app_page,
                                                                  page: str) -> None:
    at = open_app_page(f"pages/{page}.py")
    assert not at.exception
    assert not [b for b in at.get("download_button") if "lesson" in b.proto.label]
    at.button(key=f"{page}_lesson_build").click().run(timeout=600)
    assert not at.exception and not at.warning
    save = [b for b in at.get("download_button") if b.proto.label.startswith("Save the lesson")]
    assert len(save) == 1
    megabytes = float(re.search(r"\(([\d.]+) MB", save[0].proto.label).group(1))
    assert 4.8 <= megabytes <= MAX_LESSON_BYTES / 1e6  # plotly.js alone is 4.8 MB


def test_a_built_lesson_stays_ready_while_stepping_and_a_new_setting_asks_again(
        open_app_page) -> None:
    def offered(at) -> list[str]:
        return ([b.proto.label for b in at.get("download_button") if "lesson" in b.proto.label]
                + [b.label for b in at.button if b.key == "block_tables_lesson_build"])

    at = open_app_page("pages/block_tables.py")
    assert offered(at) == ["Download this lesson"]
    at.button(key="block_tables_lesson_build").click().run(timeout=600)
    at.button(key="step_forward").click().run()
    assert len(offered(at)) == 1 and offered(at)[0].startswith("Save the lesson")
    assert not at.get("progress")  # nothing was built again for this Step
    at.number_input(key="num_blocks").set_value(32).run()
    assert offered(at) == ["Download this lesson"]  # another story: another lesson
