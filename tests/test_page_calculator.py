"""AppTest for the KV-size calculator page: presets, pasted real configs, both capacity sheets,
extreme input, shared links."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs

import pytest
from streamlit.testing.v1 import AppTest

from lab.sizing.model_spec import load_presets
from tests.test_kv_formula import GOLDEN_BYTES_PER_TOKEN

PAGE = str(Path(__file__).resolve().parents[1] / "pages" / "calculator.py")
CONFIGS = Path(__file__).resolve().parent / "data" / "configs"
PLAIN, VLLM = 1, 2  # the tables after the KV-size table: the guide's sheet, vLLM's sheet


def run_page(query: dict[str, str] | None = None) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.query_params.update(query or {})
    return at.run()


def latex(at: AppTest) -> str:
    return "\n".join(element.value for element in at.latex)


def messages(at: AppTest, kind: str = "error") -> str:
    return "\n".join(str(element.value) for element in getattr(at, kind))


def shared_link(at: AppTest) -> dict[str, str]:
    """The sidebar's "copy link" URL, parsed."""
    url = at.sidebar.code[0].value  # (the class-link panel's comes after it)
    return {k: v[0] for k, v in parse_qs(url.split("?", 1)[1]).items()}


def paste(at: AppTest, file: str) -> AppTest:
    at.text_area(key="config_text").input((CONFIGS / file).read_text())
    return at.button(key="config_read").click().run()


def vllm_values(at: AppTest) -> dict[str, str]:
    sheet = at.table[VLLM].value
    return dict(zip(sheet["step"].tolist(), sheet["value"].tolist(), strict=True))


def test_default_page_renders_the_formula_and_both_sheets() -> None:
    at = run_page()
    assert not at.exception and not at.error
    assert "131{,}072" in latex(at)  # Llama-3.1-8B: 2 x 32 x 8 x 128 x 2
    sheet = at.table[PLAIN].value
    assert "maximum concurrency for 8,192 tokens" in sheet["step"].tolist()
    assert sheet["value"].tolist()[6] == "28,020"  # the guide's formula from nvidia-smi's total
    values = vllm_values(at)  # tests/test_vllm_sheet.py works these out by hand
    assert values["num_gpu_blocks = available // page_size // layers per group"] == "27,807"
    assert values["Maximum concurrency for 131,072 tokens per request"] == "3.39x"
    assert "get_num_blocks" in at.table[VLLM].value["vLLM source"].tolist()
    assert "GPU KV cache size: 444,912 tokens" in at.code[0].value
    assert "what CUDA reports" in messages(at, "markdown")
    link = at.get("link_button")[0].proto.url
    assert link.startswith("block_tables?") and "block_size=16" in link and "num_blocks=" in link
    assert "scale 1:" in messages(at, "caption")


def test_each_preset_fills_the_fields_and_the_formula() -> None:
    at = run_page()
    for name in sorted(GOLDEN_BYTES_PER_TOKEN):
        at.selectbox(key="model").set_value(name).run()
        assert not at.exception, name
        # The only complaints: models whose weights alone exceed one H100.
        assert all("no room for any KV block" in e.value or "vLLM would stop" in e.value
                   for e in at.error), name
        spec = load_presets()[name]
        assert at.number_input(key="layers").value == spec.num_layers
        assert at.number_input(key="sliding_layers").value == spec.num_sliding_layers
        assert f"{GOLDEN_BYTES_PER_TOKEN[name]:,}".replace(",", "{,}") in latex(at), name


def test_fields_stay_editable_after_a_preset() -> None:
    at = run_page()
    at.selectbox(key="model").set_value("Llama-3.1-70B").run()
    at.number_input(key="kv_heads").set_value(16).run()
    assert at.selectbox(key="model").value == "Llama-3.1-70B"
    assert "655{,}360" in latex(at)  # 2 x 80 x 16 x 128 x 2
    assert "edited: KV heads" in messages(at, "caption")


def test_pasted_config_fills_the_fields() -> None:
    at = paste(run_page(), "gemma-2-9b.json")
    assert not at.exception and not at.error
    assert at.selectbox(key="model").value == "Custom"
    assert at.number_input(key="head_dim").value == 256
    assert at.number_input(key="sliding_layers").value == 21
    assert "344{,}064" in latex(at)
    captions = messages(at, "caption")
    assert "sliding_window_pattern absent: gemma2's default 2" in captions
    assert "loads float32 checkpoints in bfloat16" in captions
    assert at.selectbox(key="weight_dtype").value == "bf16"  # not fp32


