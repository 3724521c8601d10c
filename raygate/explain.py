"""`raygate explain`: run the webhook's pure admission decision on a manifest, offline.

It shows what `kubectl create` would meet: the verdict, the JSON patch raygate would apply, the gang
(pods and resources per pod set) and, in a mode that schedules the gang through group objects, the
objects the reconciler would create. No cluster is contacted unless `--kubeconfig` is given: then it
asks that cluster which APIs it serves (the gang-scheduling version), and refuses a config whose mode
the cluster cannot run, as raygate does at config load. The namespace counts as opted in.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from raygate.core import keys
from raygate.core import quantity as q
from raygate.core.api import OFFLINE, Served
from raygate.core.config import parse_config
from raygate.core.errors import RaygateError
from raygate.core.keys import Mode
from raygate.core.modes import GroupRules, ObjectRules, for_object
from raygate.core.objects import metadata
from raygate.core.policy import DEFAULT_CONFIG, ConfigError, RaygateConfig

# Why an object is left alone, in words, by the decision's outcome.
LEFT_ALONE = {
    "skipped-owned-by-rayjob": "left alone: this RayCluster belongs to a RayJob, which is gang-admitted instead",
    "skipped-cluster-selector": "left alone: the RayJob runs on an existing cluster (clusterSelector), there is "
    "no gang to admit",
    "skipped-namespace": "left alone: raygate never acts in this namespace",
    "unchanged": "nothing to change: raygate has already prepared this object",
}
EXIT_REFUSED = 2


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser],
             discover: Callable[[str], Served] | None = None) -> None:
    """`discover(kubeconfig)`: what a cluster serves (wired in by raygate.cli: this module stays pure)."""
    p = sub.add_parser(
        "explain",
        help="run the admission decision offline on a manifest",
        description="Run raygate's admission decision on a RayJob or RayCluster manifest without a cluster: "
        "the verdict, the JSON patch and the gang per pod set. The namespace counts as opted in.",
        epilog=f"Exit status: 0 when raygate would admit the object, {EXIT_REFUSED} when it would refuse it, "
        "1 when the manifest or config cannot be read.",
    )
    p.add_argument("-f", "--filename", required=True, help="manifest to explain (YAML or JSON; - for stdin)")
    p.add_argument("--mode", choices=[m.value for m in Mode],
                   help="the namespace's mode (default: from --config, else provisioning)")
    p.add_argument("--config", help="raygate config: a config.yaml or the raygate-config ConfigMap manifest")
    p.add_argument("-n", "--namespace", help="namespace whose policy applies (default: the manifest's, else default)")
    p.add_argument("--as", dest="user", default="raygate-explain",
                   help="the user who creates it (for example the KubeRay operator's account, whose RayClusters "
                   "for admitted RayJobs are left alone)")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text", help="output format")
    p.add_argument("--kubeconfig", default=None, metavar="PATH",
                   help="also ask this cluster which APIs it serves (Kubernetes' gang scheduling, for native mode): "
                   "the version the group objects would use, or why the mode cannot run there (default: offline)")
    p.set_defaults(func=run, discover=discover or _no_discovery)


# --- reading inputs -----------------------------------------------------------------------------

def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise RaygateError(f"cannot read {path}: {reason}") from None


def _one_document(text: str, path: str) -> Any:
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise RaygateError(f"{path} is not valid YAML{at}: {problem}") from None
    if len(docs) != 1:
        raise RaygateError(f"{path} holds {len(docs)} documents: explain one RayJob or RayCluster at a time")
    return docs[0]


def load_manifest(path: str) -> dict[str, Any]:
    obj = _one_document(_read(path), path)
    if not isinstance(obj, dict):
        raise RaygateError(f"{path} is not a Kubernetes object (a mapping with apiVersion and kind)")
    kind = obj.get("kind")
    if kind not in (keys.RAYJOB_KIND, keys.RAYCLUSTER_KIND):
        raise RaygateError(f"{path} holds a {kind or 'object without kind'}: raygate explains RayJob and RayCluster")
    if obj.get("apiVersion") != f"{keys.RAY_GROUP}/{keys.RAY_VERSION}":
        raise RaygateError(f"{path}: apiVersion {obj.get('apiVersion')!r} is not served: use {keys.RAY_GROUP}/"
                           f"{keys.RAY_VERSION}")
    return obj


def load_config(path: str | None, served: Served = OFFLINE) -> RaygateConfig:
    if path is None:
        try:
            return parse_config("", served) if served.known else DEFAULT_CONFIG
        except ConfigError as err:
            raise RaygateError(f"raygate's default config does not fit this cluster: {err}") from None
    text = _read(path)
    doc = _one_document(text, path) if text.strip() else None
    if isinstance(doc, dict) and doc.get("kind") == "ConfigMap":
        text = str((doc.get("data") or {}).get(keys.CONFIGMAP_KEY, ""))
    try:
        return parse_config(text, served)
    except ConfigError as err:
        raise RaygateError(f"{path} is not a valid raygate config: {err}") from None


def with_mode(config: RaygateConfig, namespace: str, mode: str | None, served: Served = OFFLINE) -> RaygateConfig:
    """The config with `namespace` switched to `mode`, validated like any ConfigMap."""
    if mode is None:
        return config
    raw = config.model_dump(by_alias=True, exclude_none=True, mode="json")
    raw["namespaces"] = {**raw.get("namespaces", {}), namespace: {**config.namespaces.get(namespace, {}), "mode": mode}}
    try:
        return parse_config(json.dumps(raw), served)
    except ConfigError as err:
        raise RaygateError(f"--mode {mode} does not fit the config: {err}") from None


# --- deciding -----------------------------------------------------------------------------------

def explain(obj: dict[str, Any], config: RaygateConfig, namespace: str,
            user: str = "raygate-explain", served: Served = OFFLINE) -> dict[str, Any]:
    """The decision as the JSON object `-o json` prints."""
    from raygate.core.workload import ManifestError, Workload
    from raygate.webhook.decision import mutate
    from raygate.webhook.review import AdmissionRequest

    request: AdmissionRequest = {
        "uid": "raygate-explain",
        "kind": {"group": keys.RAY_GROUP, "version": keys.RAY_VERSION, "kind": str(obj["kind"])},
        "operation": "CREATE",
        "namespace": namespace,
        "name": str(metadata(obj).get("name") or ""),
        "userInfo": {"username": user},
        "object": obj,
    }
    d = mutate(request, None, config)  # None: the namespace cache is not consulted, so it counts as opted in
    gang = d.gang
    if not d.allowed:
        try:  # the gang of a refused object still helps (maxGang, for one); unreadable has none
            gang = Workload(obj).gang()
        except ManifestError:
            gang = None
    message = d.message
    rules = rules_of(config, namespace)
    group = rules.group
    if d.allowed and message is None:
        message = "; ".join(d.warnings) or LEFT_ALONE.get(d.outcome)
    return {
        "allowed": d.allowed,
        "message": message,
        "patch": d.patch,
        "gang": gang.to_json() if gang is not None and d.outcome not in LEFT_ALONE else None,
        "groups": _groups(obj, group, served) if group is not None and d.allowed and d.patch else None,
        "queue": _queue(config, rules, obj) if d.allowed and d.patch and rules.holds and rules.books else None,
    }


def _queue(config: RaygateConfig, rules: ObjectRules, obj: dict[str, Any]) -> dict[str, Any]:
    """The queue the object would wait in, its strategy, and the PriorityClass that orders it there."""
    from raygate.core import queueing
    from raygate.core.policy import QueuePolicy
    from raygate.core.workload import Workload

    name = rules.policy.queue
    return {"name": name, "strategy": (config.queues.get(name) or QueuePolicy()).strategy.value,
            "priorityClassName": queueing.priority_class_name(Workload(obj), rules.policy.default_priority_class_name)}


def rules_of(config: RaygateConfig, namespace: str) -> ObjectRules:
    """The rules of an object being created in `namespace` (its namespace's mode)."""
    return for_object(config.policy_for(namespace))


def _groups(obj: dict[str, Any], rules: GroupRules, served: Served) -> dict[str, Any] | None:
    """The group objects the reconciler would create for the object (named as for this manifest: a created
    object's names also hash its uid), and the line that says what they do."""
    from raygate.core.workload import ManifestError, Workload

    w = Workload({**obj, "metadata": {**(obj.get("metadata") or {}),
                                     "name": metadata(obj).get("name") or metadata(obj).get("generateName") or ""}})
    try:
        spec = rules.recorded(w)
    except ManifestError:
        return None  # recorded by the webhook at creation: nothing to read back from a manifest
    return {"summary": rules.describe(spec, served),
            "objects": [o for _, o in rules.group_objects(w, spec, served)]}


# --- printing -----------------------------------------------------------------------------------

def _resources(res: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in res.items()) or "-"


def _total(per_pod: dict[str, str], count: int) -> dict[str, str]:
    return q.render({k: q.parse(v) * count for k, v in per_pod.items()})


def render_text(result: dict[str, Any], obj: dict[str, Any], namespace: str, rules: ObjectRules) -> str:
    name = metadata(obj).get("name") or metadata(obj).get("generateName") or "?"
    lines = [f"{obj['kind']} {namespace}/{name} in {rules.mode.value} mode"]
    if not result["allowed"]:
        lines += ["verdict: REFUSED: kubectl create fails with", f"  {result['message']}"]
    elif result["patch"]:
        lines.append("verdict: admitted, changed as below" + (" and held until its capacity is ready"
                                                              if rules.holds else ""))
        if result["message"]:
            lines.append(f"warning: {result['message']}")
    else:
        lines.append(f"verdict: admitted unchanged ({result['message']})")
    if result["patch"]:
        lines.append(f"patch ({len(result['patch'])} JSON Patch operations):")
        for op in result["patch"]:
            value = f" {json.dumps(op['value'], sort_keys=True)}" if "value" in op else ""
            lines.append(f"  {op['op']:<6} {op['path']}{value}")
    if (queue := result.get("queue")) is not None:
        lines.append(f"queue: {queue['name']} ({queue['strategy']}), by priority "
                     f"{queue['priorityClassName'] or '(no PriorityClass: the cluster default)'}, then creation time")
    gang = result["gang"]
    if gang is not None:
        lines += _gang_table(gang, obj)
    groups = result.get("groups")
    if groups is not None and groups.get("summary"):
        lines.append(f"gang scheduling: {groups['summary']}")
        lines += [f"  {o['kind']} {o['apiVersion']}: {json.dumps(o['spec'], sort_keys=True)}"
                  for o in groups["objects"]]
    return "\n".join(lines)


def _gang_table(gang: dict[str, Any], obj: dict[str, Any]) -> list[str]:
    # Under in-tree autoscaling the pods KubeRay starts (booked), Volcano's minMember share and the
    # autoscaler's ceiling differ: show all three then, and only then.
    elastic = any("minMemberCount" in s or "maxCount" in s for s in gang["podSets"])
    rows: list[tuple[str, ...]] = [("POD SET", "PODS", "PER POD", "TOTAL", *(("MIN MEMBER", "MAX") if elastic else ()))]
    for s in gang["podSets"]:
        pods = f"{s['count']}" + ("" if s["name"] != keys.SUBMITTER_TASK or obj["kind"] != keys.RAYJOB_KIND
                                  or s["count"] == 0 else "*")
        row: tuple[str, ...] = (s["name"], pods, _resources(s["resources"]),
                                _resources(_total(s["resources"], s["count"])))
        if elastic:
            row += (str(s.get("minMemberCount", s["count"])), str(s.get("maxCount", s["count"])))
        rows.append(row)
    rows.append(("gang", str(gang["minMember"]), "", _resources(gang["minResources"]), *(("", "") if elastic else ())))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"gang: minMember {gang['minMember']}"]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if any(s["name"] == keys.SUBMITTER_TASK for s in gang["podSets"]):
        lines.append("  * the submitter pod counts in resources, not in minMember: it waits for the cluster")
    if elastic:
        lines.append("  in-tree autoscaling: KubeRay starts PODS, and raygate books them; Volcano's minMember counts "
                     "MIN MEMBER; the Ray autoscaler may grow a set up to MAX, which is elastic and not booked")
    return lines


def _no_discovery(kubeconfig: str) -> Served:
    raise RaygateError("--kubeconfig is not available here: run `raygate explain` from the raygate command")


def run(args: argparse.Namespace) -> int:
    obj = load_manifest(args.filename)
    namespace = args.namespace or str(metadata(obj).get("namespace") or "default")
    served = args.discover(args.kubeconfig) if args.kubeconfig else OFFLINE
    config = with_mode(load_config(args.config, served), namespace, args.mode, served)
    result = explain(obj, config, namespace, args.user, served)
    if args.output == "json":
        print(json.dumps(result, sort_keys=False))
    else:
        print(render_text(result, obj, namespace, rules_of(config, namespace)))
    return 0 if result["allowed"] else EXIT_REFUSED
