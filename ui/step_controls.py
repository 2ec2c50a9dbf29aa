"""The step controls of every animated page: Reset, Back, Step, Play/Pause, speed and a scrubber.

Contract with the page: the page has every step's state from the seed (a story's frames,
``ui.scenario.frames``). The controls only decide *which* step to show, so Back and scrubbing
are exact by construction::

    frames = ui.scenario.frames(story)
    frame = frames[step_controls(last_step=len(frames) - 1)]

The step is the value of a slider bound to the ``step`` query parameter, so a copied link
reopens the same step. Play advances one step per tick with a fragment that reruns on a timer
(``st.fragment(run_every=...)``): while playing, that fragment is drawn with the chosen
interval; each tick flags one advance and reruns the whole page, which applies it before any
widget is drawn. Pausing (or reaching the last step) stops drawing the fragment, which stops
the timer.

`events`, the story's notable steps as (step, short label), adds "Next event": it jumps to
the first event after the step shown ("Next: preemption at step 14"), and says so, disabled,
when none is ahead.

Keyboard: Right = Step, Left = Back, Home = Reset, P = Play/Pause, N = Next event.
`announce(step, text)`
says what the step did in a polite live region under the controls, for a screen reader.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence

import streamlit as st

from ui.state import bind_param, current_page, parse_int, register

STEP_MOVED = "_ui_step_moved"  # session: this run shows another step than the last one
LIVE_REGION = "_ui_live_region"  # session: this run's placeholder for `announce`
SHORT_LABEL = 18  # characters of an event label that fit on the Next button
SPEEDS = {"0.5×": 2.0, "1×": 1.0, "2×": 0.5, "4×": 0.25}  # label -> seconds per step
DEFAULT_SPEED = "2×"


def step_controls(last_step: int, *, key: str = "step",
                  events: Sequence[tuple[int, str]] = ()) -> int:
    """Draw the controls for steps 0..last_step and return the step to show (each page keeps
    its own step; the link parameter is `key`). `events`: (step, short label) of the story's
    notable steps, for "Next event"."""
    if last_step < 0:
        raise ValueError(f"last_step must be >= 0, got {last_step}")
    playing_key, advance_key, page_key = f"{key}_playing", f"{key}_advance", f"{key}_page"
    if st.session_state.get(page_key) != current_page():  # another page was playing
        st.session_state[page_key] = current_page()
        st.session_state[playing_key] = False
        st.session_state.pop(advance_key, None)
    if st.session_state.pop(advance_key, False):
        st.session_state[key] = min(int(st.session_state.get(key) or 0) + 1, last_step)
    current = st.session_state.get(key)
    if isinstance(current, int) and current > last_step:  # the range shrank: the last step
        st.session_state[key] = last_step

    with st.container(key=f"{key}_controls"):
        buttons = st.container()
        if last_step > 0:
            # No value=: the default is min_value (0), and the buttons set the value through
            # session state, which Streamlit would flag next to an explicit default.
            step = int(bind_param(
                key, 0, parse_int, lambda v: isinstance(v, int) and 0 <= v <= last_step,
                f"a step from 0 to {last_step}", str,
                lambda k: st.slider(f"Step (0 to {last_step})", min_value=0,
                                    max_value=last_step, step=1, key=k,
                                    help="Drag to jump to any step; every step is replayed "
                                         "exactly from the seed.")))
        else:
            step = 0
            register(key, "0", "0")
        # A new step (a button, the slider, Play): the page's main figure scrolls into view.
        st.session_state[STEP_MOVED] = st.session_state.get(f"{key}_shown") not in (None, step)
        st.session_state[f"{key}_shown"] = step
        if step >= last_step:
            st.session_state[playing_key] = False
        playing = bool(st.session_state.get(playing_key, False))
        with buttons:
            _buttons(key, step, last_step, playing, events)
        # Where `announce` says what the step did: made here, at the same place on every run,
        # so the browser updates one live region (a new one would not be read out).
        st.session_state[LIVE_REGION] = st.empty()
    if playing:
        _ticker(key, SPEEDS[st.session_state.get(f"{key}_speed", DEFAULT_SPEED)])
    return step


def announce(step: int, text: str) -> None:
    """Say what this step did to a screen reader, politely (after what it is reading), in the
    live region under the step controls; invisible on screen."""
    region = st.session_state.get(LIVE_REGION)
    if region is None:
        return
    words = re.sub(r"[*_`]", "", text)
    region.markdown(f'<div class="lab-sr-only" role="status" aria-live="polite">Step {step}: '
                    f"{html.escape(words)}</div>", unsafe_allow_html=True)


def next_event(events: Sequence[tuple[int, str]], step: int) -> tuple[int, str] | None:
    """The first event after `step` (the earliest listed among those at the same step)."""
    ahead = [(at, label) for at, label in events if at > step]
    return min(ahead, key=lambda event: event[0]) if ahead else None


def _buttons(key: str, step: int, last_step: int, playing: bool,
             events: Sequence[tuple[int, str]]) -> None:
    widths = [1.1, 1, 1, 1, 2, 1.3] if events else [1, 1, 1, 1, 1.6]
    reset, back, forward, play, *jump, speed = st.columns(widths, vertical_alignment="bottom")
    reset.button("Reset", key=f"{key}_reset", icon=":material/first_page:", on_click=_move,
                 args=(key, -last_step, last_step), disabled=step == 0, shortcut="Home",
                 help="Back to step 0 (Home)")
    back.button("Back", key=f"{key}_back", icon=":material/chevron_left:", on_click=_move,
                args=(key, -1, last_step), disabled=step == 0, shortcut="Left",
                help="One step back (Left arrow)")
    forward.button("Step", key=f"{key}_forward", icon=":material/chevron_right:",
                   icon_position="right", on_click=_move, args=(key, 1, last_step),
                   disabled=step >= last_step, type="primary", shortcut="Right",
                   help="One step forward (Right arrow)")
    play.button("Pause" if playing else "Play", key=f"{key}_play",
                icon=":material/pause:" if playing else ":material/play_arrow:",
                on_click=_toggle_play, args=(key, step, last_step), disabled=last_step == 0,
                shortcut="P", help="Advance one step per tick until the last step (P)")
    if jump:
        coming = next_event(events, step)
        at, label = coming if coming is not None else (step, "")
        # The button stays short beside the others; its tooltip says the step and the whole
        # description.
        text = ("No event ahead" if coming is None else
                f"Next: {label}" if len(label) <= SHORT_LABEL else "Next event")
        jump[0].button(text, key=f"{key}_next_event", icon=":material/skip_next:", on_click=_go,
                       args=(key, at), disabled=coming is None, shortcut="N",
                       help=f"Jump to step {at}: {label} (N)" if coming else "No event ahead")
    speed.select_slider("Play speed", options=list(SPEEDS), value=DEFAULT_SPEED,
                        key=f"{key}_speed",
                        help="1× is one step per second (slower if a step takes longer to "
                             "compute)")


def _move(key: str, delta: int, last_step: int) -> None:
    step = int(st.session_state.get(key) or 0) + delta
    st.session_state[key] = min(max(step, 0), last_step)
    st.session_state[f"{key}_playing"] = False


def _go(key: str, step: int) -> None:
    st.session_state[key] = step
    st.session_state[f"{key}_playing"] = False


def _toggle_play(key: str, step: int, last_step: int) -> None:
    playing_key = f"{key}_playing"
    start = not st.session_state.get(playing_key, False)
    st.session_state[playing_key] = start
    if start and step >= last_step:
        st.session_state[key] = 0  # Play at the end starts over


def _ticker(key: str, interval: float) -> None:
    """While playing: a fragment on a timer that asks for one advance per tick."""
    armed_key = f"{key}_tick_armed"
    st.session_state[armed_key] = False  # the fragment's inline run below is not a tick

    @st.fragment(run_every=interval)
    def tick() -> None:
        if not st.session_state.get(armed_key):
            st.session_state[armed_key] = True
            return
        if st.session_state.get(f"{key}_playing"):
            st.session_state[f"{key}_advance"] = True
            st.rerun()

    tick()