def test_the_issues_three_configs_pasted_as_published() -> None:
    at = paste(run_page(), "falcon-7b.json")
    assert not at.exception and not at.error
    assert at.number_input(key="kv_heads").value == 1  # multi_query: one KV head
    assert "8{,}192" in latex(at) and "multi_query: true" in messages(at, "caption")
    assert at.number_input(key="max_model_len").value == 2048
    at = paste(at, "gemma-3-27b-it.json")
    assert (at.number_input(key="sliding_layers").value, at.number_input(key="window").value) \
        == (52, 1024)
    assert "1{,}107{,}296{,}256" in latex(at)  # 8k tokens: 10 full + 52 sliding layers
    assert "7 × 10: 1 full attention, 6 sliding window (8 padding slots)" in vllm_values(
        at).values()
    at = paste(at, "deepseek-v3.json")
    assert "70{,}272" in latex(at) and at.selectbox(key="weight_dtype").value == "fp8"
    assert "Tensor parallel 16 would leave room" in messages(at)  # 627 GiB on one H100
    at.selectbox(key="gpu").set_value("H200 141 GB").run()
    at.selectbox(key="tp").set_value(8).run()
    assert not at.exception and not at.error
    values = vllm_values(at)
    # The pasted file's parameters are the estimate, 671.03 B (the preset's 671 B gives
    # 10,857 blocks in tests/test_vllm_sheet.py): 26 M more fp8 weights, one block fewer.
    assert values["GPU KV cache size = blocks // groups × block_size"] == "694,784 tokens"
    assert values["Maximum concurrency for 163,840 tokens per request"] == "4.24x"
    assert "FlashMLA" in messages(at, "caption")


@pytest.mark.parametrize(("text", "words"), [
    ("[" * 100_000, "nested deeper"),
    ('{"num_hidden_layers": "many"}', "num_hidden_layers"),
    ("{oops", "not JSON"),
    ('{"num_hidden_layers": ' + "9" * 3000 + "}", "too large"),
])
def test_bad_pasted_config_says_what_is_wrong(text: str, words: str) -> None:
    at = run_page()
    at.text_area(key="config_text").input(text)
    at.button(key="config_read").click().run()
    assert not at.exception
    assert words in messages(at)
    assert at.number_input(key="layers").value == 32  # the fields are left as they were


def test_inconsistent_fields_get_a_message_not_a_traceback() -> None:
    at = run_page()
    at.number_input(key="kv_heads").set_value(3).run()
    assert not at.exception
    assert "do not divide 32 attention heads" in messages(at)
    at.number_input(key="kv_heads").set_value(8).run()
    at.number_input(key="sliding_layers").set_value(5).run()
    assert "window above 0" in messages(at)


def test_extreme_inputs_render() -> None:
    at = run_page()
    for key, value in [("layers", 1000), ("heads", 10_000), ("kv_heads", 10_000),
                       ("head_dim", 16_384), ("context", 10_000_000), ("batch", 1_000_000),
                       ("max_pos", 1)]:
        at.number_input(key=key).set_value(value).run()
    at.selectbox(key="kv_dtype").set_value("int4").run()
    at.selectbox(key="tp").set_value(64).run()
    assert not at.exception
    assert "no room for any KV block" not in messages(at)  # 8 B params still fit
    at.selectbox(key="model").set_value("Llama-3.1-405B").run()
    at.selectbox(key="tp").set_value(1).run()
    at.selectbox(key="gpu").set_value("L4").run()
    assert not at.exception
    assert "no room for any KV block" in messages(at)


def test_walkthrough_link_keeps_to_what_the_walkthrough_animates() -> None:
    at = run_page({"block": "128"})
    link = at.get("link_button")[0].proto.url
    assert "block_size=64" in link
    assert "Block size 128 is above its largest, 64" in messages(at, "caption")
    at = run_page({"gpu": "Custom", "gpu_gib": "14.96", "util": "1.0", "reserve_gib": "0"})
    assert not at.get("link_button")  # 8.03 B params in bf16 leave 1 block
    assert "vLLM would stop here: ValueError: To serve at least one request" in messages(at)
    assert "too few to serve" in messages(at, "warning")


def test_tensor_parallel_messages() -> None:
    at = run_page({"model": "DeepSeek-V3", "tp": "8"})
    assert "MLA's latent is replicated" in messages(at, "info")
    at = run_page({"model": "Qwen2.5-7B", "kv_heads": "4", "tp": "8"})
    assert "heads are replicated" in messages(at, "info")


def test_shared_link_restores_every_input() -> None:
    query = {"model": "Gemma-2-9B", "layers": "40", "kv_dtype": "fp8", "context": "6000",
             "batch": "12", "block": "32", "tp": "2", "gpu": "H200 141 GB", "util": "0.8",
             "reserve_gib": "3.5", "weight_dtype": "fp8", "params_b": "9.5"}
    at = run_page(query)
    assert not at.exception and not at.error and not at.warning
    assert at.selectbox(key="model").value == "Gemma-2-9B"
    assert at.number_input(key="layers").value == 40
    assert at.number_input(key="head_dim").value == 256  # from the preset, not in the link
    assert at.selectbox(key="kv_dtype").value == "fp8"
    assert at.number_input(key="context").value == 6000
    assert at.selectbox(key="block").value == 32 and at.selectbox(key="tp").value == 2
    assert at.number_input(key="util").value == pytest.approx(0.8)
    link = shared_link(at)
    assert {k: link[k] for k in query if k not in ("util", "reserve_gib", "params_b")} == {
        k: v for k, v in query.items() if k not in ("util", "reserve_gib", "params_b")}
    assert float(link["util"]) == 0.8 and float(link["params_b"]) == 9.5
    again = run_page(link)  # the copied link reopens the same numbers
    assert latex(again) == latex(at)


