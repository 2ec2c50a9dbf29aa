""""Next event": each story's notable steps, read from its frames, are where the engine did the
thing the label names."""

from __future__ import annotations

from lab.scenarios import admission_control, attention, block_tables, copy_on_write
from lab.scenarios import unknown_ending as ending
from lab.scenarios.attention import AttentionConfig, AttentionStory
from lab.scenarios.block_tables import BlockTablesStory, WalkParams
from lab.scenarios.copy_on_write import BranchConfig, CopyOnWriteStory
from lab.serving.workloads import from_preset
from tests.scheduler_helpers import config, llama_h100


def test_block_tables_events_are_arrivals_new_blocks_and_departures() -> None:
    frames = BlockTablesStory(WalkParams(output_len=4), 0).frames()
    assert block_tables.event_steps(frames) == [
        (1, "A arrives"), (2, "B arrives"), (3, "C arrives"), (4, "new block (A)"),
        (6, "A leaves"), (8, "B leaves"), (10, "C leaves")]  # A's token 33 takes block 3


def test_attention_events_are_the_rescales_and_the_last_block() -> None:
    frames = AttentionStory(AttentionConfig(), 0).frames()
    events = attention.event_steps(frames)
    assert events[-1] == (len(frames) - 1, "last block read")
    for step, label in events[:-1]:
        s = frames[step].softmax
        assert label == f"rescale at L{step - 1}" and s[step - 1].running_max > \
            s[step - 2].running_max


def test_unknown_ending_events_are_the_moves_and_preemptions() -> None:
    story = ending.UnknownEndingStory(ending.EndingConfig(), 0)
    frames = story.frames()
    events = ending.event_steps(frames)
    moves = [(f.step, f"R{m.req_id} moves") for f in frames for m in f.logs["contiguous"].moves]
    assert [e for e in events if e[1] != "preemption"] == moves and moves
    assert all(frames[s].logs["contiguous"].preempted or frames[s].logs["paged"].preempted
               for s, label in events if label == "preemption")


def test_copy_on_write_events_are_the_copies_and_the_ends() -> None:
    frames = CopyOnWriteStory(BranchConfig(), 0).frames()
    events = copy_on_write.event_steps(frames, "parallel")
    assert events[0] == (1, "copy-on-write") and frames[1].v0.total_copies == 3
    ends = [s for s, label in events if label == "a branch ends"]
    assert all(len(frames[s].finished) > len(frames[s - 1].finished) for s in ends) and ends
    beam = copy_on_write.event_steps(CopyOnWriteStory(BranchConfig(mode="beam"), 0).frames(),
                                     "beam")
    assert {label for _, label in beam} == {"copy-on-write", "beams dropped"}


def test_admission_events_include_the_first_preemption_and_chunk() -> None:
    cfg = config(num_blocks=32, block_size=8, max_num_seqs=8, max_num_batched_tokens=64,
                 enable_prefix_caching=True)
    frames = admission_control.AdmissionControlStory(
        cfg, from_preset("alpaca", 8, seed=0, max_tokens=128), llama_h100(), 0).frames()
    events = admission_control.event_steps(frames)
    first = admission_control.next_preemption(frames, 0)
    assert (first.step, "preemption") in events
    chunk = admission_control.first_chunked_admission(frames, 8)
    assert (chunk.step, "chunked prefill") in events
    assert all(frames[s].record.preempted_ids for s, label in events if label == "preemption")
