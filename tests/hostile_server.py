"""A local HTTP server on 127.0.0.1 that misbehaves in every way issue 14 lists, for the fetch.

Each path answers with raw bytes (no http.server, so it can break the protocol): a garbage status
line, a header line over 64 KiB, more than 100 headers, a truncated chunked body, a body dripped
one byte at a time, a secret in a non-Prometheus body, redirects to internal addresses. The
server records every request it got, so a test can tell that a refused fetch never connected.
"""

from __future__ import annotations

import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

SECRET = "INTERNAL_ONLY_TOKEN=s3cr3t-4f9a"
METRICS = (b"# TYPE vllm:num_requests_running gauge\n"
           b'vllm:num_requests_running{model_name="m"} 3\n')
DRIP_S = 8.0  # how long the drip keeps sending


def _reply(status: str, body: bytes, *headers: str) -> bytes:
    head = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", *headers, "", ""]
    return "\r\n".join(head).encode() + body


def _redirect(location: str) -> bytes:
    return _reply("302 Found", b"", f"Location: {location}")


RAW: dict[str, bytes] = {
    "/metrics": _reply("200 OK", METRICS, "Content-Type: text/plain"),
    "/secret": _reply("200 OK", (SECRET + "\n").encode()),
    "/missing": _reply("404 Not Found", (SECRET + "\n").encode()),
    "/error": _reply("500 Internal Server Error", (SECRET + "\n").encode()),
    "/garbage-status": b"HELLO " + SECRET.encode() + b"\r\n\r\n",
    "/long-header": b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 70_000 + b"\r\n\r\n",
    "/many-headers": (b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(120))
                      + b"\r\n"),
    "/truncated-chunked": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                           b"40\r\nvllm:num_requests_running 1\n"),
    "/bad-chunk-size": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nx\r\n",
    "/short-body": b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nvllm:x 1\n",
    "/binary": _reply("200 OK", bytes(range(256)) * 16),
    "/bom": _reply("200 OK", b"\xef\xbb\xbf" + METRICS),
    "/huge": _reply("200 OK", b"x 1\n" * (5 << 18)),
    "/empty": b"",
    "/redirect-ok": _redirect("/metrics"),
    "/redirect-private": _redirect("http://10.255.255.1/metrics"),
    "/redirect-link-local": _redirect("http://169.254.169.254/latest/meta-data/"),
    "/redirect-metadata-name": _redirect("http://metadata.google.internal/computeMetadata/v1/"),
    "/redirect-file": _redirect("file:///etc/passwd"),
    "/redirect-loop": _redirect("/redirect-loop"),
    "/redirect-garbage": _redirect("http://[::1/x"),
}


def _drip(write: Callable[[bytes], None]) -> None:
    """A valid reply, one byte every 0.2 s for DRIP_S seconds: every read gets data in time."""
    data, end = _reply("200 OK", METRICS * 100), time.monotonic() + DRIP_S
    for i in range(len(data)):
        if time.monotonic() > end:
            return
        write(data[i:i + 1])
        time.sleep(0.2)


def _silent(write: Callable[[bytes], None]) -> None:
    time.sleep(DRIP_S)


BEHAVIOURS: dict[str, Callable[[Callable[[bytes], None]], None]] = {
    "/drip": _drip, "/silent": _silent}


@dataclass
class Server:
    url: str  # http://127.0.0.1:<port>
    port: int
    requests: list[dict[str, str]] = field(default_factory=list)  # path, host, ...


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        head = b""
        self.request.settimeout(5)
        while b"\r\n\r\n" not in head and len(head) < 65536:
            chunk = self.request.recv(4096)
            if not chunk:
                return
            head += chunk
        lines = head.decode("latin-1").split("\r\n")
        path = lines[0].split(" ")[1] if len(lines[0].split(" ")) > 1 else ""
        headers = {k.strip().lower(): v.strip() for k, _, v in
                   (line.partition(":") for line in lines[1:] if ":" in line)}
        self.server.record.requests.append({"path": path, **headers})  # type: ignore[attr-defined]
        try:
            if path in BEHAVIOURS:
                BEHAVIOURS[path](self.request.sendall)
            else:
                self.request.sendall(RAW.get(path, RAW["/missing"]))
        except OSError:
            pass  # the client gave up first: what a bounded fetch does


class _ThreadingServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@contextmanager
def hostile_server() -> Iterator[Server]:
    httpd = _ThreadingServer(("127.0.0.1", 0), _Handler)
    port = httpd.server_address[1]
    httpd.record = Server(f"http://127.0.0.1:{port}", port)  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.record  # type: ignore[attr-defined]
    finally:
        httpd.shutdown()
        httpd.server_close()


def closed_port() -> int:
    """A port on 127.0.0.1 nobody listens on."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
