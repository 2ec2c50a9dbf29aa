"""What the page tests read off an AppTest run: metrics, and the sidebar's shareable link."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest


def metrics(at: AppTest) -> dict[str, str]:
    """Every st.metric on the page: label -> value as shown."""
    return {m.label: str(m.value) for m in at.metric}


def assert_link_keeps(at: AppTest, query: dict[str, str]) -> None:
    """The sidebar's copy link carries every query parameter the page was opened with."""
    link = at.sidebar.get("code")[0].value
    for name, value in query.items():
        assert f"{name}={value.replace(' ', '+')}" in link
