"""A local HTTP endpoint for tests of ``curl()``: it records every request and answers by
path (``/api/slow`` late, ``/api/big`` 4 KiB, ``/api/unsized`` 4 KiB without a length,
``/api/text`` text, ``/api/away`` a redirect out of ``/api``, ``/api/missing`` a 404 with
JSON, anything else the request itself as JSON)."""

from __future__ import annotations

import contextlib
import json
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass
class Seen:
    """The requests the server received: method, path, query, headers, body."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def paths(self) -> list[str]:
        with self.lock:
            return [request["path"] for request in self.requests]


class _Handler(BaseHTTPRequestHandler):
    seen: Seen

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""

    def _handle(self) -> None:
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        request = {
            "method": self.command,
            "path": parts.path,
            "query": parse_qs(parts.query),
            "authorization": self.headers.get("Authorization"),
            "trace": self.headers.get("X-Trace"),
            "host": self.headers.get("Host"),
            "contentType": self.headers.get("Content-Type"),
            "body": body,
        }
        with self.seen.lock:
            self.seen.requests.append(request)
        if parts.path == "/api/slow":
            time.sleep(1.5)
            self._reply(200, "text/plain", b"late")
        elif parts.path == "/api/big":
            self._reply(200, "application/octet-stream", b"x" * 4096)
        elif parts.path == "/api/unsized":  # no Content-Length: read until the close
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(b"y" * 4096)
        elif parts.path == "/api/text":
            self._reply(200, "text/plain; charset=utf-8", b"plain words")
        elif parts.path == "/api/away":
            self.send_response(302)
            self.send_header("Location", "/private/data")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif parts.path == "/api/missing":
            self._reply(404, "application/json", b'{"error": "no such thing"}')
        else:
            self._reply(200, "application/json", json.dumps(request).encode())

    def _reply(self, status: int, content_type: str, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            with contextlib.suppress(BrokenPipeError):  # past the caller's time limit
                self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _handle  # noqa: N815


@dataclass
class Server:
    base: str
    """``http://127.0.0.1:PORT`` (``https://`` with TLS)."""
    seen: Seen


@contextlib.contextmanager
def http_endpoint(tls: ssl.SSLContext | None = None) -> Iterator[Server]:
    """Serve on a free port of 127.0.0.1 until the block ends; HTTPS with ``tls``."""
    seen = Seen()
    handler = type("Handler", (_Handler,), {"seen": seen})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    if tls is not None:
        httpd.socket = tls.wrap_socket(httpd.socket, server_side=True)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        scheme = "https" if tls is not None else "http"
        yield Server(f"{scheme}://127.0.0.1:{httpd.server_address[1]}", seen)
    finally:
        httpd.shutdown()
        httpd.server_close()
