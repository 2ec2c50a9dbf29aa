"""AppTest for the scheduler page and the serving-metrics page."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

from lab.scenarios.admission_control import AdmissionControlStory, next_preemption
from lab.serving.runs import card_sheet
from lab.serving.workloads import from_preset
from lab.sizing.model_spec import load_presets
from tests.page_helpers import figures
from tests.scheduler_helpers import config, llama_h100
from tests.test_vllm_metrics import CURRENT, LOG

PAGES = Path(__file__).resolve().parents[1] / "pages"


def run_page(name: str, query: dict[str, str] | None = None, timeout: float = 90) -> AppTest:
    at = AppTest.from_file(str(PAGES / name), default_timeout=timeout)
    at.query_params.update(query or {})
    return at.run()


def text(at: AppTest) -> str:
    parts = [str(e.value) for kind in ("markdown", "caption", "code", "error", "warning")
             for e in getattr(at, kind)]
    return "\n".join(parts)


def test_step_view_steps_and_explains() -> None:
    at = run_page("scheduler.py")
    assert not at.exception and not at.error
    assert "request 0 admitted" in at.code[0].value
    at.button(key="sched_step_forward").click().run()
    assert at.slider(key="sched_step").value == 1
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Step"] == "1"
    assert "Running" in text(at)


def test_preemption_is_explained_in_a_small_pool() -> None:
    query = {"step_blocks": "16", "step_block_size": "16", "step_requests": "10"}
    at = run_page("scheduler.py", query)
    assert not at.exception
    # The same run in the engine, to find the first iteration that preempted.
    cfg = config(num_blocks=16, block_size=16, max_num_seqs=8, max_num_batched_tokens=64)
    story = AdmissionControlStory(cfg, from_preset("alpaca", 10, seed=0, max_tokens=128),
                                  llama_h100(), 0)
    first = next(f.record.index for f in story.frames() if f.record.preemptions)
    at.slider(key="sched_step").set_value(first).run()
    assert "preempted by recompute: no free block" in at.code[0].value


def test_contiguous_step_view_and_rejection_message() -> None:
    at = run_page("scheduler.py", {"sched_allocator": "contiguous"})
    assert not at.exception and not at.error
    at = run_page("scheduler.py", {"step_blocks": "4", "step_block_size": "1"})
    assert "Every request was rejected" in text(at)


def test_replay_and_chain_sections() -> None:
    query = {"sched_view": "Replay & metrics", "big_workload": "Alpaca-like (synthetic)",
             "big_requests": "40", "big_max_tokens": "128", "big_blocks": "64"}
    at = run_page("scheduler.py", query)
    assert not at.exception and not at.error
    labels = [m.label for m in at.metric]
    assert "paged: throughput" in labels and "contiguous: throughput" in labels
    assert len(at.dataframe) == 1
    assert {"sched_latency", "sched_series"} <= set(figures(at))  # TTFT and ITL drawn
    blocks = card_sheet(load_presets()["Llama-3.1-8B"], "H100 80 GB", 16).num_blocks
    assert f"Pool: {blocks:,} blocks of 16 tokens" in text(at)  # the card's, not big_blocks
    assert any(c.value.endswith(f"· {blocks:,} blocks") for c in at.caption)
    assert not at.warning
    at = run_page("scheduler.py", {**query, "sched_card_pool": "0"})
    assert "A small pool:** 64 blocks, 0% of the 28,020" in at.warning[0].value
    at = run_page("scheduler.py", {**query, "sched_view": "Batch chain"})
    assert not at.exception
    assert "The chain and its verdict held back" in text(at)  # predict first
    at.button(key="sched_chain_link_show").click().run()
    verdicts = [e.value for e in [*at.success, *at.warning]]
    assert any(v.startswith(("The chain held", "Link ", "Only ")) for v in verdicts)
    assert "engine says" in at.info[0].value


def test_the_chain_example_weakens_at_link_4() -> None:
    from ui.scheduler_runs import CHAIN_EXAMPLE

    query = {name: str(value) for name, value in CHAIN_EXAMPLE.items()}
    at = run_page("scheduler.py", {**query, "sched_view": "Batch chain"}, timeout=300)
    at.button(key="sched_chain_link_show").click().run()
    assert not at.exception
    assert "A small pool:** 2,000 blocks" in at.warning[0].value  # the example's own pool
    assert "Link 4 weakens" in at.warning[1].value
    assert "4. more throughput" in at.info[0].value


def test_bad_csv_shows_row_errors() -> None:
    at = run_page("scheduler.py", {"step_workload": "Your CSV upload"})
    assert not at.exception
    assert "Upload a CSV" in "\n".join(str(e.value) for e in at.info)


def test_serving_metrics_page_reads_pasted_text_and_log() -> None:
    at = run_page("serving_metrics.py")
    assert not at.exception
    at.text_area(key="vllm_metrics_text").input(CURRENT).run()
    values = {m.label: m.value for m in at.metric}
    assert values["KV-cache usage"] == "62%"
    assert values["Running / waiting"] == "12 / 5"
    at.text_area(key="vllm_log_text").input(LOG).run()
    assert not at.exception
    table = at.table[-1].value
    engine = dict(zip(table["quantity"], table["engine log"], strict=True))
    assert (engine["num_gpu_blocks"], engine["GPU KV cache size (tokens)"]) == (
        "27,901", "446,416")
    # 53.52 GiB of Llama-3.1-8B K/V (128 KiB per token) in 16-token blocks of 2 MiB each: the
    # log's two decimals (53.515 to 53.525 GiB) leave room for 27,399 to 27,404 blocks.
    sheet = dict(zip(table["quantity"], table["sheet from the log's KV memory"], strict=True))
    assert sheet["num_gpu_blocks"] == "27,399 – 27,404"
    at.text_area(key="vllm_metrics_text").input("not metrics at all").run()
    assert "not a Prometheus sample" in text(at)


def test_compute_mode_shows_the_kernel_error() -> None:
    at = run_page("scheduler.py", {"step_requests": "2", "step_max_tokens": "8"})
    at.toggle(key="sched_compute").set_value(True).run()
    assert not at.exception and not at.warning
    assert "Kernel = dense attention" in text(at)
    at = run_page("scheduler.py", {"step_requests": "40"})
    at.toggle(key="sched_compute").set_value(True).run()
    assert "Showing the allocator-only run instead" in text(at)


def test_sweeps_run_on_request() -> None:
    query = {"sched_view": "Sweeps", "big_workload": "Alpaca-like (synthetic)",
             "big_requests": "30", "big_max_tokens": "64", "big_blocks": "64",
             "sched_card_pool": "0"}
    at = run_page("scheduler.py", query)
    assert not at.exception and not figures(at)
    at.button(key="sched_sweep_bs").click().run()
    at.button(key="sched_sweep_pool").click().run()
    assert not at.exception
    assert list(figures(at)) == ["sched_bs_fig", "sched_pool_fig"]  # the two sweeps
    lines = {t["name"] for t in figures(at)["sched_pool_fig"]["data"]}
    assert lines == {"contiguous, V1", "paged, V1", "paged, V0 swap"}  # V0 beside V1


def test_the_victim_is_asked_the_iteration_before_it_is_preempted() -> None:
    query = {"step_blocks": "16", "step_block_size": "16", "step_requests": "10"}
    cfg = config(num_blocks=16, block_size=16, max_num_seqs=8, max_num_batched_tokens=64,
                 enable_prefix_caching=True)  # the step view's default, as vLLM V1's
    frames = AdmissionControlStory(cfg, from_preset("alpaca", 10, seed=0, max_tokens=128),
                                   llama_h100(), 0).frames()
    coming = next_preemption(frames, 0)
    at = run_page("scheduler.py", {**query, "sched_step": str(coming.step - 1)})
    if "sched_chunk_guess" in {n.key for n in at.number_input}:  # the chunk question, first
        at.button(key="sched_chunk_show").click().run()
    # Offered by id (the running list's order, which decides, is in the question's text), and
    # the queues held back while it is open: the screen does not answer it.
    assert at.radio(key="sched_victim_guess").options == [f"R{i}"
                                                          for i in sorted(coming.candidates)]
    assert "in the order the scheduler admitted them: " + ", ".join(
        f"R{i}" for i in coming.candidates) in text(at)
    assert "decisions held back" not in text(at)  # nothing of the answer is on screen yet
    assert "The queues held back" in text(at)
    at.slider(key="sched_step").set_value(coming.step).run()
    assert "The scheduler's decisions held back" in text(at)  # the answer step, unanswered
    at.radio(key="sched_victim_guess").set_value(f"R{coming.victim}")
    at.button(key="sched_victim_check").click().run()
    assert at.success[0].value.startswith(f"Right: **R{coming.victim}**")
    assert "held back" not in text(at)
    assert f"request {coming.victim} preempted" in at.code[0].value
    at.slider(key="sched_step").set_value(coming.step + 1).run()  # closed: asked once only
    assert "sched_victim_guess" not in {r.key for r in at.radio}
    assert at.button(key="sched_step_next_event").label.startswith("Next: ")


def test_priorities_offer_priority_preemption_and_the_watermark_is_a_setting() -> None:
    at = run_page("scheduler.py")
    assert at.get("button_group")[-1].proto.options[-1].content != "priority"  # one class
    at = run_page("scheduler.py", {"step_urgent": "25", "step_policy": "priority",
                                   "step_watermark": "10"})
    assert not at.exception and not at.error
    assert "Admission keeps 4 of 48 blocks free" in next(
        m for m in at.metric if m.label == "Preemptions").help


def test_the_chunk_question_is_asked_first_and_v0_runs_beside_v1() -> None:
    at = run_page("scheduler.py")
    assert not at.exception and not at.error
    question = at.number_input(key="sched_chunk_guess")
    assert question is not None and "held back" in text(at)  # the pool waits for the answer
    at.number_input(key="sched_chunk_guess").set_value(2)
    at.button(key="sched_chunk_check").click().run()
    assert at.success[0].value.startswith("Right: **2**")  # 9 of 17 tokens: 2 blocks of 8
    assert "vLLM V0 took all 3 at admission" in at.success[0].value
    assert {"sched_grid", "sched_grid_other"} <= set(figures(at))
    page = text(at)
    assert "vLLM V0 (the paper, 2023)" in page and "Which engine swaps" in page
    assert any("finds its own block(s)" in i.value for i in at.info)  # a re-admission's hit


def test_replay_compares_vllm_v1_with_v0_on_request() -> None:
    query = {"sched_view": "Replay & metrics", "big_workload": "Alpaca-like (synthetic)",
             "big_requests": "40", "big_max_tokens": "64", "big_blocks": "24",
             "sched_card_pool": "0"}
    at = run_page("scheduler.py", query)
    assert not at.exception and not at.error
    at.button(key="sched_engines_run").click().run()
    assert not at.exception and not at.error
    latency = figures(at)["sched_engines_latency"]
    names = {t["name"] for t in latency["data"] if t["mode"] == "lines"}
    assert names == {"vLLM V1 (0.33)", "vLLM V0 (the paper, 2023)"}
    axes = [latency["layout"][a]["title"]["text"] for a in ("xaxis", "xaxis2")]
    assert axes == ["seconds (simulated)", "milliseconds (simulated)"]  # TTFT s, ITL ms
    table = at.dataframe[-1].value
    assert list(table["engine"]) == ["vLLM V1 (0.33)", "vLLM V0 (the paper, 2023)"]
    v1, v0 = (table.iloc[i] for i in range(2))
    assert v1["swapped MiB"] == 0 and v1["preemptions"] > 0  # V1 recomputes only
    assert v0["swapped MiB"] > 0  # V0 swaps by default here
    assert v1["by swap"] == 0 and v0["by swap"] == v0["preemptions"]
