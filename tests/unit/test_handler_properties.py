"""Property tests of the request-to-response path (webhook.handler.answer) over generated RayJobs,
RayClusters, configs and malformed AdmissionReviews.

Whatever arrives, the handler answers: HTTP 400 for a body that is not an AdmissionReview, else a
well-formed AdmissionReview carrying the request uid, whose patch (if any) applies with jsonpatch.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import jsonpatch
import orjson
from builders import RayCluster, RayJob, container, pod_template, review
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raygate.core import keys
from raygate.core.keys import Mode
from raygate.core.policy import RaygateConfig
from raygate.webhook.decision import Decide, mutate, validate
from raygate.webhook.handler import Answer, answer

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TRUSTED = f"system:serviceaccount:{keys.SYSTEM_NAMESPACE}:{keys.RECONCILER_SERVICE_ACCOUNT}"
OPTED_IN = {keys.OPT_IN_LABEL: keys.OPT_IN_VALUE}

# --- generators -----------------------------------------------------------------------------------

names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=12).filter(
    lambda s: s[0].isalpha()
)
good_quantity = st.sampled_from(["0", "1", "250m", "1.5", "2", "512Mi", "1Gi", "16Gi", "1e3", "100k", "0.5"])
resource_names = st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "ephemeral-storage", "google.com/tpu"])
resources = st.dictionaries(resource_names, good_quantity, max_size=3)
small_int = st.one_of(st.none(), st.integers(min_value=0, max_value=6))


@st.composite
def containers(draw: st.DrawFn, sidecar_ok: bool = False) -> dict[str, Any]:
    return container(
        draw(names), requests=draw(resources), limits=draw(resources),
        restart_policy=draw(st.sampled_from([None, "Always"])) if sidecar_ok else None,
    )


@st.composite
def templates(draw: st.DrawFn) -> dict[str, Any]:
    return pod_template(
        *draw(st.lists(containers(), min_size=1, max_size=3)),
        init=draw(st.lists(containers(sidecar_ok=True), max_size=2)),
        overhead=draw(st.one_of(st.none(), resources)),
    )


@st.composite
def ray_objects(draw: st.DrawFn) -> dict[str, Any]:
    """RayJobs and RayClusters as users write them: valid, or wrong in the ways raygate refuses."""
    is_job = draw(st.booleans())
    b: RayJob | RayCluster = RayJob(draw(names)) if is_job else RayCluster(draw(names))
    b.head(draw(templates()))
    for i in range(draw(st.integers(min_value=0, max_value=4))):
        lo = draw(small_int)
        b.worker(
            draw(st.sampled_from([f"group-{i}", "head", "gpu"])), replicas=draw(small_int), min_replicas=lo,
            max_replicas=draw(st.one_of(st.none(), st.integers(min_value=lo or 0, max_value=8))),
            hosts=draw(st.one_of(st.none(), st.integers(min_value=1, max_value=3))), template=draw(templates()),
            suspend=draw(st.sampled_from([None, False, True])),
        )
    if draw(st.booleans()):
        b.autoscaling(draw(st.one_of(st.none(), st.fixed_dictionaries({"requests": resources}))))
    for key in draw(st.lists(st.sampled_from([
        keys.KUEUE_QUEUE_LABEL, keys.KUEUE_PRIORITY_LABEL, keys.VOLCANO_QUEUE_LABEL, keys.RAY_PRIORITY_CLASS_LABEL,
        keys.STATE_LABEL, keys.ORIGINATED_FROM_CRD_LABEL,
    ]), max_size=3)):
        b.label(key, draw(st.sampled_from(["RayJob", "Pending", "user-q", ""])))
    for key in draw(st.lists(st.sampled_from([
        keys.MODE_ANNOTATION, keys.KUEUE_ELASTIC_ANNOTATION, keys.POD_GROUP_ANNOTATION,
    ]), max_size=2)):
        b.annotation(key, draw(st.sampled_from(["true", "provisioning", "{}"])))
    if draw(st.booleans()):
        b.suspend(draw(st.booleans()))
    if draw(st.integers(0, 9)) == 0:
        b.owned_by_rayjob()
    if draw(st.integers(0, 9)) == 0:
        b.generate_name(draw(names) + "-")
    if isinstance(b, RayJob):
        b.shutdown_after_finish(draw(st.sampled_from([True, True, False, None])))
        b.submission_mode(draw(st.sampled_from(["K8sJobMode", "SidecarMode", "HTTPMode", "InteractiveMode"])))
        if draw(st.booleans()):
            b.submitter(draw(templates()))
        if draw(st.integers(0, 5)) == 0:
            b.cluster_selector(**{keys.RAY_CLUSTER_LABEL: "shared"})
            if draw(st.booleans()):
                b.without_cluster_spec()
    return b.obj()


@st.composite
def configs(draw: st.DrawFn) -> RaygateConfig:
    mode = draw(st.sampled_from(["provisioning", "volcano", "kueue"]))
    defaults: dict[str, Any] = {"mode": mode}
    for field, values in (("queueName", ["q1", None]), ("priorityClass", ["high", None]),
                          ("allowUserQueue", [True, False]), ("fixShutdownAfterJobFinishes", [True, False])):
        value = draw(st.sampled_from(values))
        if value is not None:
            defaults[field] = value
    if draw(st.booleans()):
        defaults["maxGang"] = draw(st.dictionaries(resource_names, good_quantity, min_size=1, max_size=2))
    return RaygateConfig.model_validate({"defaults": defaults})


json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.text(max_size=8),
                         st.floats(allow_nan=False, allow_infinity=False))
json_values = st.recursive(
    json_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner,
                                                                                       max_size=4)),
    max_leaves=20,
)


@st.composite
def damaged(draw: st.DrawFn, obj: Any) -> Any:
    """`obj` with one value somewhere replaced by arbitrary JSON (a wrong type, a missing field, ...)."""
    if not isinstance(obj, dict | list) or draw(st.integers(0, 3)) == 0:
        return draw(json_values)
    keys_ = list(obj.keys()) if isinstance(obj, dict) else list(range(len(obj)))
    if not keys_:
        return draw(json_values)
    k = draw(st.sampled_from(keys_))
    out = dict(obj) if isinstance(obj, dict) else list(obj)
    out[k] = draw(damaged(obj[k]))  # type: ignore[index]
    return out


# --- checks -----------------------------------------------------------------------------------------

def check_answer(result: Answer, body: bytes) -> dict[str, Any] | None:
    """The handler's contract; returns the parsed response (None for an HTTP 400)."""
    try:
        sent = orjson.loads(body)
    except orjson.JSONDecodeError:
        sent = None
    req = sent.get("request") if isinstance(sent, dict) else None
    uid = req.get("uid") if isinstance(req, dict) else None
    if not (isinstance(uid, str) and uid):
        assert result.status == 400
        assert "error" in json.loads(result.body)
        return None
    assert result.status == 200
    out = json.loads(result.body)
    assert out["kind"] == "AdmissionReview"
    version = sent.get("apiVersion")  # type: ignore[union-attr]
    echoed = isinstance(version, str) and version.startswith("admission.k8s.io/")
    assert out["apiVersion"] == (version if echoed else "admission.k8s.io/v1")
    resp = out["response"]
    assert resp["uid"] == uid
    assert isinstance(resp["allowed"], bool)
    if not resp["allowed"]:
        assert 400 <= resp["status"]["code"] < 600
        assert isinstance(resp["status"]["message"], str) and resp["status"]["message"]
        assert "patch" not in resp
    if "patch" in resp:
        assert resp["patchType"] == "JSONPatch"
        ops = json.loads(base64.b64decode(resp["patch"]))
        assert ops  # never an empty patch: no patch at all when nothing changes
        jsonpatch.apply_patch(req["object"], ops)  # type: ignore[index] # raises if it does not apply
    for w in resp.get("warnings", []):
        assert isinstance(w, str)
    return resp  # type: ignore[no-any-return]


