"""The figures are built without plotly's validation, so check they are already valid, canonical
plotly JSON (what plotly.js receives), and that they show what the engine says."""

from __future__ import annotations

import plotly.graph_objects as go
import pytest

from lab.figures.blocks import block_table_figure, pool_grid, token_strip
from lab.figures.common import STEP_LINE
from lab.figures.cow import memory_figure
from lab.figures.fragmentation import memory_maps, sweep_figure, timeline
from lab.figures.prefix import cache_over_time, hash_chain
from lab.figures.style import HIGHLIGHT_COLOR
from lab.memory.kv_pool import PoolConfig
from lab.scenarios import fragmentation
from lab.scenarios.block_tables import BlockTablesStory, WalkParams
from lab.scenarios.copy_on_write import BranchConfig, CopyOnWriteStory
from lab.scenarios.prefix_cache import PrefixCacheStory, PrefixConfig
from ui.layout import _scaled

PARAMS = WalkParams(PoolConfig(num_blocks=20, block_size=4, head_dim=16), prompt_len=6,
                    output_len=5, num_requests=3)


@pytest.fixture(scope="module")
def frame():
    return BlockTablesStory(PARAMS, 0).frames()[6]


def canonical(fig: go.Figure) -> dict:
    spec = fig.to_dict()
    spec["layout"].pop("template", None)
    return spec


def step_figures() -> dict[str, go.Figure]:
    """The step-driven figures of the fragmentation, copy-on-write and prefix-cache pages, at
    step 3 of their default runs."""
    cfg = fragmentation.FragConfig()
    story = fragmentation.FragmentationStory(cfg, 0)
    requests, frag = story.requests(), story.frames()
    cow = CopyOnWriteStory(BranchConfig(), 0).frames()
    prefix = PrefixCacheStory(PrefixConfig(), 0).frames()
    admission = next(a for f in prefix for a in f.admissions)
    bs = cfg.pool.block_size
    return {"memory_maps": memory_maps(frag[3], cfg.capacity, bs),
            "timeline": timeline(frag, 3),
            "sweep": sweep_figure(fragmentation.block_size_sweep(requests), bs),
            "cow_memory": memory_figure(cow, 3), "hash_chain": hash_chain(admission),
            "cache_over_time": cache_over_time(prefix, 3)}


@pytest.fixture(scope="module")
def page_figures() -> dict[str, go.Figure]:
    return step_figures()


@pytest.mark.parametrize("build", [token_strip, block_table_figure, pool_grid])
def test_figures_are_valid_plotly_as_built(frame, build) -> None:
    assert_canonical(build(frame.snapshot, frame.seq_names))


@pytest.mark.parametrize("name", ["memory_maps", "timeline", "sweep", "cow_memory", "hash_chain",
                                  "cache_over_time"])
def test_page_figures_are_valid_plotly_as_built(page_figures, name) -> None:
    assert_canonical(page_figures[name])


@pytest.mark.parametrize("name", ["timeline", "cow_memory", "cache_over_time"])
def test_over_time_figures_mark_the_step(page_figures, name) -> None:
    marks = [s for s in page_figures[name].layout.shapes if s.line.dash == STEP_LINE["dash"]]
    assert marks and all(s.x0 == s.x1 == 3 for s in marks)
    for mark in marks:  # on an axis that shows steps
        axis = page_figures[name].layout[mark.xref.replace("x", "xaxis")]
        assert axis.title.text == "step"


def assert_canonical(fig: go.Figure) -> None:
    validated = go.Figure(fig.to_dict())  # raises on an unknown property
    assert canonical(validated) == canonical(fig)  # no shorthand left for plotly.js to miss
    assert canonical(go.Figure(_scaled(fig, 1.5, 1.5).to_dict())) == canonical(
        _scaled(fig, 1.5, 1.5))


def test_block_table_cells_are_the_physical_ids(frame) -> None:
    fig = block_table_figure(frame.snapshot, frame.seq_names)
    for trace, seq in zip(fig.data, frame.snapshot.sequences):
        assert [int(t) for t in trace.text[0]] == list(seq.block_table)


def test_token_strip_marks_tokens_and_tail(frame) -> None:
    fig = token_strip(frame.snapshot, frame.seq_names)
    for trace, seq in zip(fig.data, frame.snapshot.sequences):
        cells = trace.z[0]
        assert len(cells) == len(seq.block_table) * PARAMS.pool.block_size
        assert sum(c == 2 for c in cells) == len(cells) - seq.num_tokens  # the unused tail


def test_pool_grid_labels_every_block_and_highlights(frame) -> None:
    table = frame.snapshot.sequences[0].block_table
    fig = pool_grid(frame.snapshot, frame.seq_names, highlight=table[:1],
                    highlight_labels={table[0]: "L0"})
    traces = {t.name: t for t in fig.data}
    texts = traces["labels"].text
    assert len(texts) == PARAMS.pool.num_blocks
    assert "L0" in texts[table[0]] and "A" in texts[table[0]]
    tiles = traces["tiles"]
    assert len(tiles.y) == PARAMS.pool.num_blocks
    assert list(tiles.marker.line.width).count(4) == 1  # the highlighted block
    assert tiles.marker.line.color[table[0]] == HIGHLIGHT_COLOR
    used = sum(b.state == "used" and b.filled > 0 for b in frame.snapshot.blocks)
    assert len(traces["filled slots"].x) == used  # one fill bar per block holding tokens


def test_classroom_scaling_leaves_the_original(frame) -> None:
    fig = token_strip(frame.snapshot, frame.seq_names)
    big = _scaled(fig, 2.0, 1.5)
    assert big.layout.font.size == 2 * fig.layout.font.size
    assert big.layout.height == int(1.5 * fig.layout.height)
    assert fig.layout.font.size == 15


def test_memory_map_rows_cover_the_whole_pool(page_figures) -> None:
    cfg = fragmentation.FragConfig()
    (bars,) = page_figures["memory_maps"].data  # one bar per segment, both rows
    for row in (0, 1):  # paged, contiguous: used, reserved or empty, and holes fill the pool
        spans = sorted((b, b + w) for y, b, w in zip(bars.y, bars.base, bars.x) if y == row)
        assert spans[0][0] == 0 and spans[-1][1] == cfg.capacity
        assert all(end == start for (_, end), (start, _) in zip(spans, spans[1:]))


def test_step_figures_say_in_words_what_this_step_shows(frame, page_figures) -> None:
    from lab.figures.alt_text import alt_text

    names, snap = frame.seq_names, frame.snapshot
    pool = alt_text(pool_grid(snap, names, highlight=[snap.sequences[0].block_table[0]]))
    for seq in snap.sequences:  # who holds which blocks, as the engine says
        blocks = ", ".join(map(str, seq.block_table))
        assert f"{names[seq.seq_id]} holds blocks {blocks} ({seq.num_tokens} tokens)" in pool
    assert f"{snap.usage.blocks_free} free" in pool and "Outlined at this step" in pool
    table = alt_text(block_table_figure(snap, names))
    first = snap.sequences[0]
    assert f"L0 to block {first.block_table[0]}" in table
    assert f"{first.num_tokens} tokens" in alt_text(token_strip(snap, names))
    assert "dotted line marks step 3" in alt_text(page_figures["timeline"])
    assert "Memory map at step 3" in alt_text(page_figures["memory_maps"])
    assert ": miss" in alt_text(page_figures["hash_chain"])
    # Any other figure is described from its title, axes and series.
    sweep = alt_text(page_figures["sweep"])
    assert sweep and sweep != "A chart."
