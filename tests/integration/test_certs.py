"""`raygate certs ensure` on the real API server: the Secret in raygate-system, the caBundle in raygate's
real webhook configurations, idempotence, renewal inside the window; and a running webhook that serves
the renewed certificate without a restart and without failing a request."""

from __future__ import annotations

import base64
import datetime as dt
import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from waiting import wait

from raygate.core import keys
from raygate.devenv.controlplane import ControlPlane, free_port
from raygate.devenv.registration import configurations

pytestmark = pytest.mark.integration

RAYGATE = Path(sys.executable).parent / "raygate"
SYS = keys.SYSTEM_NAMESPACE
CONFIGS = (("mutatingwebhookconfiguration", keys.MUTATING_WEBHOOK_CONFIG),
           ("validatingwebhookconfiguration", keys.VALIDATING_WEBHOOK_CONFIG))
# Renew a one-year serving certificate now (it expires within 375 days), and issue the next one for
# longer than that window so the run after it keeps it.
RENEW_NOW = ["--renew-before", "9000h", "--serving-validity", "9500h"]


def get(cluster: ControlPlane, *what: str) -> dict[str, Any]:
    data = json.loads(cluster.kubectl("get", *what, "-o", "json"))
    assert isinstance(data, dict)
    return data


def ensure(cluster: ControlPlane, *extra: str) -> str:
    proc = subprocess.run([str(RAYGATE), "certs", "ensure", "--kubeconfig", str(cluster.kubeconfig), *extra],
                          capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stdout.strip()


def secret_data(cluster: ControlPlane) -> dict[str, bytes]:
    secret = get(cluster, "secret", keys.TLS_SECRET, "-n", SYS)
    assert secret["type"] == "kubernetes.io/tls"
    return {k: base64.b64decode(v) for k, v in secret["data"].items()}


def ca_bundles(cluster: ControlPlane) -> list[bytes]:
    out = []
    for kind, name in CONFIGS:
        for hook in get(cluster, kind, name)["webhooks"]:
            out.append(base64.b64decode(hook["clientConfig"].get("caBundle", "")))
    return out


def versions(cluster: ControlPlane) -> dict[str, str]:
    objs = [("secret", keys.TLS_SECRET, "-n", SYS), *CONFIGS]
    return {o[1]: get(cluster, *o)["metadata"]["resourceVersion"] for o in objs}


def leaf(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificates(pem)[0]


@pytest.fixture(scope="module")
def installed(cluster: ControlPlane) -> Iterator[None]:
    """raygate-system and raygate's two webhook configurations (from webhook/registration.py, without
    a caBundle, failurePolicy Ignore so they gate nothing), all removed afterwards."""
    existed = bool(cluster.kubectl("get", "namespace", SYS, "--ignore-not-found", "-o", "name").strip())
    if not existed:
        cluster.kubectl("create", "namespace", SYS)
    # A clean slate, whatever an earlier test module left behind.
    cluster.kubectl("delete", "secret", keys.TLS_SECRET, "-n", SYS, "--ignore-not-found")
    for kind, name in CONFIGS:
        cluster.kubectl("delete", kind, name, "--ignore-not-found")
    for obj in configurations(f"https://127.0.0.1:{free_port()}", b"", "Ignore"):
        for hook in obj["webhooks"]:
            del hook["clientConfig"]["caBundle"]
        cluster.kubectl("create", "-f", "-", input_text=json.dumps(obj))
    yield
    for kind, name in CONFIGS:
        cluster.kubectl("delete", kind, name, "--ignore-not-found")
    cluster.kubectl("delete", "secret", keys.TLS_SECRET, "-n", SYS, "--ignore-not-found")
    if not existed:
        cluster.kubectl("delete", "namespace", SYS, "--wait=true", "--timeout=120s")


@pytest.mark.usefixtures("installed")
class TestEnsureOnTheApiServer:
    """In order: create, repeat, renew, rotate the CA."""

    def test_creates_the_secret_and_injects_the_ca(self, cluster: ControlPlane) -> None:
        assert all(b == b"" for b in ca_bundles(cluster))
        out = ensure(cluster)
        assert out.startswith(f"created Secret {SYS}/{keys.TLS_SECRET}"), out
        data = secret_data(cluster)
        assert set(data) == {"ca.crt", "ca.key", "tls.crt", "tls.key"}
        cert = leaf(data["tls.crt"])
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        svc = f"{keys.WEBHOOK_SERVICE}.{SYS}.svc"
        assert set(sans.get_values_for_type(x509.DNSName)) == {
            keys.WEBHOOK_SERVICE, f"{keys.WEBHOOK_SERVICE}.{SYS}", svc, f"{svc}.cluster.local"}
        left = cert.not_valid_after_utc - dt.datetime.now(dt.UTC)
        assert dt.timedelta(days=364) < left <= dt.timedelta(days=365)
        # Every webhook of both configurations trusts exactly the CA that signed the serving cert.
        bundles = ca_bundles(cluster)
        assert len(bundles) == 2 and all(b == data["ca.crt"] for b in bundles)
        cert.verify_directly_issued_by(leaf(bundles[0]))
        assert "caBundle written to MutatingWebhookConfiguration/raygate-mutating, " \
            "ValidatingWebhookConfiguration/raygate-validating" in out

    def test_second_run_changes_nothing(self, cluster: ControlPlane) -> None:
        before = versions(cluster)
        out = ensure(cluster)
        assert out.startswith(f"unchanged Secret {SYS}/{keys.TLS_SECRET}") and "caBundle up to date" in out, out
        assert versions(cluster) == before

    def test_renews_inside_the_window_keeping_the_ca(self, cluster: ControlPlane) -> None:
        old, before = secret_data(cluster), versions(cluster)
        out = ensure(cluster, *RENEW_NOW)
        assert out.startswith(f"renewed Secret {SYS}/{keys.TLS_SECRET}") and "expires at" in out, out
        new, after = secret_data(cluster), versions(cluster)
        assert leaf(new["tls.crt"]).serial_number != leaf(old["tls.crt"]).serial_number
        assert leaf(new["tls.crt"]).not_valid_after_utc > leaf(old["tls.crt"]).not_valid_after_utc
        assert new["ca.crt"] == old["ca.crt"] and new["ca.key"] == old["ca.key"]
        assert after[keys.TLS_SECRET] != before[keys.TLS_SECRET]
        # Same CA: the webhook configurations are not written at all.
        assert {k: v for k, v in after.items() if k != keys.TLS_SECRET} == \
            {k: v for k, v in before.items() if k != keys.TLS_SECRET}
        # The renewed certificate lies outside the window: the same flags now change nothing.
        again = ensure(cluster, *RENEW_NOW)
        assert again.startswith("unchanged"), again
        assert versions(cluster) == after

    def test_a_ca_inside_the_window_is_replaced_and_both_cas_are_trusted(self, cluster: ControlPlane) -> None:
        old = secret_data(cluster)
        out = ensure(cluster, "--renew-before", "87700h", "--ca-validity", "88000h", "--serving-validity", "88000h")
        assert out.startswith("renewed") and "new CA" in out, out
        new = secret_data(cluster)
        trusted = x509.load_pem_x509_certificates(new["ca.crt"])
        assert [c.serial_number for c in trusted][1:] == [leaf(old["ca.crt"]).serial_number]
        leaf(new["tls.crt"]).verify_directly_issued_by(trusted[0])
        assert all(b == new["ca.crt"] for b in ca_bundles(cluster))


# --- a running webhook picks up a renewed certificate -----------------------------------------------
def served_serial(port: int, ca_file: Path) -> int:
    ctx = ssl.create_default_context(cafile=str(ca_file))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return int(x509.load_der_x509_certificate(der).serial_number)


class Hammer(threading.Thread):
    """GET /healthz in a loop until stopped: every request on a new TLS connection, plus one
    keep-alive connection reused throughout. Records every failure."""

    def __init__(self, port: int, ca_file: Path) -> None:
        super().__init__(daemon=True)
        self.port, self.ctx = port, ssl.create_default_context(cafile=str(ca_file))
        self.stop = threading.Event()
        self.ok = 0
        self.failures: list[str] = []
        self.serials: set[int] = set()

    def _get(self, conn: http.client.HTTPSConnection) -> None:
        conn.request("GET", "/healthz")
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200 or body != b"ok":
            raise RuntimeError(f"HTTP {resp.status} {body[:80]!r}")

    def run(self) -> None:
        kept = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx, timeout=5)
        while not self.stop.is_set():
            for conn, fresh in ((http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx, timeout=5),
                                 True), (kept, False)):
                try:
                    self._get(conn)
                    if fresh and isinstance(conn.sock, ssl.SSLSocket):
                        der = conn.sock.getpeercert(binary_form=True)
                        if der is not None:
                            self.serials.add(x509.load_der_x509_certificate(der).serial_number)
                    self.ok += 1
                except (OSError, ssl.SSLError, http.client.HTTPException, RuntimeError) as exc:
                    self.failures.append(f"{'new' if fresh else 'keep-alive'} connection: {exc!r}")
                finally:
                    if fresh:
                        conn.close()
        kept.close()


