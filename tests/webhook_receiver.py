"""A webhook receiver on loopback for alert tests (a real HTTP server, port 0)."""
from __future__ import annotations

import http.server
import json
import threading


class Receiver:
    """A webhook receiver on loopback (port 0) that keeps every JSON body POSTed to it."""

    def __init__(self):
        self.bodies: list[dict] = []
        self.content_types: list[str] = []
        self.cv = threading.Condition()
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                n = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(n))
                with outer.cv:
                    outer.bodies.append(body)
                    outer.content_types.append(self.headers.get("Content-Type", ""))
                    outer.cv.notify_all()
                self.send_response(204)
                self.end_headers()

            def log_message(self, *a):
                pass
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
