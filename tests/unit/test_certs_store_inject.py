"""The I/O-free parts of storing and injecting: local files, caBundle comparison and patch shape."""

from __future__ import annotations

import base64
import stat
from pathlib import Path

import pytest

from raygate.certs.inject import ca_bundle_patch, stale_webhooks
from raygate.certs.rotation import Stored
from raygate.certs.store import read_files, write_files
from raygate.core.errors import RaygateError

MATERIAL = Stored(ca_cert=b"CA PEM", ca_key=b"CA KEY", tls_cert=b"CERT PEM", tls_key=b"KEY PEM")


def test_write_files_writes_the_three_files_without_the_ca_key(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    assert write_files(out, MATERIAL) == ["ca.crt", "tls.key", "tls.crt"]
    assert sorted(p.name for p in out.iterdir()) == ["ca.crt", "tls.crt", "tls.key"]  # no temp files left
    assert (out / "tls.crt").read_bytes() == b"CERT PEM"
    assert stat.S_IMODE((out / "tls.key").stat().st_mode) == 0o600
    assert read_files(out) == Stored(ca_cert=b"CA PEM", tls_cert=b"CERT PEM", tls_key=b"KEY PEM")


def test_write_files_rewrites_only_what_changed(tmp_path: Path) -> None:
    write_files(tmp_path, MATERIAL)
    inode = (tmp_path / "ca.crt").stat().st_ino
    assert write_files(tmp_path, MATERIAL) == []
    renewed = Stored(ca_cert=b"CA PEM", ca_key=b"CA KEY", tls_cert=b"NEW CERT", tls_key=b"NEW KEY")
    assert write_files(tmp_path, renewed) == ["tls.key", "tls.crt"]
    assert (tmp_path / "ca.crt").stat().st_ino == inode  # untouched, so a watcher sees no change
    assert (tmp_path / "tls.key").read_bytes() == b"NEW KEY"


def test_write_files_replaces_atomically(tmp_path: Path) -> None:
    write_files(tmp_path, MATERIAL)
    before = (tmp_path / "tls.crt").stat().st_ino
    write_files(tmp_path, Stored(ca_cert=b"CA PEM", ca_key=b"K", tls_cert=b"NEW", tls_key=b"KEY PEM"))
    # A new inode means rename-over, never an in-place write a reader could see half of.
    assert (tmp_path / "tls.crt").stat().st_ino != before


def test_write_files_into_an_unwritable_place_is_one_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(RaygateError, match="cannot write the certificates to"):
        write_files(blocker / "sub", MATERIAL)


def test_read_files_of_an_empty_directory_is_empty(tmp_path: Path) -> None:
    assert read_files(tmp_path).empty


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_stale_webhooks_are_those_not_trusting_exactly_the_bundle() -> None:
    pem = b"-----BEGIN CERTIFICATE-----\nabc\n-----END CERTIFICATE-----\n"
    webhooks: list[tuple[str, str | bytes | None]] = [
        ("current.raygate.io", b64(pem)),
        ("empty.raygate.io", None),
        ("blank.raygate.io", ""),
        ("old.raygate.io", b64(b"old CA")),
        ("garbage.raygate.io", "%%% not base64"),
        ("bytes.raygate.io", b64(pem).encode()),
    ]
    assert stale_webhooks(webhooks, pem) == [
        "empty.raygate.io", "blank.raygate.io", "old.raygate.io", "garbage.raygate.io"
    ]
    assert stale_webhooks([], pem) == []


def test_ca_bundle_patch_merges_by_webhook_name_with_a_resource_version_precondition() -> None:
    patch = ca_bundle_patch(["a.raygate.io", "b.raygate.io"], b"PEM", "42")
    assert patch == {
        "metadata": {"resourceVersion": "42"},
        "webhooks": [
            {"name": "a.raygate.io", "clientConfig": {"caBundle": b64(b"PEM")}},
            {"name": "b.raygate.io", "clientConfig": {"caBundle": b64(b"PEM")}},
        ],
    }
