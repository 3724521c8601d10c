"""Where the API server is and how to prove who we are, read without the `kubernetes` package.

Importing `kubernetes` (any part of it runs the package's __init__, which loads its whole client, requests,
oauthlib, websocket-client, dateutil, ...) costs about 8 MB of memory in every process that does, and
raygate's webhook and reconciler use nothing of it but the loading of credentials. The two cases every
install meets are read here: a pod's service account (the token re-read every minute, as the `kubernetes`
package and client-go do, since bound tokens rotate), and a kubeconfig whose user has a client certificate
or a bearer token. Anything else a kubeconfig can say (exec plugins, auth providers, basic auth, proxies,
several files in $KUBECONFIG) makes `load` answer None, and the caller falls back to the `kubernetes`
package, which reads them all.

The result has the attribute names of the `kubernetes` package's Configuration that `Kube` reads, so
either one can be handed to it.
"""

from __future__ import annotations

import atexit
import base64
import binascii
import contextlib
import os
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from raygate.core.errors import RaygateError

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REFRESH_SECONDS = 60.0
# What a kubeconfig may say for `load` to read it; any other key means the `kubernetes` package reads it.
CLUSTER_KEYS = frozenset({"server", "certificate-authority", "certificate-authority-data", "insecure-skip-tls-verify",
                          "extensions"})
USER_KEYS = frozenset({"client-certificate", "client-certificate-data", "client-key", "client-key-data", "token",
                       "tokenFile", "extensions"})


class CredentialsError(RaygateError):
    """The credentials were found but cannot be used as they are."""


@dataclass
class Credentials:
    """What `Kube` needs: the server, how to check it, and how to authenticate (attribute names as the
    `kubernetes` package's Configuration has them)."""

    host: str
    ssl_ca_cert: str | None = None
    verify_ssl: bool = True
    cert_file: str | None = None
    key_file: str | None = None
    token: Callable[[], str | None] = field(default=lambda: None, repr=False)

    def auth_settings(self) -> dict[str, dict[str, str]]:
        token = self.token()
        if not token:
            return {}
        return {"BearerToken": {"in": "header", "key": "authorization", "value": f"Bearer {token}"}}


class _TokenFile:
    """A token read from a file, again once it is older than `refresh` seconds."""

    def __init__(self, path: Path, refresh: float = TOKEN_REFRESH_SECONDS) -> None:
        self.path = path
        self.refresh = refresh
        self._lock = threading.Lock()
        self._token = self._read()
        self._read_at = time.monotonic()

    def _read(self) -> str:
        token = self.path.read_text().strip()
        if not token:
            raise CredentialsError(f"the token file {self.path} is empty")
        return token

    def __call__(self) -> str | None:
        with self._lock:
            if time.monotonic() - self._read_at >= self.refresh:
                with contextlib.suppress(OSError, CredentialsError):  # keep the last good token
                    self._token = self._read()
                self._read_at = time.monotonic()
            return self._token


def in_cluster(environ: Mapping[str, str] = os.environ, account_dir: Path = SERVICE_ACCOUNT_DIR) -> Credentials | None:
    """The pod's service account, or None outside a pod."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    token, ca = account_dir / "token", account_dir / "ca.crt"
    if not host or not port or not token.is_file() or not ca.is_file():
        return None
    hostport = f"[{host}]:{port}" if ":" in host or "%" in host else f"{host}:{port}"
    return Credentials(host=f"https://{hostport}", ssl_ca_cert=str(ca), token=_TokenFile(token))


def _data_file(value: Any, what: str) -> str:
    """A kubeconfig's base64 `-data` field as a file only this user can read (TLS libraries want files),
    removed at exit."""
    try:
        data = base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError):
        raise CredentialsError(f"the kubeconfig's {what} is not valid base64") from None
    fd, path = tempfile.mkstemp(prefix="raygate-kubeconfig-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    atexit.register(lambda: Path(path).unlink(missing_ok=True))
    return path


def _path(base: Path, value: Any) -> str:
    p = Path(str(value)).expanduser()
    return str(p if p.is_absolute() else base / p)


def _named(items: Any, name: Any, what: str) -> dict[str, Any] | None:
    for item in items or []:
        if isinstance(item, Mapping) and item.get("name") == name and isinstance(item.get(what), Mapping):
            return dict(item[what])
    return None


def from_kubeconfig(path: Path) -> Credentials | None:
    """The current context of the kubeconfig at `path`; None when it uses anything but a client certificate,
    a token or a token file (the `kubernetes` package reads those)."""
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, Mapping):
        return None
    context = _named(doc.get("contexts"), doc.get("current-context"), "context")
    if context is None:
        return None
    cluster = _named(doc.get("clusters"), context.get("cluster"), "cluster")
    user = _named(doc.get("users"), context.get("user"), "user") if context.get("user") else {}
    if cluster is None or user is None or set(cluster) - CLUSTER_KEYS or set(user) - USER_KEYS:
        return None
    server = str(cluster.get("server") or "")
    if not server:
        return None
    base = path.resolve().parent
    ca: str | None = None
    if cluster.get("certificate-authority-data"):
        ca = _data_file(cluster["certificate-authority-data"], "certificate-authority-data")
    elif cluster.get("certificate-authority"):
        ca = _path(base, cluster["certificate-authority"])

    def pem(key: str) -> str | None:
        if user.get(f"{key}-data"):
            return _data_file(user[f"{key}-data"], f"{key}-data")
        return _path(base, user[key]) if user.get(key) else None

    token: Callable[[], str | None] = lambda: None  # noqa: E731
    if user.get("token"):
        value = str(user["token"])
        token = lambda: value  # noqa: E731
    elif user.get("tokenFile"):
        token = _TokenFile(Path(_path(base, user["tokenFile"])))
    return Credentials(host=server.rstrip("/"), ssl_ca_cert=ca, verify_ssl=not cluster.get("insecure-skip-tls-verify"),
                       cert_file=pem("client-certificate"), key_file=pem("client-key"), token=token)


def load(kubeconfig: str | None, environ: Mapping[str, str] = os.environ,
         account_dir: Path = SERVICE_ACCOUNT_DIR) -> Credentials | None:
    """As `Kube.connect` looks for them: the kubeconfig given; else the pod's service account; else
    $KUBECONFIG or ~/.kube/config. None: read them with the `kubernetes` package instead."""
    if not kubeconfig:
        found = in_cluster(environ, account_dir)
        if found is not None:
            return found
        env = environ.get("KUBECONFIG", "")
        if os.pathsep in env:
            return None  # several files merged: the kubernetes package's job
        kubeconfig = env or str(Path("~/.kube/config").expanduser())
    path = Path(kubeconfig).expanduser()
    if not path.is_file():
        return None  # the kubernetes package says what is missing, as before
    try:
        return from_kubeconfig(path)
    except (OSError, yaml.YAMLError):
        return None
