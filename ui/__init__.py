"""Shared Streamlit pieces for every page (pages stay thin: widgets -> story -> figure).

- `ui.sidebar.sidebar()`: call first on every page (backend, seed, classroom mode, copy link);
  `ui.navigation` keeps app.py's navigation in charge.
- `ui.state`: widgets whose values live in the URL (`int_param`, `float_param`,
  `choice_param`), `seed()`, `is_classroom()`, `register()` for extra link parameters.
- `ui.step_controls.step_controls(last_step, events=...)`: Reset / Back / Step / Play /
  Next event / speed / scrubber; returns the step to show.
- `ui.scenario`: a page's story on screen: `or_stop(build)` (a bad combination of settings:
  message, stop), `frames(story)` (shared by all users), `live_badge(story, step, last)` (the
  kernel check on the story's live pool, shared by everyone stepping it), `live_measured`,
  `export_trace(story, step)`.
- `ui.memo`: `shared(fn)` (cached across sessions, immutable), `shared_within(fn, weigh,
  budget)` (the same within a total size: a story's frames) and `per_user(key, params, make)`
  (this session's mutable object or result).
- `ui.layout`: `explain(md)`, `bullets(lines)`, `settings()`, `show_figure(fig, key)`
  (classroom-aware; drawn by `ui.figure_view`, which redraws a key's plot in place).
- `ui.walk_settings`: the walkthrough's settings row and its fit check (block tables,
  attention).
- `ui.kernel_badge.kernel_badge(check)`: kernel vs dense attention, green within tolerance.
- `ui.predict`: "Predict, then reveal" with the engine's answer; `gate(questions, step)`
  asks each the step before its answer and closes it after.
- `ui.scheduler_views`: the scheduler page's settings; `ui.scheduler_runs`: its long runs.
"""