@pytest.mark.usefixtures("installed")
def test_running_webhook_serves_a_renewed_certificate_without_restart(cluster: ControlPlane, tmp_path: Path) -> None:
    tls_dir = tmp_path / "tls"
    ensure(cluster, "--extra-san", "127.0.0.1", "--out-dir", str(tls_dir))
    ca_file = tls_dir / "ca.crt"
    first = leaf((tls_dir / "tls.crt").read_bytes()).serial_number

    state = cluster.load_state()
    assert state is not None
    name, port = "certs-test-webhook", free_port()
    cluster.spawn(state, name, [
        sys.executable, "-m", "raygate", "webhook", "--bind", "127.0.0.1", "--port", str(port),
        "--tls-cert-file", str(tls_dir / "tls.crt"), "--tls-key-file", str(tls_dir / "tls.key"),
        "--kubeconfig", str(cluster.kubeconfig), "--namespace", SYS, "--workers", "2", "--threads", "4",
        "--worker-tmp-dir", str(tmp_path),
    ])
    pid = state.pids[name]
    try:
        def up() -> bool:
            try:
                return served_serial(port, ca_file) == first
            except OSError:
                return False

        cluster.wait_for(state, name, up, 60)
        hammer = Hammer(port, ca_file)
        hammer.start()
        wait(lambda: hammer.ok > 0, 30, "the first handshakes before the renewal")
        out = ensure(cluster, "--extra-san", "127.0.0.1", "--out-dir", str(tls_dir), *RENEW_NOW)
        assert out.startswith("renewed") and "tls.crt" in out, out
        second = leaf((tls_dir / "tls.crt").read_bytes()).serial_number
        assert second != first

        # Both workers poll the files (every 10 s); then every new connection sees the new certificate.
        streak = 0

        def settled() -> bool:
            nonlocal streak
            streak = streak + 1 if served_serial(port, ca_file) == second else 0
            return streak >= 10

        try:
            wait(settled, 40, "ten new connections in a row to get the renewed certificate")
        finally:
            hammer.stop.set()
            hammer.join(30)
        assert hammer.failures == [], hammer.failures[:5]
        assert hammer.ok > 50, hammer.ok
        assert {first, second} <= hammer.serials  # the hammer really spanned the rotation
        assert os.path.exists(f"/proc/{pid}") and cluster.load_state().pids[name] == pid  # type: ignore[union-attr]
    finally:
        cluster.stop_process(name)