def test_a_broken_model_still_shows_the_workload_fields_and_their_link_messages() -> None:
    at = run_page({"kv_heads": "3", "context": "-5"})
    assert not at.exception
    assert "do not divide" in messages(at)
    assert "context=-5" in messages(at, "warning")  # the workload row is still drawn
    assert not at.table  # but nothing is computed from an invalid model


def test_bad_link_values_are_named_and_ignored() -> None:
    at = run_page({"layers": "abc", "context": "-5", "model": "GPT-9", "util": "7"})
    assert not at.exception
    warnings = messages(at, "warning")
    for text in ("layers=abc", "context=-5", "model=GPT-9", "util=7"):
        assert text in warnings
    assert at.number_input(key="layers").value == 32


def test_bytes_per_token_is_asked_before_the_sizes_are_readable() -> None:
    at = run_page()
    assert "The sizes held back" in messages(at, "caption")
    at.number_input(key="calc_bytes_guess").set_value(131_072)  # a form: sent with Check
    at.button(key="calc_bytes_check").click().run()
    assert at.success[0].value.startswith("Right: **131,072**")
    assert "2 (K and V) × 32 layers × 8 KV head(s) × 256 B per vector" in at.success[0].value
    assert "held back" not in messages(at, "caption")
    changed = run_page({"kv_dtype": "fp8"})  # another config asks again
    assert "The sizes held back" in messages(changed, "caption")


def test_a_hybrid_shows_what_its_family_changes_and_the_block_vllm_picks() -> None:
    at = run_page({"model": "Qwen3-Next-80B-A3B", "tp": "4", "gpu": "H200 141 GB"})
    assert not at.exception
    assert r"2 \times L \times H_{kv} \times d_{head} \times b" in latex(at)  # the guide's
    text = messages(at, "markdown")
    assert "the other 36 are Gated DeltaNet layers, which keep no KV" in text
    assert "raises the block size from 16 to 272 tokens" in text  # tests/test_family_sizing.py
    assert "Setting attention block size to 272 tokens" in at.code[0].value
    assert "GPU KV cache size: 1,890,944 tokens" in at.code[0].value
    assert vllm_values(at)["Maximum concurrency for 262,144 tokens per request"] == "28.76x"
    assert "one state page per layer (prefix caching is off)" in text
    at.toggle(key="prefix").set_value(True).run()
    assert "two state pages per layer" in messages(at, "markdown")
    assert shared_link(at)["prefix"] == "1"


def test_pasted_family_configs_show_their_terms() -> None:
    at = paste(run_page(), "llama-4-scout-17b-16e.json")
    assert not at.exception
    assert "36 chunked local layers attend within 8,192-token chunks" in messages(at, "markdown")
    at = paste(at, "minicpm3-4b.json")
    assert (at.number_input(key="kv_heads").value, at.number_input(key="head_dim").value) == (
        40, 96)
    assert "caches K and V for all 40 heads" in messages(at, "markdown")
    assert "952{,}320" in latex(at)


def asked(at: AppTest) -> bool:
    return any("How many bytes of KV cache does one token take" in m.value for m in at.markdown)


def test_the_question_is_asked_once_per_visit_and_then_holds_nothing_back() -> None:
    at = run_page()
    assert asked(at) and "The sizes held back" in messages(at, "caption")
    at.number_input(key="calc_bytes_guess").set_value(131_072)
    at.button(key="calc_bytes_check").click().run()
    assert at.success[0].value.startswith("Right: **131,072**")
    score = messages(at, "caption")
    assert "Your score: 1 of 1 on this page" in score
    # A preset, another dtype, a pasted config: no question, no verdict, nothing held back.
    at.selectbox(key="model").set_value("Qwen2.5-7B").run()
    assert not asked(at) and not at.success and "held back" not in messages(at, "caption")
    assert at.number_input(key="layers").value == 28  # the preset filled the fields
    at.selectbox(key="kv_dtype").set_value("fp8").run()
    assert not asked(at) and "held back" not in messages(at, "caption")
    paste(at, "falcon-7b.json")
    assert not asked(at) and "held back" not in messages(at, "caption")
    assert at.selectbox(key="model").value == "Custom"  # the fields are the config's now
    assert not at.exception


def test_just_show_me_also_ends_the_question_for_the_visit() -> None:
    at = run_page()
    at.button(key="calc_bytes_show").click().run()
    assert at.info[0].value.startswith("The engine says **131,072**")
    at.selectbox(key="model").set_value("Mistral-7B-v0.1").run()
    assert not asked(at) and not at.info and "held back" not in messages(at, "caption")
