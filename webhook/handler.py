"""From request body to response body: parse, decide, answer. No Flask, no I/O.

Never raises: an unparseable body is HTTP 400; a failure inside the decision is an HTTP 200
AdmissionReview that denies with the error (fail closed, like failurePolicy Fail), so the API
server always gets an answer carrying the request uid.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import orjson

from raygate.core.dra import ClaimTemplates, no_templates
from raygate.core.modes import NO_MEMBERS, Members
from raygate.core.policy import RaygateConfig
from raygate.webhook.decision import Decide
from raygate.webhook.review import AdmissionRequest, BadReview, parse_review, response
from raygate.webhook.verdict import Decision

log = logging.getLogger("raygate.webhook")


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    decision: Decision | None = None
    request: AdmissionRequest | None = None


LabelsFor = Callable[[str], Mapping[str, str] | None]


def _unknown(namespace: str) -> None:
    return None


def answer(body: bytes, decide: Decide, config: RaygateConfig, labels_for: LabelsFor = _unknown,
           claims: ClaimTemplates = no_templates, members: Members = NO_MEMBERS) -> Answer:
    try:
        review, req = parse_review(body)
    except BadReview as err:
        return Answer(400, orjson.dumps({"error": str(err)}))
    namespace = req.get("namespace") or ""
    try:
        decision = decide(req, labels_for(namespace if isinstance(namespace, str) else ""), config, claims, members)
    except Exception as err:  # a bug must never become an HTTP 500 or a silent allow
        log.exception("admission decision failed", extra={"uid": req["uid"], "namespace": str(namespace)})
        decision = Decision(
            allowed=False, outcome="error", code=500,
            message=f"raygate could not decide on this object ({type(err).__name__}: {err}); "
            "please report this to your cluster admin",
        )
    out = response(
        review, req["uid"], allowed=decision.allowed, patch=decision.patch, message=decision.message,
        code=decision.code, warnings=decision.warnings,
    )
    return Answer(200, orjson.dumps(out), decision, req)
