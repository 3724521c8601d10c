"""The pure rotation logic: what gets issued, and when it is kept, renewed or regenerated."""

from __future__ import annotations

import dataclasses
import datetime as dt
import ipaddress

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from raygate.certs.rotation import (
    Action,
    Decision,
    Policy,
    Stored,
    decide,
    issue,
    service_sans,
)
from raygate.core import pki
from raygate.core.errors import RaygateError
from raygate.core.pki import cert_sans, describe

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
DAY = dt.timedelta(days=1)
POLICY = Policy()
SANS = service_sans("raygate-webhook", "raygate-system", ["127.0.0.1"])


def fresh(now: dt.datetime = T0, policy: Policy = POLICY, sans: list[str] = SANS) -> Stored:
    return issue(
        Decision(Action.REGENERATE, "test"),
        None,
        common_name="raygate-webhook.raygate-system.svc",
        ca_name="raygate-webhook-ca",
        sans=sans,
        now=now,
        policy=policy,
    )


def certs_of(pem: bytes | None) -> list[x509.Certificate]:
    assert pem
    return x509.load_pem_x509_certificates(pem)


def reissue(decision: Decision, stored: Stored | None, now: dt.datetime, sans: list[str] = SANS) -> Stored:
    return issue(
        decision,
        stored,
        common_name="raygate-webhook.raygate-system.svc",
        ca_name="raygate-webhook-ca",
        sans=sans,
        now=now,
        policy=POLICY,
    )


# --- names -----------------------------------------------------------------------------------------
def test_service_sans_cover_every_name_the_api_server_may_use() -> None:
    assert service_sans("raygate-webhook", "raygate-system") == [
        "raygate-webhook",
        "raygate-webhook.raygate-system",
        "raygate-webhook.raygate-system.svc",
        "raygate-webhook.raygate-system.svc.cluster.local",
    ]


def test_extra_sans_are_appended_canonical_and_deduplicated() -> None:
    sans = service_sans("svc", "ns", ["127.0.0.1", "SVC.ns.svc", "0:0::1", "::1", "localhost"])
    assert sans == ["svc", "svc.ns", "svc.ns.svc", "svc.ns.svc.cluster.local", "127.0.0.1", "::1", "localhost"]


@pytest.mark.parametrize("bad", ["", "has space", "under_score.example", "-leading.example", "a..b"])
def test_invalid_extra_san_is_refused_with_its_name(bad: str) -> None:
    with pytest.raises(RaygateError, match="neither an IP address nor a valid DNS name"):
        service_sans("svc", "ns", [bad])


# --- what gets issued --------------------------------------------------------------------------------
def test_serving_certificate_has_exactly_the_wanted_sans() -> None:
    leaf = certs_of(fresh().tls_cert)[0]
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sorted(san.get_values_for_type(x509.DNSName)) == sorted(SANS[:4])
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert cert_sans(leaf) == SANS


def test_validity_periods_follow_the_policy() -> None:
    stored = fresh()
    ca, leaf = certs_of(stored.ca_cert)[0], certs_of(stored.tls_cert)[0]
    assert ca.not_valid_after_utc - ca.not_valid_before_utc == POLICY.ca_validity == 3650 * DAY
    assert leaf.not_valid_after_utc - leaf.not_valid_before_utc == POLICY.serving_validity == 365 * DAY
    # Backdated a little for clock skew, never more.
    assert T0 - dt.timedelta(minutes=10) < leaf.not_valid_before_utc <= T0


def test_custom_validity_is_used() -> None:
    policy = Policy(renew_before=DAY, ca_validity=100 * DAY, serving_validity=10 * DAY)
    stored = fresh(policy=policy)
    leaf = certs_of(stored.tls_cert)[0]
    assert leaf.not_valid_after_utc - leaf.not_valid_before_utc == 10 * DAY
    assert decide(stored, SANS, T0 + 8 * DAY, policy).action is Action.KEEP
    assert decide(stored, SANS, T0 + 9 * DAY, policy).action is Action.RENEW


def test_key_usage_is_server_auth_on_a_non_ca_leaf() -> None:
    stored = fresh()
    leaf, ca = certs_of(stored.tls_cert)[0], certs_of(stored.ca_cert)[0]
    assert ExtendedKeyUsageOID.SERVER_AUTH in leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True


@pytest.mark.parametrize(
    "name", ["raygate-webhook.raygate-system.svc", "raygate-webhook.raygate-system.svc.cluster.local"]
)
def test_chain_verifies_against_the_ca_for_the_service_names(name: str) -> None:
    stored = fresh()
    verifier = PolicyBuilder().store(Store(certs_of(stored.ca_cert))).time(T0 + DAY).build_server_verifier(
        x509.DNSName(name)
    )
    chain = verifier.verify(certs_of(stored.tls_cert)[0], [])
    assert chain[-1] == certs_of(stored.ca_cert)[0]


