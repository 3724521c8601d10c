"""What the review routes read from a client, called as a WSGI server calls them: a body over the
limit is refused without being read, a chunked one is read only up to the limit, and large bodies
are read one at a time per worker while small ones go ahead."""

from __future__ import annotations

import io
import sys
import threading
from typing import Any

import orjson
import pytest
from builders import RayJob, review
from flask import Flask

from raygate.kube.configsource import ConfigSource
from raygate.webhook.app import create_app
from raygate.webhook.body_limits import BodyLimits
from raygate.webhook.state import WebhookState

TIMEOUT = 20.0  # a request still unanswered after this long is stuck, not slow


def _app(limits: BodyLimits) -> Flask:
    s = WebhookState(config_source=ConfigSource(None).start())
    s.certificate_loaded.set()
    app = create_app(s, limits)
    app.config["PROPAGATE_EXCEPTIONS"] = True
    return app


def _call(app: Flask, stream: io.BytesIO, length: int | None, path: str = "/mutate") -> tuple[int, bytes]:
    """One request as gunicorn hands it over: with a Content-Length, or chunked (None) and a stream the
    server ends after the last chunk."""
    environ: dict[str, Any] = {
        "REQUEST_METHOD": "POST", "PATH_INFO": path, "SCRIPT_NAME": "", "QUERY_STRING": "", "SERVER_NAME": "localhost",
        "SERVER_PORT": "9443", "SERVER_PROTOCOL": "HTTP/1.1", "CONTENT_TYPE": "application/json", "wsgi.input": stream,
        "wsgi.input_terminated": True, "wsgi.url_scheme": "https", "wsgi.errors": sys.stderr, "wsgi.multithread": True,
        "wsgi.multiprocess": True, "wsgi.run_once": False, "wsgi.version": (1, 0)}
    if length is None:
        environ["HTTP_TRANSFER_ENCODING"] = "chunked"
    else:
        environ["CONTENT_LENGTH"] = str(length)
    seen: list[str] = []
    body = b"".join(app.wsgi_app(environ, lambda status, headers, exc_info=None: seen.append(status)))
    return int(seen[0].split()[0]), body


class _Unreadable(io.BytesIO):
    def read(self, size: int | None = -1) -> bytes:
        raise AssertionError("this body must not be read")


def test_a_body_over_the_limit_is_refused_unread() -> None:
    status, body = _call(_app(BodyLimits(max_body=1000)), _Unreadable(), 50 * 1024 * 1024)
    assert status == 413
    assert orjson.loads(body)["error"] == ("request body of 52428800 bytes is larger than the 1000 bytes raygate "
                                           "accepts (--max-request-bytes)")


def test_without_a_length_a_body_the_server_does_not_end_is_not_read() -> None:
    """No Content-Length, no chunked framing the server ends (wsgi.input_terminated): a read could wait
    on the next request, so nothing is read and the empty body is a bad review."""
    s = WebhookState(config_source=ConfigSource(None).start())
    environ: dict[str, Any] = {"REQUEST_METHOD": "POST", "PATH_INFO": "/mutate", "wsgi.input": _Unreadable()}
    seen: list[str] = []
    body = b"".join(create_app(s).wsgi_app(environ, lambda status, headers, exc_info=None: seen.append(status)))
    assert seen == ["400 Bad Request"] and b"error" in body


class _Endless(io.BytesIO):
    def read(self, size: int | None = -1) -> bytes:
        assert size is not None and size >= 0, "an unbounded read of a chunked body"
        return b"x" * size


def test_a_chunked_body_is_read_up_to_the_limit_only() -> None:
    status, body = _call(_app(BodyLimits(max_body=1000)), _Endless(), None)
    assert status == 413 and b"larger than the 1000 bytes raygate accepts" in body
    data = orjson.dumps(review(RayJob("t").obj(), uid="u1"))
    status, body = _call(_app(BodyLimits(max_body=len(data))), io.BytesIO(data), None)
    assert status == 200 and orjson.loads(body)["response"]["uid"] == "u1"  # exactly at the limit
    status, body = _call(_app(BodyLimits(max_body=len(data) - 1)), io.BytesIO(data), None)
    assert status == 413  # one byte over


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_a_body_with_a_content_length_is_read_once(path: str) -> None:
    class Counted(io.BytesIO):
        reads: list[int | None] = []

        def read(self, size: int | None = -1) -> bytes:
            self.reads.append(size)
            return super().read(size)

    data = orjson.dumps(review(RayJob("t").obj(), uid="u1"))
    stream = Counted(data)
    status, body = _call(_app(BodyLimits()), stream, len(data), path)
    assert status == 200 and orjson.loads(body)["response"]["uid"] == "u1"
    assert stream.reads == [len(data)]


class _Slot:
    """The large-body slot, counting who takes it and noting when someone had to wait for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.taken = 0
        self.contended = threading.Event()

    def __enter__(self) -> None:
        if not self._lock.acquire(blocking=False):
            self.contended.set()
            self._lock.acquire()
        self.taken += 1

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


class _Held(io.BytesIO):
    """A body whose reading starts when asked and ends only when the test says so."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.reading = threading.Event()
        self.release = threading.Event()

    def read(self, size: int | None = -1) -> bytes:
        self.reading.set()
        assert self.release.wait(TIMEOUT)
        return super().read(size)


def test_large_bodies_are_read_one_at_a_time_and_small_ones_never_wait_for_them() -> None:
    limits = BodyLimits(max_body=10_000, large=100)
    slot = limits._large_slot = _Slot()  # type: ignore[assignment]
    app = _app(limits)
    answered: dict[str, int] = {}

    def send(name: str, stream: io.BytesIO, length: int) -> threading.Thread:
        t = threading.Thread(target=lambda: answered.__setitem__(name, _call(app, stream, length)[0]), daemon=True)
        t.start()
        return t

    first, second = _Held(b"{" * 5000), _Held(b"{" * 5000)
    threads = [send("first", first, 5000)]
    assert first.reading.wait(TIMEOUT)
    threads.append(send("second", second, 5000))
    assert slot.contended.wait(TIMEOUT), "the second large body did not wait for the slot"
    assert not second.reading.is_set()  # it waits before reading a byte

    small = send("small", io.BytesIO(b"{" * 50), 50)  # while the first large body still holds the slot
    small.join(TIMEOUT)
    assert answered.get("small") == 400, "a small body waited behind a large one"

    first.release.set()
    second.release.set()
    for t in threads:
        t.join(TIMEOUT)
    assert answered == {"small": 400, "first": 400, "second": 400}
    assert slot.taken == 2  # the two large bodies; the small one never took the slot
