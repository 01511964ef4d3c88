"""A loopback HTTP proxy in front of a REST catalog that counts its requests by method and route: SeaweedFS
counts its S3 requests, not its catalog's. Headers and bodies pass untouched (the Host header too, so a
request's SigV4 signature still holds)."""

from __future__ import annotations

import http.client
import re
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# /v1/{prefix}/namespaces/{ns}/tables/{table}: names replaced, so routes count together.
_ROUTES = [
    (re.compile(r"/tables/[^/]+"), "/tables/{table}"),
    (re.compile(r"/namespaces/[^/]+"), "/namespaces/{ns}"),
    (re.compile(r"^/v1/(?!config)[^/]+/"), "/v1/{prefix}/"),
]


class CountingProxy:
    """Listens on 127.0.0.1 (a free port: :attr:`url`) and forwards to the catalog on ``target_port``."""

    def __init__(self, target_port: int) -> None:
        self.counts: Counter[str] = Counter()
        counts, lock = self.counts, threading.Lock()

        class Forward(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet: the benchmark's log is its own
                pass

            def forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                route = self.path.split("?", 1)[0]
                for pattern, name in _ROUTES:
                    route = pattern.sub(name, route)
                with lock:
                    counts[f"{self.command} {route}"] += 1
                upstream = http.client.HTTPConnection("127.0.0.1", target_port, timeout=300)
                try:
                    upstream.request(self.command, self.path, body=body, headers=dict(self.headers.items()))
                    reply = upstream.getresponse()
                    data = reply.read()
                finally:
                    upstream.close()
                self.send_response(reply.status, reply.reason)
                for name, value in reply.getheaders():
                    if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Forward)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, name="catalog-proxy", daemon=True).start()

    def snapshot(self) -> Counter[str]:
        return Counter(self.counts)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
