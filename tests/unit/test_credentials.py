"""raygate reads a service account, a client certificate or a token itself, and leaves every other kind of
kubeconfig to the `kubernetes` package, which it then imports only for that."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from raygate.kube import credentials
from raygate.kube.credentials import CredentialsError


def kubeconfig(tmp_path: Path, user: dict[str, Any], cluster: dict[str, Any] | None = None) -> Path:
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": "dev",
        "clusters": [{"name": "c", "cluster": cluster or {"server": "https://127.0.0.1:6443/",
                                                          "certificate-authority": "pki/ca.crt"}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "other", "context": {"cluster": "nowhere", "user": "nobody"}},
                     {"name": "dev", "context": {"cluster": "c", "user": "u"}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(doc))
    return path


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_a_client_certificate_kubeconfig_is_read_with_paths_relative_to_it(tmp_path: Path) -> None:
    found = credentials.load(str(kubeconfig(tmp_path, {"client-certificate": "pki/admin.crt",
                                                       "client-key": "/abs/admin.key"})))
    assert found is not None
    assert (found.host, found.ssl_ca_cert, found.cert_file, found.key_file, found.verify_ssl) == (
        "https://127.0.0.1:6443", str(tmp_path / "pki/ca.crt"), str(tmp_path / "pki/admin.crt"), "/abs/admin.key", True)
    assert found.auth_settings() == {}


def test_data_fields_become_private_files_with_their_decoded_content(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path, {"client-certificate-data": b64("CERT"), "client-key-data": b64("KEY")},
                      {"server": "https://10.0.0.1", "certificate-authority-data": b64("CA")})
    found = credentials.load(str(path))
    assert found is not None and found.ssl_ca_cert and found.cert_file and found.key_file
    assert [Path(p).read_text() for p in (found.ssl_ca_cert, found.cert_file, found.key_file)] == ["CA", "CERT", "KEY"]
    assert Path(found.key_file).stat().st_mode & 0o077 == 0


def test_bad_base64_is_refused_with_the_field_named(tmp_path: Path) -> None:
    with pytest.raises(CredentialsError, match="client-key-data"):
        credentials.load(str(kubeconfig(tmp_path, {"client-certificate-data": b64("C"), "client-key-data": "%%"})))


@pytest.mark.parametrize(("user", "header"), [
    ({"token": "abc"}, "Bearer abc"),
    ({"tokenFile": "token"}, "Bearer from-file"),
])
def test_a_token_is_sent_as_a_bearer_header(tmp_path: Path, user: dict[str, Any], header: str) -> None:
    (tmp_path / "token").write_text("from-file\n")
    found = credentials.load(str(kubeconfig(tmp_path, user)))
    assert found is not None
    assert found.auth_settings()["BearerToken"]["value"] == header


def test_insecure_skip_tls_verify_turns_verification_off(tmp_path: Path) -> None:
    found = credentials.load(str(kubeconfig(tmp_path, {"token": "t"}, {"server": "https://x",
                                                                      "insecure-skip-tls-verify": True})))
    assert found is not None and not found.verify_ssl and found.ssl_ca_cert is None


@pytest.mark.parametrize("user", [
    {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "aws"}},
    {"auth-provider": {"name": "oidc"}},
    {"username": "admin", "password": "secret"},
    {"client-certificate": "a.crt", "client-key": "a.key", "as": "someone"},
])
def test_any_other_user_is_left_to_the_kubernetes_package(tmp_path: Path, user: dict[str, Any]) -> None:
    assert credentials.load(str(kubeconfig(tmp_path, user))) is None


def test_a_proxy_or_a_missing_context_is_left_to_the_kubernetes_package(tmp_path: Path) -> None:
    assert credentials.load(str(kubeconfig(tmp_path, {"token": "t"}, {"server": "https://x",
                                                                      "proxy-url": "http://p"}))) is None
    path = kubeconfig(tmp_path, {"token": "t"})
    doc = json.loads(path.read_text())
    doc["current-context"] = "gone"
    path.write_text(json.dumps(doc))
    assert credentials.load(str(path)) is None
    assert credentials.load(str(tmp_path / "no-such-file")) is None


def test_several_files_in_kubeconfig_are_left_to_the_kubernetes_package(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path, {"token": "t"})
    assert credentials.load(None, environ={"KUBECONFIG": f"{path}:{path}"}, account_dir=tmp_path / "none") is None
    assert credentials.load(None, environ={"KUBECONFIG": str(path)}, account_dir=tmp_path / "none") is not None


def service_account(tmp_path: Path) -> Path:
    account = tmp_path / "sa"
    account.mkdir()
    (account / "token").write_text("first")
    (account / "ca.crt").write_text("CA")
    return account


@pytest.mark.parametrize(("host", "url"), [("10.96.0.1", "https://10.96.0.1:443"),
                                           ("fd00::1", "https://[fd00::1]:443")])
def test_in_a_pod_the_service_account_is_used(tmp_path: Path, host: str, url: str) -> None:
    account = service_account(tmp_path)
    env = {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": "443"}
    found = credentials.load(None, environ=env, account_dir=account)
    assert found is not None and found.host == url and found.ssl_ca_cert == str(account / "ca.crt")
    assert found.auth_settings()["BearerToken"]["value"] == "Bearer first"


def test_a_rotated_service_account_token_is_read_again(tmp_path: Path) -> None:
    account = service_account(tmp_path)
    token = credentials._TokenFile(account / "token", refresh=0)
    (account / "token").write_text("rotated")
    assert token() == "rotated"
    (account / "token").write_text("")  # caught mid-rotation: the last good token is kept
    assert token() == "rotated"


def test_outside_a_pod_without_a_kubeconfig_nothing_is_found(tmp_path: Path) -> None:
    assert credentials.load(None, environ={"KUBECONFIG": str(tmp_path / "missing")},
                            account_dir=service_account(tmp_path)) is None


def _imports_kubernetes(path: Path) -> bool:
    code = ("import sys; from raygate.kube.client import Kube; k = Kube.connect(sys.argv[1]); "
            "print(k.host, 'kubernetes' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()[-1] == "True"


def test_connect_imports_the_kubernetes_package_only_for_what_raygate_does_not_read(tmp_path: Path) -> None:
    for d in (tmp_path / "pki", tmp_path / "basic" / "pki"):
        d.mkdir(parents=True)
        (d / "ca.crt").write_text("CA")
    plain = kubeconfig(tmp_path, {"token": "t"})
    assert not _imports_kubernetes(plain)
    basic = kubeconfig(tmp_path / "basic", {"username": "admin", "password": "secret"})
    assert _imports_kubernetes(basic)
