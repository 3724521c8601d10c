"""gunicorn run as `raygate webhook` runs it (the KeepAliveThreadWorker, TLS, real sockets) around a test
app, and a raw keep-alive HTTPS/1.1 client that sees exactly what the server sends."""

from __future__ import annotations

import datetime as dt
import os
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from raygate.core import pki
from raygate.devenv.controlplane import free_port

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 20.0  # a connection left unserved this long is a hang, not a slow machine
WORKER = "raygate.webhook.worker.KeepAliveThreadWorker"


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    ca_pem: bytes

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def start(tmp: Path, app: str, *, threads: int = 2, worker: str = WORKER) -> Server:
    """gunicorn with one worker serving `app` ("module:attribute") over TLS on a free port."""
    ca = pki.make_ca("serving-test-ca", dt.timedelta(days=1))
    leaf = pki.make_leaf(ca, "webhook", dt.timedelta(days=1), sans=["127.0.0.1"])
    (tmp / "tls.crt").write_bytes(leaf.cert_pem)
    (tmp / "tls.key").write_bytes(leaf.key_pem)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "--worker-class", worker,
         "--workers", "1", "--threads", str(threads), "--keep-alive", "30", "--graceful-timeout", "10",
         "--bind", f"127.0.0.1:{port}", "--certfile", str(tmp / "tls.crt"), "--keyfile", str(tmp / "tls.key"), app],
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
    server.stop()
    raise AssertionError("gunicorn did not start listening")


@dataclass
class Answer:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes


class Client:
    """One keep-alive TLS connection."""

    def __init__(self, server: Server) -> None:
        ctx = ssl.create_default_context(cadata=server.ca_pem.decode())
        raw = socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT)
        self.sock = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
        self.buf = b""

    def send(self, *bodies: bytes, path: str = "/x") -> None:
        """All requests in one write: pipelined when there are several."""
        self.sock.sendall(b"".join(
            b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s" % (path.encode(), len(b), b)
            for b in bodies))

    def answer(self) -> Answer:
        """The next response, whatever its status."""
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            self._read()
        lines = self.buf[:end].decode().split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers["content-length"])
        while len(self.buf) < end + 4 + length:
            self._read()
        body, self.buf = self.buf[end + 4:end + 4 + length], self.buf[end + 4 + length:]
        return Answer(int(lines[0].split()[1]), headers, body)

    def receive(self) -> bytes:
        """The next response's body; it must be a 200 that keeps the connection open."""
        a = self.answer()
        assert a.status == 200, a
        assert a.headers.get("connection", "").lower() != "close", a
        return a.body

    def closed_by_server(self) -> bool:
        """Whether the server ends the connection (rather than waiting for more) once all was read."""
        try:
            return self.sock.recv(65536) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False

    def _read(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise AssertionError("the server closed a keep-alive connection")
        self.buf += data

    def close(self) -> None:
        self.sock.close()
