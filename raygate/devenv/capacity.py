"""A stand-in for cluster-autoscaler's check-capacity ProvisioningRequest class, for tests and the demo.

It owns a fixed number of GPUs and answers every ProvisioningRequest the way the autoscaler does:
Accepted=True at once; Provisioned=True when the request's pods (count x the GPU request, or limit,
of its PodTemplate) fit into the GPUs that other still-existing Provisioned requests do not hold;
otherwise Provisioned=False with reason CapacityNotFound. Requests still waiting are evaluated
again, oldest first, whenever a request or template comes or goes, so deleting a job frees its
capacity for the next one. It writes only the requests' status subresource.

Not a simulation of nodes: it exists so the gang-admission flow can be shown end to end without a
cloud provider.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import signal
import sys
import threading
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from raygate import keys
from raygate.informer import Informer
from raygate.kube import JSON, MERGE_PATCH, PODTEMPLATES, ApiError, Kube, Resource, provisioning_requests
from raygate.workload import ManifestError, get, pod_request
from reconciler.flow import raw_conditions

log = logging.getLogger("raygate.capacity")
NOT_FOUND = "CapacityNotFound"


def _condition(ctype: str, status: bool, reason: str, message: str, now: str) -> JSON:
    return {"type": ctype, "status": "True" if status else "False", "reason": reason, "message": message,
            "lastTransitionTime": now}


def _is(pr: Mapping[str, Any], ctype: str, status: str = "True") -> bool:
    return raw_conditions(pr).get(ctype, {}).get("status") == status


class CapacityStandIn:
    def __init__(self, kube: Kube, gpus: int, resource: str = "nvidia.com/gpu", *,
                 namespace: str | None = None, version: str | None = None) -> None:
        self.kube = kube
        self.gpus = gpus
        self.resource = resource
        self.namespace = namespace
        if version is None:
            version = next((v for v in keys.PROVREQ_VERSIONS if kube.served(keys.PROVREQ_GROUP, v)), None)
            if version is None:
                raise RuntimeError(f"no ProvisioningRequest API ({keys.PROVREQ_GROUP}) is served")
        self.requests_res: Resource = provisioning_requests(version)
        self._kick = threading.Event()
        self._stop = threading.Event()
        self._held: dict[str, Decimal] = {}  # uid -> GPUs of requests this stand-in provisioned
        self._requests = Informer(kube, self.requests_res, namespace=namespace, handler=self._on_event,
                                  resync_seconds=30)
        self._templates = Informer(kube, PODTEMPLATES, namespace=namespace, handler=self._on_event,
                                   resync_seconds=30)
        self._thread: threading.Thread | None = None

    def start(self) -> CapacityStandIn:
        self._requests.start()
        self._templates.start()
        self._thread = threading.Thread(target=self._run, name="capacity-stand-in", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._kick.set()
        self._requests.stop()
        self._templates.stop()
        if self._thread is not None:
            self._thread.join(5)

    def _on_event(self, event: str, obj: JSON) -> None:
        self._kick.set()

    def _run(self) -> None:
        self._requests.wait_synced(30)
        self._templates.wait_synced(30)
        while not self._stop.is_set():
            self._kick.wait(5)
            self._kick.clear()
            if self._stop.is_set():
                return
            try:
                self.evaluate()
            except Exception:
                log.exception("capacity stand-in pass failed")

    def need(self, pr: Mapping[str, Any]) -> Decimal | None:
        """GPUs the request's pods need; None while one of its PodTemplates is not seen yet."""
        ns = str(get(pr, ("metadata", "namespace"), ""))
        total = Decimal(0)
        for ps in get(pr, ("spec", "podSets")) or []:
            tpl = self._templates.get(ns, str(get(ps, ("podTemplateRef", "name"), "")))
            if tpl is None:
                return None
            try:
                per_pod = pod_request(tpl.get("template") or {}, ("template",)).get(self.resource, Decimal(0))
            except ManifestError:
                per_pod = Decimal(0)
            total += per_pod * int(ps.get("count") or 0)
        return total

    def evaluate(self) -> None:
        """One pass: free capacity, then every waiting request oldest first."""
        prs = sorted(self._requests.items(), key=lambda p: (str(get(p, ("metadata", "creationTimestamp"), "")),
                                                          str(get(p, ("metadata", "name"), ""))))
        live = {str(get(p, ("metadata", "uid"))) for p in prs}
        self._held = {uid: n for uid, n in self._held.items() if uid in live}
        for pr in prs:
            uid = str(get(pr, ("metadata", "uid")))
            if uid not in self._held and _is(pr, "Provisioned"):
                need = self.need(pr)  # provisioned before a restart of this stand-in
                self._held[uid] = need if need is not None else Decimal(0)
        for pr in prs:
            uid = str(get(pr, ("metadata", "uid")))
            if uid in self._held or _is(pr, "Failed") or get(pr, ("metadata", "deletionTimestamp")):
                continue
            need = self.need(pr)
            if need is None:
                continue
            free = Decimal(self.gpus) - sum(self._held.values(), Decimal(0))
            if need <= free:
                self._answer(pr, True, f"{need} {self.resource} booked; {free - need} left of {self.gpus}")
                self._held[uid] = need
            elif not _is(pr, "Provisioned", "False") or raw_conditions(pr)["Provisioned"].get("reason") != NOT_FOUND:
                self._answer(pr, False, f"needs {need} {self.resource}, {free} of {self.gpus} free")

    def _answer(self, pr: Mapping[str, Any], provisioned: bool, message: str) -> None:
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        accepted = raw_conditions(pr).get("Accepted")
        conds = [
            dict(accepted) if accepted and accepted.get("status") == "True" else
            _condition("Accepted", True, "Accepted", "the request is valid", now),
            _condition("Provisioned", provisioned, "Provisioned" if provisioned else NOT_FOUND, message, now),
        ]
        name, ns = str(get(pr, ("metadata", "name"))), str(get(pr, ("metadata", "namespace")))
        try:
            self.kube.patch(self.requests_res, name, {"status": {"conditions": conds}}, ns,
                            content_type=MERGE_PATCH, sub="status")
        except ApiError as err:
            if not err.not_found:
                raise
            return
        log.info("answered ProvisioningRequest", extra={"namespace": ns, "name": name, "provisioned": provisioned,
                                                       "detail": message})


def start_capacity(cp: Any, gpus: int, *, name: str = "capacity-stand-in") -> None:
    """Run the stand-in as a process of a local control plane (`raygate dev down` stops it)."""
    state = cp.load_state()
    if state is None:
        raise RuntimeError("start the control plane before the capacity stand-in")
    cp.spawn(state, name, [sys.executable, "-m", "raygate.devenv.capacity", "--kubeconfig", str(cp.kubeconfig),
                            "--gpus", str(gpus)])


def main(argv: list[str] | None = None) -> int:
    from raygate import logs

    p = argparse.ArgumentParser(prog="python -m raygate.devenv.capacity", description=__doc__.split("\n\n")[0])
    p.add_argument("--kubeconfig", default=None, help="kubeconfig (default: $KUBECONFIG)")
    p.add_argument("--gpus", type=int, required=True, help="GPUs the simulated cluster has")
    p.add_argument("--resource", default="nvidia.com/gpu", help="resource name counted (default: %(default)s)")
    p.add_argument("--namespace", default=None, help="answer requests in this namespace only (default: all)")
    args = p.parse_args(argv)
    logs.setup("info")
    stand_in = CapacityStandIn(Kube.connect(args.kubeconfig, user_agent="raygate-capacity-stand-in"), args.gpus,
                               args.resource, namespace=args.namespace).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    stand_in.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
