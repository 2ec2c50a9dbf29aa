"""What the page tests read off an AppTest run: metrics, figures, and the sidebar's shareable
link."""

from __future__ import annotations

import json

from streamlit.testing.v1 import AppTest


def metrics(at: AppTest) -> dict[str, str]:
    """Every st.metric on the page: label -> value as shown."""
    return {m.label: str(m.value) for m in at.metric}


def assert_link_keeps(at: AppTest, query: dict[str, str]) -> None:
    """The sidebar's copy link carries every query parameter the page was opened with."""
    link = at.sidebar.get("code")[0].value
    for name, value in query.items():
        assert f"{name}={value.replace(' ', '+')}" in link


def figures(at: AppTest) -> dict[str, dict]:
    """The figures on the page (`ui.layout.show_figure`), key -> the plotly JSON sent to the
    browser, in page order."""
    shown = {}
    for element in at.get("bidi_component"):
        if element.proto.component_name == "lab_figure":
            data = json.loads(element.proto.json)
            shown[data["key"]] = {"data": json.loads(data["traces"]),
                                  "layout": json.loads(data["layout"])}
    return shown