def test_chain_does_not_verify_for_a_foreign_name_or_ca() -> None:
    stored, other = fresh(), fresh()
    leaf = certs_of(stored.tls_cert)[0]
    wrong_name = PolicyBuilder().store(Store(certs_of(stored.ca_cert))).time(T0 + DAY)
    with pytest.raises(VerificationError):
        wrong_name.build_server_verifier(x509.DNSName("evil.example")).verify(leaf, [])
    wrong_ca = PolicyBuilder().store(Store(certs_of(other.ca_cert))).time(T0 + DAY)
    with pytest.raises(VerificationError):
        wrong_ca.build_server_verifier(x509.DNSName(SANS[2])).verify(leaf, [])


# --- decisions ----------------------------------------------------------------------------------------
BASE = fresh()
OTHER = fresh()
NOT_AFTER = certs_of(BASE.tls_cert)[0].not_valid_after_utc
CA_NOT_AFTER = certs_of(BASE.ca_cert)[0].not_valid_after_utc
_stray = pki.make_ca("stray", 365 * DAY, start=T0)
_client_only = pki.make_leaf(
    pki.KeyPair(BASE.ca_cert or b"", BASE.ca_key or b""), "client", 365 * DAY,
    sans=SANS, server=False, client=True, start=T0,
)


def replace(**changes: bytes | None) -> Stored:
    return dataclasses.replace(BASE, **changes)


CASES: list[tuple[str, Stored | None, list[str], dt.datetime, Action, str]] = [
    ("nothing stored", None, SANS, T0, Action.REGENERATE, "no certificate"),
    ("empty secret", Stored(), SANS, T0, Action.REGENERATE, "no certificate"),
    ("fresh", BASE, SANS, T0, Action.KEEP, "valid until"),
    ("outside window", BASE, SANS, NOT_AFTER - 31 * DAY, Action.KEEP, "valid until"),
    ("inside window", BASE, SANS, NOT_AFTER - 29 * DAY, Action.RENEW, "within 30 days"),
    ("window boundary", BASE, SANS, NOT_AFTER - 30 * DAY, Action.RENEW, "within 30 days"),
    ("serving expired", BASE, SANS, NOT_AFTER + DAY, Action.RENEW, "expires"),
    ("SAN added", BASE, [*SANS, "10.0.0.7"], T0, Action.RENEW, "add ['10.0.0.7']"),
    ("SAN removed", BASE, SANS[:4], T0, Action.RENEW, "remove ['127.0.0.1']"),
    ("SAN spelled differently", BASE, [s.upper() for s in SANS], T0, Action.KEEP, "valid until"),
    ("CA expiring", BASE, SANS, CA_NOT_AFTER - 10 * DAY, Action.REGENERATE, "the CA expires"),
    ("CA not yet valid", BASE, SANS, T0 - DAY, Action.REGENERATE, "not valid before"),
    ("CA cert garbage", replace(ca_cert=b"garbage"), SANS, T0, Action.REGENERATE, "ca.crt"),
    ("CA cert missing", replace(ca_cert=None), SANS, T0, Action.REGENERATE, "ca.crt"),
    ("CA key garbage", replace(ca_key=b"-----BEGIN PRIVATE KEY-----\nxx\n"), SANS, T0, Action.REGENERATE, "ca.key"),
    ("CA key of another CA", replace(ca_key=OTHER.ca_key), SANS, T0, Action.REGENERATE, "does not match"),
    ("ca.crt not a CA", replace(ca_cert=BASE.tls_cert, ca_key=BASE.tls_key), SANS, T0, Action.REGENERATE,
     "not a CA"),
    ("serving cert garbage", replace(tls_cert=b"\x00\x01"), SANS, T0, Action.RENEW, "tls.crt"),
    ("serving cert missing", replace(tls_cert=None), SANS, T0, Action.RENEW, "tls.crt"),
    ("serving key garbage", replace(tls_key=b"nonsense"), SANS, T0, Action.RENEW, "tls.key"),
    ("serving key mismatch", replace(tls_key=OTHER.tls_key), SANS, T0, Action.RENEW, "does not match"),
    ("serving cert from another CA", replace(tls_cert=OTHER.tls_cert, tls_key=OTHER.tls_key), SANS, T0,
     Action.RENEW, "not signed by the stored CA"),
    ("serving cert from a stray CA key", replace(ca_cert=_stray.cert_pem, ca_key=_stray.key_pem), SANS, T0,
     Action.RENEW, "not signed"),
    ("no serverAuth", replace(tls_cert=_client_only.cert_pem, tls_key=_client_only.key_pem), SANS, T0,
     Action.RENEW, "serverAuth"),
]


