"""The part the tests' loopback HTTP servers share: a threaded server on 127.0.0.1 run in a daemon thread
for the length of a `with` block."""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer
from typing import Self


class LoopbackServer:
    """Serves `server` (bound to 127.0.0.1) inside `with`; `base_url` is its root."""

    def __init__(self, server: ThreadingHTTPServer) -> None:
        self._server = server
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
