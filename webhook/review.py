"""The AdmissionReview wire format (admission.k8s.io/v1), declared once, and the pure response builder."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict

import orjson

from raygate.core.dra import ClaimTemplates, no_templates
from raygate.core.modes import NO_MEMBERS, Members
from raygate.core.objects import get
from raygate.core.policy import RaygateConfig

API_VERSION = "admission.k8s.io/v1"


class UserInfo(TypedDict, total=False):
    username: str
    uid: str
    groups: list[str]


class GroupVersionKind(TypedDict):
    group: str
    version: str
    kind: str


class AdmissionRequest(TypedDict):
    uid: str
    kind: GroupVersionKind
    operation: str  # CREATE, UPDATE, DELETE, CONNECT
    namespace: NotRequired[str]
    name: NotRequired[str]
    userInfo: NotRequired[UserInfo]
    object: NotRequired[dict[str, Any] | None]
    oldObject: NotRequired[dict[str, Any] | None]
    dryRun: NotRequired[bool]


class Status(TypedDict, total=False):
    code: int
    message: str
    reason: str


class AdmissionResponse(TypedDict, total=False):
    uid: str
    allowed: bool
    status: Status
    patch: str
    patchType: str
    warnings: list[str]


class AdmissionReview(TypedDict, total=False):
    apiVersion: str
    kind: str
    request: AdmissionRequest
    response: AdmissionResponse


class BadReview(ValueError):
    """The body is not an AdmissionReview we can answer; the HTTP layer answers 400."""


def parse_review(body: bytes) -> tuple[AdmissionReview, AdmissionRequest]:
    try:
        review = orjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise BadReview(f"body is not JSON: {err}") from None
    if not isinstance(review, dict):
        raise BadReview("body is not a JSON object")
    request = review.get("request")
    if not isinstance(request, dict) or not isinstance(request.get("uid"), str) or not request["uid"]:
        raise BadReview("request.uid is missing: not an AdmissionReview")
    return review, request  # type: ignore[return-value]


def username(req: AdmissionRequest) -> str:
    user = req.get("userInfo")
    name = user.get("username") if isinstance(user, dict) else None
    return name if isinstance(name, str) else ""


def kind_of(req: AdmissionRequest) -> str:
    gvk = req.get("kind")
    kind = gvk.get("kind") if isinstance(gvk, dict) else None
    return kind if isinstance(kind, str) else ""


def response(
    review: AdmissionReview,
    uid: str,
    *,
    allowed: bool,
    patch: list[dict[str, Any]] | None = None,
    message: str | None = None,
    code: int | None = None,
    warnings: list[str] | None = None,
) -> AdmissionReview:
    """An AdmissionReview answer echoing apiVersion and kind and carrying the request uid."""
    resp: AdmissionResponse = {"uid": uid, "allowed": allowed}
    if patch:
        resp["patchType"] = "JSONPatch"
        resp["patch"] = base64.b64encode(orjson.dumps(patch)).decode()
    if message is not None or code is not None:
        status: Status = {}
        if code is not None:
            status["code"] = code
        if message is not None:
            status["message"] = message
        if not allowed:
            status["reason"] = "Forbidden" if code == 403 else "InternalError" if (code or 0) >= 500 else "Invalid"
        resp["status"] = status
    if warnings:
        resp["warnings"] = warnings
    # Echo the request's admission.k8s.io version (the API server expects its own back), never junk.
    version = review.get("apiVersion")
    return {
        "apiVersion": version if isinstance(version, str) and version.startswith("admission.k8s.io/") else API_VERSION,
        "kind": "AdmissionReview",
        "response": resp,
    }


@dataclass(frozen=True)
class Review:
    """One review, and what the webhook's caches hold for it: everything a decision reads (no I/O).

    Built once per request by the entry points (decision.mutate, decision.validate) and passed down."""

    request: AdmissionRequest
    config: RaygateConfig
    ns_labels: Mapping[str, str] | None = None  # None: the namespace cache has not seen it yet
    claims: ClaimTemplates = no_templates  # DRA ResourceClaimTemplates
    members: Members = NO_MEMBERS  # pods in gang groups (native mode)

    @property
    def operation(self) -> str:
        return str(self.request.get("operation") or "")

    @property
    def user(self) -> str:
        return username(self.request)

    @property
    def obj(self) -> dict[str, Any] | None:
        found = self.request.get("object")
        return found if isinstance(found, dict) else None

    @property
    def old(self) -> dict[str, Any] | None:
        found = self.request.get("oldObject")
        return found if isinstance(found, dict) else None

    def namespace_of(self, obj: Mapping[str, Any]) -> str:
        found = self.request.get("namespace") or get(obj, ("metadata", "namespace"))
        return found if isinstance(found, str) else ""

    def opted_in(self, namespace: str) -> bool:
        return self.config.opted_in(namespace, dict(self.ns_labels) if self.ns_labels is not None else None)
