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

from lab.vllm.metrics_text import FETCH_TIMEOUT_S, MetricsError, fetch_metrics
from tests.hostile_server import SECRET, Server, closed_port, hostile_server


def defect(reason: str) -> pytest.MarkDecorator:
    """A defect issue 14 lists, reproduced here before its fix."""
    return pytest.mark.xfail(strict=True, reason=f"issue 14: {reason}")


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
    pytest.param("/garbage-status", marks=defect("a garbage status line raised BadStatusLine")),
    pytest.param("/long-header", marks=defect("a header over 64 KiB raised LineTooLong")),
    pytest.param("/many-headers", marks=defect("more than 100 headers raised HTTPException")),
    pytest.param("/truncated-chunked", marks=defect("a truncated chunked body raised "
                                                    "IncompleteRead")),
    pytest.param("/bad-chunk-size", marks=defect("a bad chunk size raised IncompleteRead")),
    pytest.param("/short-body", marks=defect("a short body raised IncompleteRead")),
    pytest.param("/secret", marks=defect("a non-Prometheus body was handed to the page, which "
                                         "quoted its first line")),
    pytest.param("/binary", marks=defect("a binary body was handed to the page")),
    "/missing", "/error", "/huge", "/redirect-file", "/redirect-loop",
    "/empty", "/redirect-garbage",
])
def test_a_misbehaving_server_gives_a_message_that_hides_its_reply(server: Server,
                                                                   path: str) -> None:
    assert refusal(server.url + path)


@pytest.mark.parametrize("path", [pytest.param("/drip", marks=defect(
    "the fetch's 3 s was per read: a server sending a byte at a time kept it going")), "/silent"])
def test_the_deadline_is_for_the_whole_fetch(server: Server, path: str) -> None:
    refusal(server.url + path)


@defect("'refused', 'did not answer' and 'HTTP 404' told open ports from closed ones")
def test_open_and_closed_ports_read_the_same(server: Server) -> None:
    urls = [f"http://127.0.0.1:{closed_port()}/metrics", server.url + "/missing",
            server.url + "/garbage-status", server.url + "/secret"]
    messages = {re.sub(r":\d+", ":PORT", refusal(url)) for url in urls}
    assert len(messages) == 1, messages


@defect("the fetch followed redirects and requested any address")
@pytest.mark.parametrize("path", ["/redirect-private", "/redirect-link-local",
                                  "/redirect-metadata-name"])
def test_a_redirect_to_an_internal_address_is_refused(server: Server, path: str) -> None:
    assert "not allowed" in refusal(server.url + path)


@defect("the fetch requested link-local, metadata and private addresses")
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
    pytest.param("http://[::1/metrics", marks=defect("urlsplit raised before the try")),
    pytest.param("http://127.0.0.1:9/a b", marks=defect("a space in the path raised InvalidURL")),
    pytest.param("http://127.0.0.1:9/a\tb", marks=defect("a tab in the path raised InvalidURL")),
    pytest.param("http://127.0.0.1:abc/", marks=defect("a non-numeric port raised InvalidURL")),
    pytest.param("http://127.0.0.1:9/m\r\nX-Injected: 1", marks=defect(
        "a CR LF in the URL raised InvalidURL")),
    "http://127.0.0.1:99999/", "ftp://127.0.0.1/", "file:///etc/passwd", "", "   ",
    "http:///metrics", "localhost:8000/metrics", "http://" + "a" * 300 + "/",
])
def test_a_malformed_url_is_named(url: str) -> None:
    assert refusal(url)
