"""A worker and app for keep-alive tests: each response names the thread that served it and how many
connections the worker has handed to its thread pool so far (on accept, and on each return from the
poller), so a test can see a request served without the round trip through the poller."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from raygate.webhook.worker import KeepAliveThreadWorker

_handoffs = 0  # changed only by the worker's main thread


class CountingWorker(KeepAliveThreadWorker):
    # Waits out the client's turn-around however slow the machine: what is tested is that the next
    # request is served on the same thread at all, not how soon it must come.
    linger_seconds = 10.0

    def enqueue_req(self, conn: Any) -> None:
        global _handoffs
        _handoffs += 1
        super().enqueue_req(conn)


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    length = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(length) if length else b""
    start_response("200 OK", [("Content-Type", "application/octet-stream"), ("Content-Length", str(len(body))),
                              ("X-Thread", str(threading.get_ident())), ("X-Handoffs", str(_handoffs))])
    return [body]
