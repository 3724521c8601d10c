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
A new connection whose client sends nothing after the TLS handshake goes to the poller too. gthread
waits for a new connection's first bytes (the TLS ClientHello), shakes hands, then blocks its thread
reading the first request. The API server's HTTP client (Go's) dials a new connection when every one
is busy, and when another frees up first it serves the request there and keeps the new one idle for
later, handshake done, no request sent: each such connection held one of the worker's threads until
the client used or closed it, and with 4 threads a burst of creates left none to answer (the API
server gave up on its 5 s webhook timeout, the webhook's log empty).

Everything else (TLS, HTTP parsing, keep-alive timeouts, graceful stop) is gthread's own.

This leans on gthread internals, read in gunicorn's source: from 24.1 `ThreadWorker.handle()` runs
on the pool thread and returns True exactly when the connection stays open (22 and 23 return a
tuple, and the loop below would silently never run), and `conn.parser.unreader.buf` holds what was
read past the last request. From 26.0 a response sent before its request body was read (the 413)
costs at most 64 KiB of that body before the connection closes; before, gthread read all of it. So
the worker runs on gunicorn 26 and 27 only, and refuses to start on any other.
"""

from __future__ import annotations

import select
import threading
from typing import Any

import gunicorn
from gunicorn.workers.gthread import _DEFER, DEFAULT_WORKER_DATA_TIMEOUT, ThreadWorker

# Covers the client's turn-around on a loaded 2-core node; short enough that a stop or a burst of
# new connections never notices it.
LINGER_SECONDS = 0.01
SUPPORTED_GUNICORN = ((26, 0), (28, 0))  # [from, to): keep in step with the pin in pyproject.toml


def check_gunicorn(version: tuple[int, ...]) -> None:
    low, high = SUPPORTED_GUNICORN
    if not low <= tuple(version[:2]) < high:
        raise RuntimeError(
            f"raygate's webhook worker needs gunicorn >={low[0]}.{low[1]},<{high[0]}.{high[1]} (it relies on "
            f"gthread internals of those versions, see webhook/worker.py); this is gunicorn "
            f"{'.'.join(map(str, version))}: install the version pyproject.toml pins"
        )


class KeepAliveThreadWorker(ThreadWorker):  # type: ignore[misc]
    linger_seconds = LINGER_SECONDS

    @classmethod
    def check_config(cls, cfg: Any, log: Any) -> None:
        # The arbiter calls this before it starts any worker; gunicorn prints the message and exits 1.
        check_gunicorn(gunicorn.version_info)
        super().check_config(cfg, log)

    def init_process(self) -> None:
        self._handling = 0  # pool threads inside handle(): serving or lingering
        self._handling_lock = threading.Lock()
        self._threads = self.cfg.threads
        super().init_process()

    def handle(self, conn: Any) -> Any:
        with self._handling_lock:
            self._handling += 1
        try:
            if not conn.initialized:
                ready = self._first_request_ready(conn)
                if ready is None:
                    return False  # the handshake failed: closed, as gthread does
                if not ready:
                    return _DEFER  # on the poller until the client sends its first request
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

    def _first_request_ready(self, conn: Any) -> bool | None:
        """A new connection: its TLS handshake done here, then whether its first request is arriving (None: the
        handshake failed)."""
        if not conn.data_ready and not conn.wait_for_data(DEFAULT_WORKER_DATA_TIMEOUT):
            return False  # not even a ClientHello yet
        try:
            conn.sock.setblocking(True)
            conn.init()  # the handshake (and the HTTP parser); gthread's handle() skips it once done
        except OSError as err:  # ssl.SSLError included: a client that left, or spoke no TLS
            self.log.debug("TLS handshake failed: %s", err)
            return None
        if getattr(conn.sock, "pending", lambda: 0)():
            return True
        poller = select.poll()
        poller.register(conn.sock, select.POLLIN)
        return bool(poller.poll(self.linger_seconds * 1000))

    def _next_request_ready(self, conn: Any) -> bool:
        # Bytes already read past the last request, or decrypted and held by TLS, never make the
        # socket readable again: serve them now.
        if conn.parser.unreader.buf.getvalue() or getattr(conn.sock, "pending", lambda: 0)():
            return True
        if self._handling >= self._threads:  # no idle thread left for other connections
            return False
        poller = select.poll()
        poller.register(conn.sock, select.POLLIN)
        return bool(poller.poll(self.linger_seconds * 1000))
