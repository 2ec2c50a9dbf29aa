"""The deployment recipe, for real on loopback: two replicas behind Debian's nginx, started by
deploy/lab.sh with deploy/nginx.conf.in, no container. Sessions driven through nginx with the
app's own websocket protocol (tests/load_client.py) each stay on one replica, across a
reconnect and their HTTP requests, and both replicas serve; a real browser works through it.

Skipped, saying why, when nginx is not installed (`make test` installs it when root).
"""

from __future__ import annotations

import asyncio
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.browser.harness import CHROMIUM, NGINX, serve_replicas
from tests.load_client import REPLICA_HEADER, LabSession, query

REPLICAS = 2
MAX_SESSIONS = 24  # opened until each replica holds two (by chance, as a class would arrive)


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> str:
    if not NGINX.exists():
        pytest.skip("nginx not found: `make test` installs Debian's nginx when run as root "
                    "(make nginx); elsewhere: apt-get install nginx")
    run_dir = tmp_path_factory.mktemp("deploy")
    with serve_replicas(run_dir, REPLICAS) as (url, pids):
        assert len(pids) == REPLICAS
        yield url
    assert not list(run_dir.glob("*.pid"))  # every replica and nginx stopped


def in_own_thread(fn):
    """fn() in a thread of its own: the browser tests' session-wide Playwright keeps an event
    loop running in this one, and neither asyncio.run nor a second sync Playwright may start
    inside it."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn).result()


def replica_of(url: str, cookie: str) -> str:
    request = urllib.request.Request(url, headers={"Cookie": cookie})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.headers[REPLICA_HEADER]


async def classroom(url: str) -> list[LabSession]:
    sessions: list[LabSession] = []
    while len(sessions) < MAX_SESSIONS:
        session = LabSession(url, "block_tables", query(seed=len(sessions)), timeout_s=120)
        assert not (await session.open()).error
        sessions.append(session)
        held = [s.replicas for s in sessions]
        if len({r for rs in held for r in rs}) == REPLICAS and all(
                sum(rs == {r} for rs in held) >= 2 for r in set().union(*held)):
            break
    for session in sessions:
        assert (await session.click("forward")).step == 1
        run = await session.reconnect()  # resumes the session only on the replica holding it
        assert not run.error and run.step == 1
        assert (await session.click("forward")).step == 2
        session.replicas.add(await asyncio.to_thread(
            replica_of, f"{url}/_stcore/health", session.cookie))
        await session.close()
    return sessions


def test_each_session_stays_on_one_replica_and_both_replicas_serve(lab) -> None:
    sessions = in_own_thread(lambda: asyncio.run(classroom(lab)))
    for session in sessions:
        assert len(session.replicas) == 1, f"session {session.session_id}: {session.replicas}"
    served = set().union(*(s.replicas for s in sessions))
    assert len(served) == REPLICAS, f"{len(sessions)} sessions, all on {served}"


def test_a_real_browser_steps_through_nginx(lab, tmp_path) -> None:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} not found")
    sync_api = pytest.importorskip("playwright.sync_api")
    from tests.browser.harness import (
        click_control,
        current_step,
        exceptions,
        launch_chromium,
        open_page,
        wait_settled,
    )

    def step_through_nginx() -> None:
        with sync_api.sync_playwright() as playwright:
            browser = launch_chromium(playwright)
            try:
                page = browser.new_page()
                open_page(page, f"{lab}/block_tables?seed=3")
                click_control(page, "forward")
                wait_settled(page)
                assert current_step(page) == 1 and not exceptions(page)
                cookies = {c["name"] for c in page.context.cookies()}
                assert "lab_replica" in cookies  # the sticky cookie nginx set
            finally:
                browser.close()

    in_own_thread(step_through_nginx)
