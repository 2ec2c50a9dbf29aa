"""Shared Streamlit pieces for every page (pages stay thin: widgets -> engine -> figure).

- `ui.sidebar.sidebar()`: call first on every page (backend, seed, classroom mode, copy link).
- `ui.state`: widgets whose values live in the URL (`int_param`, `float_param`,
  `choice_param`), `seed()`, `is_classroom()`, `register()` for extra link parameters.
- `ui.step_controls.step_controls(last_step)`: Reset / Back / Step / Play / speed / scrubber;
  returns the step to show; pair it with a cached `replay(params, seed, step)`.
  `prefetch_next(...)` computes the next step in the background.
- `ui.layout`: `explain(md)`, `bullets(lines)`, `settings()`, `show_figure(fig, key)`
  (classroom-aware; drawn by `ui.figure_view`, which redraws a key's plot in place).
- `ui.scenario`: `or_stop(build)` (a bad combination of settings: message, stop),
  `cached(replay)` (an engine replay cached per its arguments, e.g. (cfg, seed)).
- `ui.walk_settings`: the walkthrough's settings row and its fit check (block tables,
  attention).
- `ui.kernel_badge.attention_badge(check)`: kernel vs dense attention, green within tolerance.
- `ui.predict.predict(...)`: "Predict, then reveal" with the engine's answer.
- `ui.export.export_trace(json, ...)`: download the event trace.
"""
