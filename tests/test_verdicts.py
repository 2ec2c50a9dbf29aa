"""Every verdict a page prints beside its numbers, fed the cases on both sides of its thresholds."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lab.scenarios.fragmentation import (
    FragConfig,
    FragmentationStory,
    MemoryStats,
    comparable,
    finish_steps,
    finish_verdict,
)
from lab.serving.chain import CARRIES, LESS_WASTE, MORE_LIVE, ChainRow, chain_verdict

CONTIGUOUS = ChainRow("contiguous", waste_share=0.40, live_seqs=10.0, batch_seqs=10.0,
                      throughput=1000.0, prefill_share=0.1, best_max_num_seqs=64,
                      compute_bound_share=0.0, iteration_s=0.02, summary=None)


def paged(**links) -> ChainRow:
    """A paged row that carries every gain (5x) unless a link is given."""
    row = ChainRow("paged", waste_share=0.05, live_seqs=50.0, batch_seqs=50.0,
                   throughput=5000.0, prefill_share=0.1, best_max_num_seqs=256,
                   compute_bound_share=0.0, iteration_s=0.02, summary=None)
    return replace(row, **links)


def test_the_chain_holds_when_every_link_carries_its_gain() -> None:
    verdict = chain_verdict(CONTIGUOUS, paged())
    assert (verdict.kind, verdict.link) == ("held", None)
    assert "5.0× the live sequences" in verdict.text and "5.0× the throughput" in verdict.text


@pytest.mark.parametrize("saved, link", [(LESS_WASTE - 0.01, 1), (LESS_WASTE + 0.01, None)])
def test_link_1_less_waste(saved: float, link: int | None) -> None:
    verdict = chain_verdict(CONTIGUOUS, paged(waste_share=CONTIGUOUS.waste_share - saved))
    assert verdict.link == link


@pytest.mark.parametrize("live, link", [(MORE_LIVE - 0.05, 2), (MORE_LIVE + 0.05, None)])
def test_link_2_more_live_sequences(live: float, link: int | None) -> None:
    n = CONTIGUOUS.live_seqs * live
    verdict = chain_verdict(CONTIGUOUS, paged(live_seqs=n, batch_seqs=n,
                                              throughput=CONTIGUOUS.throughput * live))
    assert verdict.link == link


@pytest.mark.parametrize("share, link", [(CARRIES - 0.05, 3), (CARRIES + 0.05, None)])
def test_link_3_bigger_batches(share: float, link: int | None) -> None:
    batch = 50.0 * share  # of paged's 5x live sequences
    verdict = chain_verdict(CONTIGUOUS, paged(batch_seqs=batch, throughput=100.0 * batch))
    assert verdict.link == link


@pytest.mark.parametrize("share, link", [(CARRIES - 0.05, 4), (CARRIES + 0.05, None)])
def test_link_4_throughput(share: float, link: int | None) -> None:
    verdict = chain_verdict(CONTIGUOUS, paged(throughput=5000.0 * share,
                                              iteration_s=0.02 / share))
    assert verdict.link == link
    if link == 4:  # the verdict's numbers are the ones beside it
        assert f"{5 * share:.1f}× the throughput" in verdict.text
        assert f"took {1 / share:.1f}× as long" in verdict.text


@pytest.mark.parametrize("bound, cause", [(0.6, "mostly compute-bound (60% compute-bound"),
                                          (0.11, "mostly memory-bound (11% compute-bound")])
def test_link_4_names_the_cause_its_numbers_show(bound: float, cause: str) -> None:
    # The case: 5.2x the sequences, 4.1x the throughput, compute-bound 11% of the time
    # must not be blamed on compute.
    verdict = chain_verdict(CONTIGUOUS, paged(throughput=5000.0 * 0.7, iteration_s=0.02 / 0.7,
                                              compute_bound_share=bound))
    assert verdict.link == 4 and cause in verdict.text


def test_no_target_and_only_one_allocator_meeting_it() -> None:
    missed = dict(best_max_num_seqs=None, throughput=0.0)
    assert chain_verdict(replace(CONTIGUOUS, **missed), paged(**missed)).kind == "no_target"
    only_paged = chain_verdict(replace(CONTIGUOUS, **missed), paged())
    assert only_paged.kind == "held" and only_paged.text.startswith("Only paged met")
    only_contiguous = chain_verdict(CONTIGUOUS, paged(**missed))
    assert (only_contiguous.kind, only_contiguous.link) == ("weak", 4)


# -- fragmentation: when each allocator finished, and like with like ---------------------------

def stats(running: int, finished: int = 0) -> MemoryStats:
    return MemoryStats(capacity=768, used=10 * running, internal=5 * running, free=700,
                       external=0, running=running, waiting=0, finished=finished)


@pytest.mark.parametrize("step, expected", [
    (75, ""),  # nobody done yet: nothing to say
    (76, "Paged finished all 12 requests at step 76; contiguous is still serving (it finishes "
         "at step 143)."),
    (143, "Paged finished all 12 requests at step 76, contiguous at step 143: paged needed 53% "
          "of the steps."),
])
def test_finish_verdict_on_both_sides_of_each_finish(step: int, expected: str) -> None:
    verdict = finish_verdict(step, {"contiguous": 143, "paged": 76}, 12)
    assert verdict.startswith(expected) if expected else verdict == ""


def test_finish_verdict_when_contiguous_is_first_or_never_finishes() -> None:
    assert finish_verdict(50, {"contiguous": 50, "paged": 60}, 4).startswith(
        "Contiguous finished all 4 requests at step 50; paged is still serving")
    assert "it has not finished" in finish_verdict(50, {"contiguous": None, "paged": 40}, 4)
    assert finish_verdict(9, {"contiguous": 9, "paged": 9}, 4) == \
        "Both finished all 4 requests at step 9."


@pytest.mark.parametrize("c_running, p_running, same", [(3, 2, True), (3, 0, False),
                                                        (0, 2, False), (0, 0, False)])
def test_waste_is_compared_only_while_both_hold_requests(c_running, p_running, same) -> None:
    assert comparable(stats(c_running), stats(p_running)) is same


def test_finish_steps_reads_the_frames() -> None:
    story = FragmentationStory(FragConfig(), 0)
    frames = story.frames()
    at = finish_steps(frames, len(story.requests()))
    assert at["paged"] is not None and at["contiguous"] is not None
    assert frames[at["paged"]].paged.finished == len(story.requests())
    assert frames[at["paged"] - 1].paged.finished < len(story.requests())