def run(body: bytes, decide: Decide, cfg: RaygateConfig, labels: dict[str, str] | None = OPTED_IN) -> Answer:
    return answer(body, decide, cfg, lambda ns: labels)


# --- properties ----------------------------------------------------------------------------------

@SETTINGS
@given(obj=ray_objects(), cfg=configs(), dry_run=st.booleans())
def test_create_of_any_ray_object_is_answered_with_a_patch_that_applies(
    obj: dict[str, Any], cfg: RaygateConfig, dry_run: bool,
) -> None:
    body = orjson.dumps(review(obj, dry_run=dry_run))
    for decide in (mutate, validate):
        result = run(body, decide, cfg)
        resp = check_answer(result, body)
        assert resp is not None
        assert result.decision is not None and result.decision.outcome != "error", result.decision.message
    # Re-invocation on the patched object changes nothing more.
    first = run(body, mutate, cfg).decision
    assert first is not None
    if first.allowed and first.gang is not None:  # admitted for gang admission (not left alone)
        patched = jsonpatch.apply_patch(obj, first.patch)
        assert all(not op["path"].startswith("/spec/rayClusterSpec/suspend") for op in first.patch)  # KubeRay's
        if cfg.defaults.mode is Mode.KUEUE:  # Kueue owns suspend: raygate neither writes it nor holds the job
            assert patched["spec"].get("suspend") == obj["spec"].get("suspend")
            assert keys.STATE_LABEL not in patched["metadata"].get("labels", {})  # a user's is removed
        else:
            assert patched["spec"]["suspend"] is True
            assert patched["metadata"]["labels"][keys.STATE_LABEL] == "Pending"
        # Nothing a user wrote in raygate's name survives: no state of their choosing, no booking to consume.
        written = {k for kind in ("labels", "annotations") for k in patched["metadata"].get(kind, {})
                   if k.startswith(keys.DOMAIN + "/")}
        assert written <= {keys.STATE_LABEL, keys.MODE_ANNOTATION, keys.POD_GROUP_ANNOTATION}
        assert keys.CONSUME_ANNOTATION not in json.dumps(patched)
    if first.patch:
        patched = jsonpatch.apply_patch(obj, first.patch)
        again = run(orjson.dumps(review(patched)), mutate, cfg).decision
        assert again is not None and again.allowed and again.patch == []


