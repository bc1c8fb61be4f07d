"""A webhook receiver on 127.0.0.1 (stdlib http.server in a thread): what supervise's notifier
posts lands in ``requests``.

Paths pick the server's behaviour: /ok/… answers 200, /fail/… 500, /hang/… never answers
(until ``close``), /bad/… 400. Each URL carries ``TOKEN``, a secret the journal must never show.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN = "T0KEN-s3cr3t-XYZ"


class Server:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                outer.requests.append({"path": self.path, "body": body,
                                       "headers": {k.lower(): v for k, v in self.headers.items()},
                                       "t": time.monotonic()})
                if self.path.startswith("/hang"):
                    outer.release.wait(30)
                    return
                code = 500 if self.path.startswith("/fail") else 400 if self.path.startswith("/bad") else 200
                self.send_response(code)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, kind: str) -> str:
        return f"{self.base}/{kind}/{TOKEN}"

    def hits(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["path"].startswith("/" + kind)]

    def close(self) -> None:
        """Answer the hanging requests, stop serving and free the port."""
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
