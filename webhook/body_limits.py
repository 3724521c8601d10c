"""What one webhook worker reads from a client: bounded, whatever the client sends.

Only the API server should call the webhook, but anything that reaches its port can: a body larger
than any review is refused unread, and large bodies are parsed one at a time per worker.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import orjson

# The largest object etcd stores is 1.5 MiB and the API server takes request bodies of up to 3 MiB; a
# review carries the object twice (object and oldObject). Twice that again leaves room to spare.
DEFAULT_MAX_BODY = 6 * 1024 * 1024
# A body this large (no real RayJob comes close) is read and parsed by one thread of a worker at a
# time: a 6 MiB review takes about 45 MB once parsed, so several at once could exhaust the pod.
LARGE_BODY = 1024 * 1024


class BodyLimits:
    """Bounds on what one worker reads: a maximum body, and one large body at a time."""

    def __init__(self, max_body: int = DEFAULT_MAX_BODY, large: int = LARGE_BODY) -> None:
        self.max_body = max_body
        self.large = large
        self._large_slot = threading.Lock()

    def too_large(self, length: int) -> bool:
        return length > self.max_body

    @contextlib.contextmanager
    def reading(self, length: int | None) -> Iterator[None]:
        """Hold the worker's one large-body slot while a body of `length` (None: unknown) is read and decided."""
        if length is not None and length <= self.large:
            yield
            return
        with self._large_slot:
            yield

    def refusal(self, length: int | None) -> bytes:
        size = f"of {length} bytes " if length is not None else ""
        return orjson.dumps({"error": f"request body {size}is larger than the {self.max_body} bytes raygate accepts "
                                      "(--max-request-bytes)"})
