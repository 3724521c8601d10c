"""Pure rotation logic: from what the Secret holds, the wanted SANs and the time, decide whether
to keep the certificates, renew the serving certificate, or start over with a new CA; then issue.

No I/O here: `store` reads and writes, `ensure` composes. Every input may be missing or garbage.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes, PublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID

from raygate.core import pki
from raygate.core.errors import RaygateError
from raygate.core.times import timestamp

DEFAULT_RENEW_BEFORE = dt.timedelta(days=30)
DEFAULT_CA_VALIDITY = dt.timedelta(days=3650)
DEFAULT_SERVING_VALIDITY = dt.timedelta(days=365)
CLUSTER_DOMAIN = "cluster.local"
# New certificates start this far in the past, so a node with a slightly slow clock accepts them.
CLOCK_SKEW = dt.timedelta(minutes=5)

_DNS_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
_DNS_NAME = re.compile(rf"^(\*\.)?{_DNS_LABEL}(\.{_DNS_LABEL})*$", re.IGNORECASE)


def human(delta: dt.timedelta) -> str:
    """A duration for messages: whole days when it is at least a day, else hours."""
    if abs(delta) >= dt.timedelta(days=1):
        return f"{delta.total_seconds() / 86400:.0f} days"
    return f"{delta.total_seconds() / 3600:.1f} hours"


@dataclass(frozen=True)
class Policy:
    renew_before: dt.timedelta = DEFAULT_RENEW_BEFORE
    ca_validity: dt.timedelta = DEFAULT_CA_VALIDITY
    serving_validity: dt.timedelta = DEFAULT_SERVING_VALIDITY

    def __post_init__(self) -> None:
        if self.renew_before < dt.timedelta(0):
            raise RaygateError("renew-before must not be negative")
        # A validity inside the renewal window would make every run renew: never idempotent.
        for what, validity in (("serving certificate", self.serving_validity), ("CA", self.ca_validity)):
            if validity <= self.renew_before:
                raise RaygateError(
                    f"the {what} validity ({human(validity)}) must be longer than renew-before "
                    f"({human(self.renew_before)}): lower renew-before or raise the validity"
                )


@dataclass(frozen=True)
class Stored:
    """The Secret's four keys as raw PEM bytes; any of them may be missing or garbage.

    `ca_cert` is a bundle: the signing CA first, then a previous CA that is still valid, so
    serving certificates signed before a CA rotation keep verifying until they are replaced.
    """

    ca_cert: bytes | None = None
    ca_key: bytes | None = None
    tls_cert: bytes | None = None
    tls_key: bytes | None = None

    @property
    def empty(self) -> bool:
        return not (self.ca_cert or self.ca_key or self.tls_cert or self.tls_key)


class Action(StrEnum):
    KEEP = "keep"
    RENEW = "renew"  # a new serving certificate from the existing CA
    REGENERATE = "regenerate"  # a new CA and a new serving certificate


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str


# --- names -----------------------------------------------------------------------------------------
def canonical_name(name: str) -> str:
    """IP addresses in their standard form, DNS names lower-case; raises for anything else."""
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        pass
    dns = name.lower().rstrip(".")
    if len(dns) > 253 or not _DNS_NAME.match(dns):
        raise RaygateError(f"SAN {name!r} is neither an IP address nor a valid DNS name")
    return dns


def service_sans(
    service: str, namespace: str, extra: Iterable[str] = (), cluster_domain: str = CLUSTER_DOMAIN
) -> list[str]:
    """Every name the API server may use to reach `service`, then `extra` (deduplicated, in order)."""
    names = [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.{cluster_domain}",
        *extra,
    ]
    out: list[str] = []
    for name in names:
        canon = canonical_name(name)
        if canon not in out:
            out.append(canon)
    return out




# --- parsing that never raises -----------------------------------------------------------------------
def _key(pem: bytes | None) -> PrivateKeyTypes | None:
    if not pem:
        return None
    try:
        return serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        return None


def _spki(key: PublicKeyTypes) -> bytes:
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _matches(cert: x509.Certificate, key: PrivateKeyTypes) -> bool:
    try:
        return _spki(cert.public_key()) == _spki(key.public_key())
    except (ValueError, UnsupportedAlgorithm):
        return False


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def _server_auth(cert: x509.Certificate) -> bool:
    try:
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return False
    return ExtendedKeyUsageOID.SERVER_AUTH in usages


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm):
        return False
    return True


# --- the decision ----------------------------------------------------------------------------------
def _ca_problem(stored: Stored, now: dt.datetime, policy: Policy) -> str | None:
    cas = pki.read_certificates(stored.ca_cert)
    if not cas:
        return "the CA certificate (ca.crt) is missing or unreadable"
    ca, key = cas[0], _key(stored.ca_key)
    if key is None:
        return "the CA key (ca.key) is missing or unreadable"
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        return "the CA key is not an EC key"
    if not _matches(ca, key):
        return "the CA key does not match the CA certificate"
    if not _is_ca(ca):
        return "ca.crt is not a CA certificate"
    if now < ca.not_valid_before_utc - CLOCK_SKEW:
        return f"the CA is not valid before {timestamp(ca.not_valid_before_utc)}"
    if ca.not_valid_after_utc - now <= policy.renew_before:
        return f"the CA expires at {timestamp(ca.not_valid_after_utc)}, within {human(policy.renew_before)}"
    return None


def _serving_problem(stored: Stored, sans: Sequence[str], now: dt.datetime, policy: Policy) -> str | None:
    chain = pki.read_certificates(stored.tls_cert)
    if not chain:
        return "the serving certificate (tls.crt) is missing or unreadable"
    cert, key = chain[0], _key(stored.tls_key)
    if key is None:
        return "the serving key (tls.key) is missing or unreadable"
    if not _matches(cert, key):
        return "the serving key does not match the serving certificate"
    if not _signed_by(cert, pki.read_certificates(stored.ca_cert)[0]):
        return "the serving certificate is not signed by the stored CA"
    if not _server_auth(cert):
        return "the serving certificate lacks the serverAuth extended key usage"
    have, want = set(pki.cert_sans(cert)), {canonical_name(n) for n in sans}
    if have != want:
        added, removed = sorted(want - have), sorted(have - want)
        return f"the SANs changed (add {added or 'nothing'}, remove {removed or 'nothing'})"
    if now < cert.not_valid_before_utc - CLOCK_SKEW:
        return f"the serving certificate is not valid before {timestamp(cert.not_valid_before_utc)}"
    if cert.not_valid_after_utc - now <= policy.renew_before:
        return (
            f"the serving certificate expires at {timestamp(cert.not_valid_after_utc)}, "
            f"within {human(policy.renew_before)}"
        )
    return None


def decide(stored: Stored | None, sans: Sequence[str], now: dt.datetime, policy: Policy) -> Decision:
    """What to do with `stored` so that it serves `sans` and stays outside the renewal window."""
    if stored is None or stored.empty:
        return Decision(Action.REGENERATE, "no certificate stored")
    problem = _ca_problem(stored, now, policy)
    if problem is not None:
        return Decision(Action.REGENERATE, problem)
    problem = _serving_problem(stored, sans, now, policy)
    if problem is not None:
        return Decision(Action.RENEW, problem)
    not_after = pki.read_certificates(stored.tls_cert)[0].not_valid_after_utc
    return Decision(Action.KEEP, f"valid until {timestamp(not_after)}")


# --- issuing ---------------------------------------------------------------------------------------
def _pem(certs: Sequence[x509.Certificate]) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)


def _signing_ca(stored: Stored | None) -> pki.KeyPair | None:
    """The stored CA when it is a sound CA with its own key (whatever its dates)."""
    if stored is None:
        return None
    cas, key = pki.read_certificates(stored.ca_cert), _key(stored.ca_key)
    if not cas or key is None or not _matches(cas[0], key) or not _is_ca(cas[0]):
        return None
    return pki.KeyPair(_pem(cas[:1]), stored.ca_key or b"")


def issue(
    decision: Decision,
    stored: Stored | None,
    *,
    common_name: str,
    ca_name: str,
    sans: Sequence[str],
    now: dt.datetime,
    policy: Policy,
) -> Stored:
    """The material to store after `decision`; `stored` itself when the decision is to keep."""
    if decision.action is Action.KEEP:
        if stored is None:
            raise ValueError("cannot keep certificates that do not exist")
        return stored
    start = now - CLOCK_SKEW
    old_ca = _signing_ca(stored)
    if decision.action is Action.REGENERATE:
        # The name carries the creation time, so two generations of the CA are told apart.
        ca = pki.make_ca(f"{ca_name}@{int(now.timestamp())}", policy.ca_validity, start=start)
        trusted = [ca.cert]
        if old_ca is not None and old_ca.cert.not_valid_after_utc > now:
            trusted.append(old_ca.cert)  # webhook pods may serve the old certificate until they reload
        bundle = _pem(trusted)
    else:
        if old_ca is None or stored is None or stored.ca_cert is None:
            raise ValueError("renewing needs a sound stored CA; decide() says regenerate otherwise")
        ca = old_ca
        cas = pki.read_certificates(stored.ca_cert)
        unexpired = [c for c in cas if c.not_valid_after_utc > now]
        # Keep the stored bytes when nothing expired, so the caBundle does not change needlessly.
        bundle = stored.ca_cert if len(unexpired) == len(cas) else _pem(unexpired)
    # A serving certificate never outlives the CA that signed it.
    valid_for = min(policy.serving_validity, ca.cert.not_valid_after_utc - start)
    leaf = pki.make_leaf(ca, common_name, valid_for, sans=list(sans), start=start)
    return Stored(ca_cert=bundle, ca_key=ca.key_pem, tls_cert=leaf.cert_pem, tls_key=leaf.key_pem)
