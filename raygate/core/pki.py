"""Pure certificate building and reading with `cryptography`: a CA, leaf certificates it signs, what they hold.

Used by `raygate certs` for the webhook, by the webhook to report the certificate it serves, and by the
local control plane for kube-apiserver.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes

    @property
    def cert(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)


def _new_key() -> ec.EllipticCurvePrivateKey:
    # P-256: fast to generate, accepted by Go's TLS stack and by every kube-apiserver.
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _start(start: dt.datetime | None) -> dt.datetime:
    # Backdated a little to tolerate clock skew between nodes.
    return start if start is not None else _now() - dt.timedelta(minutes=5)


def make_ca(common_name: str, valid_for: dt.timedelta, *, start: dt.datetime | None = None) -> KeyPair:
    """A self-signed CA valid from `start` (default: a few minutes ago) for `valid_for`."""
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    start = _start(start)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + valid_for)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                key_encipherment=False, data_encipherment=False, key_agreement=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _san(names: list[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for n in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            entries.append(x509.DNSName(n))
    return x509.SubjectAlternativeName(entries)


def make_leaf(
    ca: KeyPair,
    common_name: str,
    valid_for: dt.timedelta,
    *,
    sans: list[str] | None = None,
    organizations: list[str] | None = None,
    server: bool = True,
    client: bool = False,
    start: dt.datetime | None = None,
) -> KeyPair:
    """A certificate signed by `ca`; `sans` may mix DNS names and IP addresses."""
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key must be an EC key")
    key = _new_key()
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    attrs += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations or []]
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + (
        [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
    )
    start = _start(start)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(attrs))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + valid_for)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if sans:
        builder = builder.add_extension(_san(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def make_signing_key() -> tuple[bytes, bytes]:
    """A key pair for signing service-account tokens: (private PEM, public PEM)."""
    key = _new_key()
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return _key_pem(key), public


# --- reading ------------------------------------------------------------------------------------
def read_certificates(pem: bytes | None) -> list[x509.Certificate]:
    """Every certificate in `pem`; [] when there is none or it cannot be read (never raises)."""
    if not pem:
        return []
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        return []


def cert_sans(cert: x509.Certificate) -> list[str]:
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    dns = [d.lower() for d in ext.get_values_for_type(x509.DNSName)]
    return dns + [str(ip) for ip in ext.get_values_for_type(x509.IPAddress)]


@dataclass(frozen=True)
class CertInfo:
    subject: str
    issuer: str
    sans: tuple[str, ...]
    serial: int
    not_before: dt.datetime
    not_after: dt.datetime

    def left(self, now: dt.datetime) -> dt.timedelta:
        return self.not_after - now


def describe(pem: bytes | None) -> CertInfo | None:
    """The first certificate in `pem`, or None when there is none or it cannot be read."""
    certs = read_certificates(pem)
    if not certs:
        return None
    c = certs[0]
    return CertInfo(
        subject=c.subject.rfc4514_string(),
        issuer=c.issuer.rfc4514_string(),
        sans=tuple(cert_sans(c)),
        serial=c.serial_number,
        not_before=c.not_valid_before_utc,
        not_after=c.not_valid_after_utc,
    )
