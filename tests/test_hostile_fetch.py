"""The server-side /metrics fetch against a local server that misbehaves (tests/hostile_server.py),
and the addresses a shared deployment must never reach.

Whatever the remote end does, the fetch gives the page text or a MetricsError, within its
total deadline; its messages never quote what the remote sent and read the same for a closed
port, an open one that answers an error, and one that answers something else.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lab.vllm.fetch import (
    FETCH_TIMEOUT_S,
    MODE_ENV,
    FetchMode,
    FetchRefused,
    check_url,
    fetch_metrics,
    fetch_mode,
)
from lab.vllm.metrics_text import MetricsError
from tests.hostile_inputs import examples, hostile_texts
from tests.hostile_server import SECRET, Server, closed_port, hostile_server


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with hostile_server() as s:
        yield s


def refusal(url: str) -> str:
    """The message of a fetch that must fail, checked to be quick and to hide the remote."""
    start = time.monotonic()
    with pytest.raises(MetricsError) as caught:
        fetch_metrics(url)
    assert time.monotonic() - start < FETCH_TIMEOUT_S + 1.5
    message = str(caught.value)
    assert SECRET not in message and "s3cr3t" not in message
    return message


def test_a_well_behaved_server_is_read(server: Server) -> None:
    assert "vllm:num_requests_running" in fetch_metrics(server.url + "/metrics")


@pytest.mark.parametrize("path", [
    "/garbage-status", "/long-header", "/many-headers", "/truncated-chunked", "/bad-chunk-size",
    "/short-body", "/secret", "/binary", "/missing", "/error", "/huge", "/redirect-file",
    "/redirect-loop", "/empty", "/redirect-garbage",
])
def test_a_misbehaving_server_gives_a_message_that_hides_its_reply(server: Server,
                                                                   path: str) -> None:
    assert refusal(server.url + path)


@pytest.mark.parametrize("path", ["/drip", "/silent"])
def test_the_deadline_is_for_the_whole_fetch(server: Server, path: str) -> None:
    refusal(server.url + path)


def test_open_and_closed_ports_read_the_same(server: Server) -> None:
    urls = [f"http://127.0.0.1:{closed_port()}/metrics", server.url + "/missing",
            server.url + "/garbage-status", server.url + "/secret"]
    messages = {re.sub(r":\d+", ":PORT", refusal(url)) for url in urls}
    assert len(messages) == 1, messages


@pytest.mark.parametrize("path", ["/redirect-private", "/redirect-link-local",
                                  "/redirect-metadata-name"])
def test_a_redirect_to_an_internal_address_is_refused(server: Server, path: str) -> None:
    assert "not allowed" in refusal(server.url + path)


@pytest.mark.parametrize("url", [
    "http://169.254.169.254/latest/meta-data/", "http://[fe80::1]/metrics",
    "http://[::ffff:169.254.169.254]/", "http://[fd00:ec2::254]/latest/meta-data/",
    "http://100.100.100.200/latest/meta-data/", "http://metadata.google.internal/",
    "http://10.0.0.1/metrics", "http://192.168.1.1/metrics", "http://172.16.0.1/metrics",
    "http://0.0.0.0:8000/metrics", "http://[::]:8000/metrics",
])
def test_internal_addresses_are_refused_without_connecting(url: str) -> None:
    start = time.monotonic()
    assert "not allowed" in refusal(url)
    assert time.monotonic() - start < 1.0


@pytest.mark.parametrize("url", [
    "http://[::1/metrics", "http://127.0.0.1:9/a b", "http://127.0.0.1:9/a\tb",
    "http://127.0.0.1:abc/", "http://127.0.0.1:9/m\r\nX-Injected: 1", "http://127.0.0.1:99999/",
    "ftp://127.0.0.1/", "file:///etc/passwd", "", "   ", "http:///metrics",
    "localhost:8000/metrics", "http://" + "a" * 300 + "/", "http://user:pw@127.0.0.1:9/",
    "http://bücher.test/metrics", "http://127.0.0.1:9/" + "x" * 3000,
])
def test_a_malformed_url_is_named(url: str) -> None:
    assert refusal(url)


# -- what connects where: the resolved address, the operator's mode ----------------------------
class Dns:
    """A DNS answering `first` to the first lookup and `later` to the others (a rebinding
    attacker's), counting lookups."""

    def __init__(self, first: str, later: str | None = None) -> None:
        self.first, self.later, self.calls = first, later or first, []

    def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append(host)
        return [self.first if len(self.calls) == 1 else self.later]


def test_the_host_is_resolved_once_and_the_checked_address_connected(server: Server) -> None:
    dns = Dns("127.0.0.1", later="169.254.169.254")
    text = fetch_metrics(f"http://metrics.test:{server.port}/metrics", resolve=dns)
    assert "vllm:num_requests_running" in text and dns.calls == ["metrics.test"]
    assert server.requests[-1]["host"] == f"metrics.test:{server.port}"  # the name, not the IP


def test_every_redirect_is_checked_again(server: Server) -> None:
    dns = Dns("127.0.0.1")
    assert fetch_metrics(f"http://metrics.test:{server.port}/redirect-ok", resolve=dns)
    assert dns.calls == ["metrics.test", "metrics.test"]
    rebinding = Dns("127.0.0.1", later="10.0.0.7")  # the redirect's lookup answers private
    with pytest.raises(FetchRefused, match="redirected to an address or URL that is not allowed"):
        fetch_metrics(f"http://metrics.test:{server.port}/redirect-ok", resolve=rebinding)


def test_public_mode_refuses_this_machine_without_connecting(server: Server) -> None:
    before = len(server.requests)
    with pytest.raises(FetchRefused, match=f"this machine.*{MODE_ENV}=loopback allows it"):
        fetch_metrics(server.url + "/metrics", mode=FetchMode.PUBLIC)
    assert len(server.requests) == before


P, L, V = FetchMode.PUBLIC, FetchMode.LOOPBACK, FetchMode.PRIVATE


@pytest.mark.parametrize("mode, address, allowed", [
    (P, "93.184.216.34", True), (P, "2606:2800:220:1::1", True), (P, "127.0.0.1", False),
    (P, "::ffff:10.0.0.1", False), (P, "10.1.2.3", False), (L, "127.0.0.1", True),
    (L, "127.8.9.10", True), (L, "::1", True), (L, "::ffff:127.0.0.1", True),
    (L, "10.1.2.3", False), (L, "192.168.0.5", False), (L, "100.64.0.1", False),
    (V, "10.1.2.3", True), (V, "fd12::1", True), (V, "172.31.255.255", True),
    (V, "169.254.169.254", False), (V, "169.254.0.1", False), (V, "fe80::1%eth0", False),
    (V, "fd00:ec2::254", False), (V, "100.100.100.200", False), (V, "0.0.0.0", False),
    (V, "::", False), (V, "224.0.0.1", False), (V, "240.0.0.1", False),
    (V, "255.255.255.255", False),
])
def test_which_mode_reaches_which_address(mode: FetchMode, address: str, allowed: bool) -> None:
    def dns(host: str, port: int) -> list[str]:
        return [address]

    if allowed:
        assert check_url("http://metrics.test/metrics", mode, dns).address == address
    else:
        with pytest.raises(FetchRefused, match="not allowed"):
            check_url("http://metrics.test/metrics", mode, dns)


@pytest.mark.parametrize("env, mode", [
    ({}, L), ({MODE_ENV: "off"}, FetchMode.OFF), ({MODE_ENV: " PUBLIC "}, P),
    ({MODE_ENV: "private"}, V), ({MODE_ENV: "everything"}, P),
    ({MODE_ENV: " OFF "}, FetchMode.OFF),
])
def test_the_operator_chooses_the_mode(monkeypatch, env: dict[str, str], mode: FetchMode) -> None:
    monkeypatch.delenv(MODE_ENV, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert fetch_mode() is mode


def test_a_fetch_turned_off_connects_nowhere(server: Server, monkeypatch) -> None:
    monkeypatch.setenv(MODE_ENV, "off")
    before = len(server.requests)
    with pytest.raises(FetchRefused, match="turned off"):
        fetch_metrics(server.url + "/metrics")
    assert len(server.requests) == before


urls = st.builds("{}{}{}{}".format,
                 st.sampled_from(["http://", "https://", "HTTP://", "", "ftp://", "http:/", "//"]),
                 st.sampled_from(["x.test", "[::1", "[::1]", "127.0.0.1", "u:p@x.test", ""])
                 | hostile_texts,
                 st.sampled_from(["", ":", ":80", ":0", ":99999", ":-1", ":8a"])
                 | hostile_texts.map(":{}".format),
                 hostile_texts.map("/{}".format))


@examples(200)
@given(urls)
def test_fuzzed_urls_are_refused_before_connecting(url: str) -> None:
    """Every name resolves to TEST-NET-1 (192.0.2.1, not a global address): whatever the URL,
    the fetch refuses it, by its shape or by its address, before any connection."""
    with pytest.raises(FetchRefused):
        fetch_metrics(url, mode=FetchMode.LOOPBACK, resolve=lambda host, port: ["192.0.2.1"])
