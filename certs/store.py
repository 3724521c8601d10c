"""Where the certificates live: the TLS Secret in the cluster, and local files for a webhook that
runs as a local process during development."""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raygate.certs.apierrors import api_errors
from raygate.certs.rotation import Stored
from raygate.core.api import SECRETS
from raygate.core.errors import RaygateError
from raygate.core.objects import JSON, meta_str
from raygate.kube.client import ApiError, Kube

# The key names kubelet and every TLS consumer expect in a kubernetes.io/tls Secret (plus the CA).
TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"
CA_CERT = "ca.crt"
CA_KEY = "ca.key"
SECRET_TYPE = "kubernetes.io/tls"


class SecretConflict(Exception):
    """Someone else created or changed the Secret since it was read: read again and decide again."""


@dataclass(frozen=True)
class LoadedSecret:
    stored: Stored  # empty when the Secret does not exist
    resource_version: str | None  # None when the Secret does not exist

    @property
    def exists(self) -> bool:
        return self.resource_version is not None


def _decode(data: dict[str, Any], key: str) -> bytes | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bytes):
        return value
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError):
        return b"<not base64>"  # garbage in; rotation treats it as unreadable


def _encode(stored: Stored) -> dict[str, str]:
    pairs = {CA_CERT: stored.ca_cert, CA_KEY: stored.ca_key, TLS_CERT: stored.tls_cert, TLS_KEY: stored.tls_key}
    return {k: base64.b64encode(v).decode() for k, v in pairs.items() if v is not None}


def _resource_version(secret: JSON) -> str:
    version = meta_str(secret, "resourceVersion")
    if not version:
        raise RuntimeError("the API server returned a Secret without resourceVersion")
    return version


def read_secret(kube: Kube, namespace: str, name: str) -> LoadedSecret:
    with api_errors("get", "secrets", namespace, kube.host):
        try:
            secret = kube.get(SECRETS, name, namespace)
        except ApiError as err:
            if not err.not_found:
                raise
            return LoadedSecret(Stored(), None)
    data = dict(secret.get("data") or {})
    stored = Stored(
        ca_cert=_decode(data, CA_CERT),
        ca_key=_decode(data, CA_KEY),
        tls_cert=_decode(data, TLS_CERT),
        tls_key=_decode(data, TLS_KEY),
    )
    return LoadedSecret(stored, _resource_version(secret))


def write_secret(kube: Kube, namespace: str, name: str, stored: Stored, resource_version: str | None) -> str:
    """Create the Secret (resource_version None) or update the one read at `resource_version`.

    Returns the new resourceVersion; raises SecretConflict when another writer got there first.
    """
    host = kube.host
    data = _encode(stored)
    if resource_version is None:
        body = {"metadata": {"name": name, "namespace": namespace}, "type": SECRET_TYPE, "data": data}
        with api_errors("create", "secrets", namespace, host):
            try:
                created = kube.create(SECRETS, body, namespace)
            except ApiError as exc:
                if exc.status == 409:
                    raise SecretConflict(f"Secret {namespace}/{name} was created concurrently") from exc
                if exc.status == 404:
                    raise RaygateError(
                        f"namespace {namespace} does not exist: create it (kubectl create namespace "
                        f"{namespace}) or pass --namespace"
                    ) from exc
                raise
        return _resource_version(created)
    # A merge patch carrying resourceVersion is an update with a precondition: the server answers
    # 409 when the Secret changed since it was read. It keeps labels, owners and any other keys.
    patch = {"metadata": {"resourceVersion": resource_version}, "data": data}
    with api_errors("patch", "secrets", namespace, host):
        try:
            updated = kube.patch(SECRETS, name, patch, namespace)  # a merge patch
        except ApiError as exc:
            if exc.status in (404, 409):
                raise SecretConflict(f"Secret {namespace}/{name} changed concurrently") from exc
            raise
    return _resource_version(updated)


# --- local files -----------------------------------------------------------------------------------
def _write_atomically(path: Path, data: bytes, mode: int) -> None:
    # A reader sees the old file or the new one, never half of one.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_files(out_dir: Path, stored: Stored) -> list[str]:
    """Write ca.crt, tls.key and tls.crt into `out_dir`; only files whose content changed.

    Returns the names written. The CA key never leaves the Secret.
    """
    files = [(CA_CERT, stored.ca_cert, 0o644), (TLS_KEY, stored.tls_key, 0o600), (TLS_CERT, stored.tls_cert, 0o644)]
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for name, data, mode in files:
            if data is None:
                raise ValueError(f"no {name} to write")
            path = out_dir / name
            with contextlib.suppress(OSError):
                if path.read_bytes() == data:
                    continue
            _write_atomically(path, data, mode)
            written.append(name)
    except OSError as exc:
        raise RaygateError(f"cannot write the certificates to {out_dir}: {exc.strerror or exc}") from exc
    return written


def read_files(directory: Path) -> Stored:
    def read(name: str) -> bytes | None:
        try:
            return (directory / name).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise RaygateError(f"cannot read {directory / name}: {exc.strerror or exc}") from exc

    return Stored(ca_cert=read(CA_CERT), tls_cert=read(TLS_CERT), tls_key=read(TLS_KEY))
