"""AppTest for the KV-size calculator page: presets, pasted configs, extreme input, shared links."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import parse_qs

import pytest
from streamlit.testing.v1 import AppTest

from lab.sizing.model_spec import load_presets
from tests.test_kv_formula import GOLDEN_BYTES_PER_TOKEN
from tests.test_model_config import GEMMA_2_9B

PAGE = str(Path(__file__).resolve().parents[1] / "pages" / "calculator.py")


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


def test_default_page_renders_the_formula_and_the_sheet() -> None:
    at = run_page()
    assert not at.exception and not at.error
    assert "131{,}072" in latex(at)  # Llama-3.1-8B: 2 x 32 x 8 x 128 x 2
    sheet = at.table[1].value
    assert "maximum concurrency for 8,192 tokens" in sheet["step"].tolist()
    link = at.get("link_button")[0].proto.url
    assert link.startswith("block_tables?") and "block_size=16" in link and "num_blocks=" in link
    assert "scale 1:" in messages(at, "caption")


def test_each_preset_fills_the_fields_and_the_formula() -> None:
    at = run_page()
    for name in sorted(GOLDEN_BYTES_PER_TOKEN):
        at.selectbox(key="model").set_value(name).run()
        assert not at.exception, name
        # Only Llama-3.1-405B and DeepSeek-V3 (weights alone exceed one H100) may complain.
        assert all("no room for any KV block" in e.value for e in at.error), name
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
    at = run_page()
    at.text_area(key="config_text").input(json.dumps(GEMMA_2_9B))
    at.button(key="config_read").click().run()
    assert not at.exception and not at.error
    assert at.selectbox(key="model").value == "Custom"
    assert at.number_input(key="head_dim").value == 256
    assert at.number_input(key="sliding_layers").value == 21
    assert "344{,}064" in latex(at)
    assert "Gemma 2 alternates" in messages(at, "caption")


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
