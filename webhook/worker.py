"""gunicorn's gthread worker, keeping a busy keep-alive connection on the thread that served it.

The stock gthread worker hands every kept-alive connection back to its main thread after each
response: the main thread re-registers it with the poller, wakes when the next request arrives,
and submits it to the thread pool again. For a webhook whose client (the API server) sends the
next review on the same connection within a millisecond or two, that round trip through two
threads, a pipe and epoll cost more CPU than the admission decision itself.

Here the thread that answered waits a short while (`LINGER_SECONDS`) for the next request on the
same connection and serves it directly. It only waits while another pool thread is idle, so a new
connection or another readable one is never kept waiting behind a lingering thread; when every
thread is busy, or nothing arrives in time, the connection goes back to the poller as before.
Everything else (TLS, HTTP parsing, keep-alive timeouts, graceful stop) is gthread's own.
"""

from __future__ import annotations

import select
import threading
from typing import Any

from gunicorn.workers.gthread import ThreadWorker

# Covers the client's turn-around on a loaded 2-core node; short enough that a stop or a burst of
# new connections never notices it.
LINGER_SECONDS = 0.01


class KeepAliveThreadWorker(ThreadWorker):  # type: ignore[misc]
    def init_process(self) -> None:
        self._handling = 0  # pool threads inside handle(): serving or lingering
        self._handling_lock = threading.Lock()
        self._threads = self.cfg.threads
        super().init_process()

    def handle(self, conn: Any) -> Any:
        with self._handling_lock:
            self._handling += 1
        try:
            while True:
                keep = super().handle(conn)
                # Anything but "served, keep alive" (close, defer to the poller, stopping) is
                # gthread's business, unchanged.
                if keep is not True or not self.alive:
                    return keep
                if not self._next_request_ready(conn):
                    return keep
        finally:
            with self._handling_lock:
                self._handling -= 1

    def _next_request_ready(self, conn: Any) -> bool:
        # Bytes already read past the last request, or decrypted and held by TLS, never make the
        # socket readable again: serve them now.
        if conn.parser.unreader.buf.getvalue() or getattr(conn.sock, "pending", lambda: 0)():
            return True
        if self._handling >= self._threads:  # no idle thread left for other connections
            return False
        poller = select.poll()
        poller.register(conn.sock, select.POLLIN)
        return bool(poller.poll(LINGER_SECONDS * 1000))
