"""The webhook's gunicorn worker (gthread that keeps a busy keep-alive connection on its thread),
run as `raygate webhook` runs it: gunicorn over TLS, real sockets, an app that echoes each body."""

from __future__ import annotations

import datetime as dt
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from raygate.core import pki
from raygate.devenv.controlplane import free_port

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 20.0  # a connection left unserved this long is a hang, not a slow machine


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    ca_pem: bytes


def _start(tmp: Path, threads: int) -> Server:
    ca = pki.make_ca("worker-test-ca", dt.timedelta(days=1))
    leaf = pki.make_leaf(ca, "webhook", dt.timedelta(days=1), sans=["127.0.0.1"])
    (tmp / "tls.crt").write_bytes(leaf.cert_pem)
    (tmp / "tls.key").write_bytes(leaf.key_pem)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "--worker-class", "raygate.webhook.worker.KeepAliveThreadWorker",
         "--workers", "1", "--threads", str(threads), "--keep-alive", "30", "--graceful-timeout", "10",
         "--bind", f"127.0.0.1:{port}", "--certfile", str(tmp / "tls.crt"), "--keyfile", str(tmp / "tls.key"),
         "tests.apps.echo:app"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.PIPE,
    )
    server = Server(proc, port, ca.cert_pem)
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        try:
            Client(server).close()
            return server
        except OSError:
            if proc.poll() is not None:
                raise AssertionError(f"gunicorn exited: {proc.stderr.read().decode() if proc.stderr else ''}") from None
            time.sleep(0.1)
    raise AssertionError("gunicorn did not start listening")


@pytest.fixture
def server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Server]:
    s = _start(tmp_path, getattr(request, "param", 2))
    yield s
    if s.proc.poll() is None:
        s.proc.kill()
    s.proc.wait()


class Client:
    """One keep-alive TLS connection that fails loudly if the server closes it."""

    def __init__(self, server: Server) -> None:
        ctx = ssl.create_default_context(cadata=server.ca_pem.decode())
        raw = socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT)
        self.sock = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
        self.buf = b""

    def send(self, *bodies: bytes) -> None:
        """All requests in one write: pipelined when there are several."""
        self.sock.sendall(b"".join(
            b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s" % (len(b), b) for b in bodies))

    def receive(self) -> bytes:
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            self._read()
        head = self.buf[:end].decode()
        assert head.startswith("HTTP/1.1 200"), head
        assert "connection: close" not in head.lower(), head
        length = next(int(line.split(":")[1]) for line in head.split("\r\n")
                      if line.lower().startswith("content-length"))
        while len(self.buf) < end + 4 + length:
            self._read()
        body, self.buf = self.buf[end + 4:end + 4 + length], self.buf[end + 4 + length:]
        return body

    def _read(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise AssertionError("the server closed a keep-alive connection")
        self.buf += data

    def close(self) -> None:
        self.sock.close()


def test_one_connection_serves_many_requests_in_order(server: Server) -> None:
    c = Client(server)
    for i in range(200):
        c.send(b"review %d" % i)
        assert c.receive() == b"review %d" % i
    c.close()


def test_pipelined_requests_are_all_answered_in_order(server: Server) -> None:
    c = Client(server)
    for round_ in range(20):
        bodies = [b"r%d-%d" % (round_, i) * 50 for i in range(3)]
        c.send(*bodies)
        assert [c.receive() for _ in bodies] == bodies
    c.close()


@pytest.mark.parametrize("server", [1, 2], indirect=True, ids=["1-thread", "2-threads"])
def test_more_busy_connections_than_threads_are_all_served(server: Server) -> None:
    """Connections beyond the thread count wait their turn on the poller and are never starved by
    threads that keep their own connection."""
    errors: list[str] = []
    answered = [0] * 6

    def run(n: int) -> None:
        try:
            c = Client(server)
            for i in range(40):
                c.send(b"c%d-%d" % (n, i))
                assert c.receive() == b"c%d-%d" % (n, i)
                answered[n] += 1
            c.close()
        except (AssertionError, OSError) as err:
            errors.append(f"connection {n}: {err!r}")

    threads = [threading.Thread(target=run, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert answered == [40] * 6


def test_idle_connection_is_picked_up_again_after_a_pause(server: Server) -> None:
    """A pause longer than the linger hands the connection back to the poller; the next request on
    it is still answered."""
    c = Client(server)
    c.send(b"before")
    assert c.receive() == b"before"
    time.sleep(0.3)
    c.send(b"after")
    assert c.receive() == b"after"
    c.close()


def test_sigterm_stops_the_server_while_connections_are_kept_alive(server: Server) -> None:
    clients = []
    for i in range(3):  # each sends at once: gthread gives a thread to a connection until its first request
        c = Client(server)
        c.send(b"hello %d" % i)
        assert c.receive() == b"hello %d" % i
        clients.append(c)
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=TIMEOUT) == 0
    for c in clients:
        c.close()