@pytest.mark.parametrize(("stored", "sans", "now", "action", "reason"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_decision(stored: Stored | None, sans: list[str], now: dt.datetime, action: Action, reason: str) -> None:
    decision = decide(stored, sans, now, POLICY)
    assert decision.action is action
    assert reason in decision.reason


@pytest.mark.parametrize(("stored", "sans", "now", "action", "reason"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_acting_on_any_decision_converges_to_keep(
    stored: Stored | None, sans: list[str], now: dt.datetime, action: Action, reason: str
) -> None:
    """Idempotence: what `issue` produces is kept by the next `decide`, at once and an hour later."""
    result = reissue(decide(stored, sans, now, POLICY), stored, now, sans)
    for later in (now, now + dt.timedelta(hours=1)):
        second = decide(result, sans, later, POLICY)
        assert second.action is Action.KEEP, second.reason
        assert reissue(second, result, later, sans) is result


def test_decide_is_a_pure_function_of_its_inputs() -> None:
    stored = replace(tls_key=OTHER.tls_key)
    snapshot = dataclasses.replace(stored)
    assert decide(stored, SANS, T0, POLICY) == decide(stored, SANS, T0, POLICY)
    assert stored == snapshot


def test_renewal_keeps_the_ca_and_the_ca_bundle_bytes() -> None:
    now = NOT_AFTER - 10 * DAY
    renewed = reissue(decide(BASE, SANS, now, POLICY), BASE, now)
    assert renewed.ca_cert == BASE.ca_cert and renewed.ca_key == BASE.ca_key
    assert renewed.tls_cert != BASE.tls_cert and renewed.tls_key != BASE.tls_key
    assert certs_of(renewed.tls_cert)[0].not_valid_after_utc > NOT_AFTER


def test_serving_certificate_never_outlives_its_ca() -> None:
    now = CA_NOT_AFTER - 40 * DAY  # the CA is outside the window, a 365-day leaf would outlive it
    renewed = reissue(decide(BASE, SANS, now, POLICY), BASE, now)
    assert certs_of(renewed.tls_cert)[0].not_valid_after_utc == CA_NOT_AFTER
    assert decide(renewed, SANS, now, POLICY).action is Action.KEEP


def test_ca_rotation_keeps_trusting_the_previous_ca_until_it_expires() -> None:
    now = CA_NOT_AFTER - 10 * DAY
    rotated = reissue(decide(BASE, SANS, now, POLICY), BASE, now)
    bundle = certs_of(rotated.ca_cert)
    assert len(bundle) == 2 and bundle[1] == certs_of(BASE.ca_cert)[0]
    assert certs_of(rotated.tls_cert)[0].issuer == bundle[0].subject != bundle[1].subject
    # Once the old CA has expired, the next renewal drops it from the bundle.
    later = certs_of(rotated.tls_cert)[0].not_valid_after_utc - DAY
    renewed = reissue(decide(rotated, SANS, later, POLICY), rotated, later)
    assert certs_of(renewed.ca_cert) == bundle[:1]


def test_previous_ca_verifies_a_serving_cert_issued_before_rotation() -> None:
    # A CA whose life ends shortly after its serving certificate was issued.
    policy = Policy(renew_before=30 * DAY, ca_validity=60 * DAY, serving_validity=40 * DAY)
    old = fresh(policy=policy)
    now = T0 + 31 * DAY
    decision = decide(old, SANS, now, policy)
    assert decision.action is Action.REGENERATE
    rotated = issue(decision, old, common_name=SANS[2], ca_name="ca", sans=SANS, now=now, policy=policy)
    verifier = PolicyBuilder().store(Store(certs_of(rotated.ca_cert))).time(now).build_server_verifier(
        x509.DNSName(SANS[2])
    )
    verifier.verify(certs_of(old.tls_cert)[0], [])  # the old leaf, still served until reload
    verifier.verify(certs_of(rotated.tls_cert)[0], [])  # and the new one


def test_an_untrustworthy_ca_is_not_kept_in_the_bundle() -> None:
    tampered = replace(ca_key=OTHER.ca_key)
    rotated = reissue(decide(tampered, SANS, T0, POLICY), tampered, T0)
    assert len(certs_of(rotated.ca_cert)) == 1


def test_keep_returns_the_stored_material_itself() -> None:
    assert reissue(Decision(Action.KEEP, "ok"), BASE, T0) is BASE
    with pytest.raises(ValueError):
        reissue(Decision(Action.KEEP, "ok"), None, T0)


@pytest.mark.parametrize(
    ("renew_before", "ca_validity", "serving_validity"),
    [
        (365 * DAY, 3650 * DAY, 365 * DAY),  # serving certificate born inside the window
        (400 * DAY, 3650 * DAY, 365 * DAY),
        (10 * DAY, 5 * DAY, 20 * DAY),  # CA born inside the window
        (-DAY, 3650 * DAY, 365 * DAY),
    ],
)
def test_policy_that_would_renew_on_every_run_is_refused(
    renew_before: dt.timedelta, ca_validity: dt.timedelta, serving_validity: dt.timedelta
) -> None:
    with pytest.raises(RaygateError, match="renew-before"):
        Policy(renew_before, ca_validity, serving_validity)


def test_policy_just_outside_the_window_is_accepted() -> None:
    policy = Policy(renew_before=364 * DAY, ca_validity=365 * DAY, serving_validity=365 * DAY)
    assert decide(fresh(policy=policy), SANS, T0, policy).action is Action.KEEP


def test_describe_reads_subject_sans_and_dates() -> None:
    info = describe(BASE.tls_cert)
    assert info is not None
    assert info.subject == "CN=raygate-webhook.raygate-system.svc"
    assert info.sans == tuple(SANS)
    assert info.left(NOT_AFTER - 2 * DAY) == 2 * DAY
    assert describe(b"junk") is None and describe(None) is None
