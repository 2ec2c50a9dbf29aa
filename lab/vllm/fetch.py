"""Fetch a vLLM server's /metrics *from the server the lab runs on*, safe by default.

A URL typed on a page makes the lab's server connect somewhere, so on a shared deployment it
must not become a door into the server's own network:

* The host is resolved once and the fetch connects to that address (a second lookup could
  answer differently: DNS rebinding); the Host header and TLS still name the host.
* Link-local addresses (cloud metadata lives there), the known metadata names and addresses,
  unspecified, multicast and reserved ones are refused always; loopback and private ranges
  unless the operator's `PAGED_LAB_URL_FETCH` allows them (`FetchMode`); every redirect is
  checked again (at most MAX_REDIRECTS).
* One deadline for the whole fetch (connect, TLS, headers, body), not one per read: a watchdog
  shuts the socket when it passes, so a server that drips a byte at a time gets nowhere.
* At most MAX_TEXT_BYTES are read, and the reply must be Prometheus text.
* The page's message never quotes what the remote sent and reads the same whether the port
  was closed, answered an error, or answered something else; why exactly goes to the server log.

`PAGED_LAB_URL_FETCH=off` turns it off.
"""

from __future__ import annotations

import http.client
import ipaddress
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from urllib.parse import urljoin, urlsplit

from lab.vllm.metrics_text import MAX_TEXT_BYTES, MetricsError, parse_prometheus

FETCH_TIMEOUT_S = 3.0
MAX_REDIRECTS = 3
MAX_URL_CHARS = 2000
MODE_ENV = "PAGED_LAB_URL_FETCH"
_REDIRECTS = {301, 302, 303, 307, 308}
# Cloud metadata services: refused by name and by address, whatever the mode allows.
METADATA_HOSTS = frozenset({"metadata.google.internal", "metadata", "metadata.goog",
                            "instance-data", "instance-data.ec2.internal"})
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254", "169.254.170.2", "100.100.100.200", "fd00:ec2::254", "192.0.0.192"))
_log = logging.getLogger(__name__)
Resolver = Callable[[str, int], list[str]]


class FetchMode(StrEnum):
    """Which addresses the fetch may reach (the environment variable's values)."""

    OFF = "off"  # no fetch at all
    PUBLIC = "public"  # public addresses only: a shared deployment
    LOOPBACK = "loopback"  # public + this machine (the default: `make run` on a laptop)
    PRIVATE = "private"  # public + this machine + private ranges (a lab on its own network)


REACHES = {FetchMode.PUBLIC: "public addresses only",
           FetchMode.LOOPBACK: "public addresses and this machine (localhost)",
           FetchMode.PRIVATE: "public, this machine's and private-network addresses"}


class FetchRefused(MetricsError):
    """A URL the fetch will not request (its scheme, shape or address), said before connecting."""


def fetch_mode() -> FetchMode:
    """The operator's choice; an unknown value is the strictest that still fetches (public)."""
    value = os.environ.get(MODE_ENV, "").strip().lower()
    if not value:
        return FetchMode.LOOPBACK
    try:
        return FetchMode(value)
    except ValueError:
        _log.warning("%s=%r is not one of %s: fetching public addresses only", MODE_ENV, value,
                     ", ".join(FetchMode))
        return FetchMode.PUBLIC


def turned_off_reason(mode: FetchMode | None = None) -> str | None:
    """What the page says before anyone clicks, when the fetch is off; None when it is on."""
    if (mode or fetch_mode()) is not FetchMode.OFF:
        return None
    return (f"Fetching URLs is turned off on this server ({MODE_ENV}=off): paste the /metrics "
            "text instead.")


@dataclass(frozen=True)
class Target:
    url: str
    scheme: str
    host: str
    port: int
    path: str  # path and query, as sent
    address: str  # the one address resolved and checked, which the fetch connects to