@SETTINGS
@given(old=ray_objects(), new=ray_objects(), cfg=configs(), trusted=st.booleans(), held=st.booleans())
def test_update_of_any_ray_object_is_answered_without_a_patch(
    old: dict[str, Any], new: dict[str, Any], cfg: RaygateConfig, trusted: bool, held: bool,
) -> None:
    if held:
        old.setdefault("metadata", {}).setdefault("labels", {})[keys.STATE_LABEL] = "Pending"
    body = orjson.dumps(review(new, operation="UPDATE", old=old, user=TRUSTED if trusted else "alice"))
    result = run(body, validate, cfg)
    resp = check_answer(result, body)
    assert resp is not None and "patch" not in resp
    assert result.decision is not None and result.decision.outcome != "error"
    if trusted:
        assert resp["allowed"]


@SETTINGS
@given(data=st.data(), cfg=configs(), op=st.sampled_from(["CREATE", "UPDATE", "DELETE", "CONNECT"]))
def test_damaged_review_is_answered_and_never_breaks_the_handler(
    data: st.DataObject, cfg: RaygateConfig, op: str,
) -> None:
    obj = data.draw(ray_objects())
    sent = data.draw(damaged(review(obj, operation=op, old=obj if op == "UPDATE" else None)))
    body = orjson.dumps(sent)
    for decide in (mutate, validate):
        result = run(body, decide, cfg)
        check_answer(result, body)
        # A malformed field is refused with a message, never an internal error.
        assert result.decision is None or result.decision.outcome != "error", result.decision.message


@SETTINGS
@given(body=st.one_of(st.binary(max_size=64), json_values.map(orjson.dumps)), cfg=configs())
def test_arbitrary_body_is_an_http_400_or_an_answer(body: bytes, cfg: RaygateConfig) -> None:
    for decide in (mutate, validate):
        check_answer(run(body, decide, cfg), body)


def test_bodies_that_are_not_admission_reviews_are_http_400() -> None:
    cfg = RaygateConfig()
    for body in (b"", b"not json", b"[]", b"{}", b'{"request": {}}', b'{"request": {"uid": ""}}',
                 b'{"request": {"uid": 7}}', b'{"request": []}', b"\xff\xfe"):
        result = run(body, mutate, cfg)
        assert result.status == 400, body
        assert result.decision is None


def test_a_failing_decision_denies_with_the_uid_instead_of_raising() -> None:
    def broken(*_: Any) -> Any:
        raise RuntimeError("boom")

    body = orjson.dumps(review(RayJob().obj(), uid="abc"))
    result = answer(body, broken, RaygateConfig(), lambda ns: OPTED_IN)
    resp = json.loads(result.body)["response"]
    assert (result.status, resp["uid"], resp["allowed"], resp["status"]["code"]) == (200, "abc", False, 500)
    assert "RuntimeError: boom" in resp["status"]["message"]


def test_a_failing_namespace_cache_denies_instead_of_raising() -> None:
    def labels_for(namespace: str) -> dict[str, str]:
        raise KeyError(namespace)

    body = orjson.dumps(review(RayJob().obj(), uid="abc"))
    result = answer(body, mutate, RaygateConfig(), labels_for)
    assert result.status == 200
    assert json.loads(result.body)["response"] == {
        "uid": "abc", "allowed": False, "status": {
            "code": 500, "reason": "InternalError",
            "message": result.decision.message if result.decision else "",
        },
    }


@SETTINGS
@given(seed=st.integers(min_value=0, max_value=2**32), cfg=configs())
def test_damaged_reviews_of_the_fuzz_command_never_make_an_internal_error(seed: int, cfg: RaygateConfig) -> None:
    """The fuzz run's damage (`make fuzz` sends 100,000 of them to the served webhook), in miniature: every
    answer is a 400 or a well-formed review echoing the uid, no decision is an internal error, patches apply."""
    import random

    from benchmarks.fuzz import _bases, damage

    body, sent = damage(random.Random(seed), _bases(), f"uid-{seed}")
    for decide in (mutate, validate):
        result = run(body, decide, cfg)
        if result.status == 400:
            continue
        resp = check_answer(result, body)
        assert resp is not None and result.decision is not None
        assert result.decision.outcome != "error", result.decision.message
        if resp.get("patch") and sent is not None:
            jsonpatch.apply_patch(sent["request"]["object"], orjson.loads(base64.b64decode(resp["patch"])))