def _address_refusal(address: str, mode: FetchMode) -> tuple[str, FetchMode | None] | None:
    """None when `mode` may reach the address, else (what it is, the mode that would allow it:
    None for the addresses no mode reaches)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # a scoped IPv6 address: fe80::1%eth0
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip in METADATA_ADDRESSES:
        return "a cloud metadata address", None
    if ip.is_link_local:
        return "a link-local address", None
    if ip.is_loopback:  # before is_reserved, which ::1 also is
        allowed = mode in (FetchMode.LOOPBACK, FetchMode.PRIVATE)
        return None if allowed else ("this machine (loopback)", FetchMode.LOOPBACK)
    if ip.is_unspecified or ip.is_multicast or ip.is_reserved:
        return "not an address a server listens on", None
    if ip.is_private or not ip.is_global:
        return None if mode is FetchMode.PRIVATE else ("a private-network address",
                                                        FetchMode.PRIVATE)
    return None


@cache
def _dns() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=4, thread_name_prefix="fetch-dns")


def _system_resolver(host: str, port: int) -> list[str]:
    """The host's addresses; getaddrinfo has no timeout, so it runs in a worker we stop
    waiting for after FETCH_TIMEOUT_S (TimeoutError)."""
    lookup = _dns().submit(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
    return [info[4][0] for info in lookup.result(timeout=FETCH_TIMEOUT_S)]


def check_url(url: str, mode: FetchMode, resolve: Resolver = _system_resolver) -> Target:
    """The URL as a Target the fetch may connect to, or FetchRefused saying why not."""
    url = url.strip()
    example = "give an http:// or https:// URL with a host, e.g. http://localhost:8000/metrics"
    if not url or len(url) > MAX_URL_CHARS:
        raise FetchRefused(example)
    if not url.isascii() or any(c.isspace() or not c.isprintable() for c in url):
        raise FetchRefused("the URL holds a space, a control character or a non-ASCII "
                           "character (percent-encode it): " + example)
    try:
        parts = urlsplit(url)
        port = parts.port
        host = parts.hostname
    except ValueError:
        raise FetchRefused("the URL cannot be read (its host or port): " + example) from None
    if parts.scheme not in ("http", "https") or not host:
        raise FetchRefused(example)
    if parts.username is not None or parts.password is not None:
        raise FetchRefused("the URL holds a user name or password; the lab does not send them")
    port = port or (443 if parts.scheme == "https" else 80)
    if host.rstrip(".").lower() in METADATA_HOSTS:
        raise FetchRefused(f"{host} is not allowed: the lab never fetches cloud metadata")
    try:
        addresses = resolve(host, port)
    except (OSError, UnicodeError, ValueError):
        raise FetchRefused(f"{host} could not be resolved to an address") from None
    if not addresses:
        raise FetchRefused(f"{host} could not be resolved to an address")
    address = addresses[0]  # the one address checked is the one connected to
    refusal = _address_refusal(address, mode)
    if refusal is not None:
        what, allowed_by = refusal
        hint = f" ({MODE_ENV}={allowed_by} allows it)" if allowed_by else ""
        raise FetchRefused(f"{host} is {what}, which is not allowed on this server{hint}")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Target(url, parts.scheme, host, port, path, address)


class _Unreadable(Exception):
    """Why one fetch failed, for the server log only (the page gets one message for all)."""


def _get(target: Target, deadline: float, max_bytes: int) -> tuple[int, str | None, bytes]:
    """(status, Location header, body) of one GET to target.address, by `deadline`."""
    remaining = deadline - time.monotonic()
    sock = socket.create_connection((target.address, target.port), timeout=remaining)
    watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), _shut, args=(sock,))
    watchdog.daemon = True
    watchdog.start()
    conn = http.client.HTTPConnection(target.host, target.port)
    try:
        if target.scheme == "https":
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=target.host)
        conn.sock = sock  # the checked address, already connected: no second lookup
        default_port = 443 if target.scheme == "https" else 80
        host = target.host if ":" not in target.host else f"[{target.host}]"
        conn.putrequest("GET", target.path, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", host if target.port == default_port else f"{host}:{target.port}")
        conn.putheader("Accept", "text/plain")
        conn.endheaders()
        response = conn.getresponse()
        body = response.read(max_bytes + 1) if response.status == 200 else b""
        if len(body) <= max_bytes and response.length:  # read(n) returns a short body quietly
            raise _Unreadable(f"the body ended {response.length:,} bytes early")
        return response.status, response.getheader("Location"), body
    finally:
        watchdog.cancel()
        conn.close()
        sock.close()


def _shut(sock: socket.socket) -> None:
    """At the deadline: wake any read blocked on the socket (it then sees the end)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _redirect(where: str, url: str, mode: FetchMode, resolve: Resolver) -> Target:
    """The redirect's target, checked as the first URL was; the refusal does not quote it
    (what the remote sent stays off the page)."""
    try:
        return check_url(url, mode, resolve)
    except FetchRefused as err:
        _log.warning("fetch of %s: refused its redirect: %s", where, err)
        raise FetchRefused(f"{where} redirected to an address or URL that is not allowed on "
                           "this server") from None


def fetch_metrics(url: str, *, mode: FetchMode | None = None, timeout: float = FETCH_TIMEOUT_S,
                  max_bytes: int = MAX_TEXT_BYTES, resolve: Resolver = _system_resolver) -> str:
    """GET the URL from this server and return its Prometheus text; FetchRefused says why a
    URL is not requested, MetricsError (one message) that it gave no readable /metrics."""
    mode = mode or fetch_mode()
    if mode is FetchMode.OFF:
        raise FetchRefused(turned_off_reason(mode) or "")
    deadline = time.monotonic() + timeout
    target = check_url(url, mode, resolve)
    where = f"{target.host}:{target.port}"
    try:
        for _ in range(MAX_REDIRECTS + 1):
            if time.monotonic() >= deadline:
                raise _Unreadable("past the deadline")
            status, location, body = _get(target, deadline, max_bytes)
            if time.monotonic() >= deadline:  # the watchdog cut it: what came is not all
                raise _Unreadable("the deadline passed")
            if status in _REDIRECTS and location:
                target = _redirect(where, urljoin(target.url, location), mode, resolve)
                continue
            if status != 200:
                raise _Unreadable(f"HTTP {status}")
            if len(body) > max_bytes:
                raise _Unreadable(f"more than {max_bytes:,} bytes")
            text = body.decode("utf-8", "replace").removeprefix("\ufeff")
            parse_prometheus(text)  # the page gets Prometheus text or nothing of the reply
            return text
        raise _Unreadable(f"more than {MAX_REDIRECTS} redirects")
    except FetchRefused:
        raise
    except (_Unreadable, OSError, http.client.HTTPException, ssl.SSLError, MetricsError,
            ValueError) as err:
        _log.warning("fetch of %s (%s) failed: %s: %s", where, target.address,
                     type(err).__name__, err)
    raise MetricsError(f"no Prometheus /metrics text from {where} within {timeout:g} s: the "
                       "port may be closed, the server may have answered an error or something "
                       "else, or been too slow. Check the URL, or paste the text instead.")
