"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager and,
optionally, the KubeRay operator, with the pinned CRDs installed server-side.

One class serves `raygate dev up|down|env` and the pytest session fixture, so the tests run on the
same control plane a developer starts by hand.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from raygate.core import keys, pki
from raygate.core.errors import RaygateError
from raygate.core.policy import KUBERAY_OPERATOR_USER
from raygate.devenv.build import Bundle

SERVICE_CIDR = "10.96.0.0/16"
STATE_FILE = "state.json"
ADMIN_USER = "raygate-dev-admin"
# kube-controller-manager's controllers: those of a real cluster that Ray workloads touch (the README's
# "The local stack" says why each runs, and why the others do not: each costs CPU on two cores).
CONTROLLERS = (
    "garbage-collector-controller",  # ownerReferences: RayJob -> RayCluster -> pods, RayJob -> Job -> pod
    "namespace-controller",  # a deleted namespace is emptied, then removed
    "serviceaccount-controller",  # the `default` ServiceAccount a pod needs to be admitted
    "node-lifecycle-controller",  # takes the not-ready taint of a new node off once KWOK reports it Ready
    # Pods bound to a node that is gone (the autoscaler deleted it): no kubelet will ever confirm
    # their deletion, so without it they stay Terminating for good.
    "pod-garbage-collector-controller",
    "job-controller",  # KubeRay's batch Jobs: without it the K8sJobMode submitter pod never exists
    # The built-in `edit` and `view` ClusterRoles get their rules from the roles aggregated into them: without
    # it they grant nothing, and users act with less than clusters give them.
    "clusterrole-aggregation-controller",
)

# The audit policy of `up(audit=True)`: writes only, metadata only, Lease renewals left out.
AUDIT_POLICY: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "None", "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}]},
        {"level": "Metadata", "verbs": ["create", "update", "patch", "delete", "deletecollection"]},
        {"level": "None"},
    ],
}


GANG_STATE = "gang-scheduling"  # state.extra: "on" when the control plane runs with Kubernetes' gang scheduling


def gang_scheduling(state: State) -> bool:
    """Whether this control plane serves and runs Kubernetes' gang scheduling (`raygate dev up --gang-scheduling`)."""
    return state.extra.get(GANG_STATE) == "on"


CRD_ESTABLISHED_SECONDS = 180.0


# Ports handed out by free_port: below the kernel's ephemeral range, where outgoing connections take theirs.
LISTEN_PORTS_FROM = 10000
PORT_TAKEN = "address already in use"  # what a process that lost its port to another listener says
PORT_ATTEMPTS = 3
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port() -> int:
    """A port free on 127.0.0.1 now, for a process to listen on later.

    Not one the kernel picks (bind to port 0): it comes from the ephemeral range, which every outgoing connection
    draws from too, so in the seconds before its process binds it (the cluster-autoscaler's metrics port waits for a
    whole control plane to start) any client's connection can take it, and the process dies at start ("bind: address
    already in use"). Below that range only a listener can take it."""
    try:
        ephemeral_from = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_from = 32768  # Linux's default
    candidates = range(LISTEN_PORTS_FROM, ephemeral_from)
    if len(candidates) >= 1000:  # else too few to pick from at random: the kernel's choice, below
        for _ in range(100):
            port = candidates[secrets.randbelow(len(candidates))]
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _etcd_healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
            return bool(resp.status == 200 and json.loads(resp.read()).get("health") == "true")
    except (OSError, ValueError):
        return False


def require_free(port: int, what: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise RaygateError(
                f"port {port} on 127.0.0.1 for {what} is already in use: stop what listens there "
                "or choose another port"
            ) from None
    return port


@dataclass
class State:
    apiserver_port: int
    etcd_port: int
    etcd_peer_port: int
    pids: dict[str, int] = field(default_factory=dict)
    extra: dict[str, str] = field(default_factory=dict)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is dead for our purposes.
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            return False
    return True


def log_gist(path: Path) -> str:
    """The gist of a process's log: its first fatal line (klog's `F...`, a Go panic) when it has one,
    since the goroutine dump that follows a fatal says nothing; else its last line."""
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    fatal = next((ln for ln in lines if _FATAL.match(ln)), None)
    return (fatal or (lines[-1] if lines else "no log output"))[:400]


_FATAL = re.compile(r"^(F\d{4} |panic: |fatal error: )")


class ControlPlane:
    """Processes, certificates and a kubeconfig under `workdir`; `down` removes every process."""

    def __init__(self, workdir: Path, bundle: Bundle) -> None:
        self.workdir = workdir.resolve()
        self.bundle = bundle
        self.pki = self.workdir / "pki"
        self.logs = self.workdir / "logs"
        self.kubeconfig = self.workdir / "kubeconfig"

    # --- state ---------------------------------------------------------------------------------
    def _state_path(self) -> Path:
        return self.workdir / STATE_FILE

    def load_state(self) -> State | None:
        try:
            return State(**json.loads(self._state_path().read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def save_state(self, state: State) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        tmp = self._state_path().with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(state), indent=2))
        tmp.replace(self._state_path())

    @property
    def server(self) -> str:
        state = self.load_state()
        if state is None:
            raise RaygateError(f"no control plane in {self.workdir}: run `raygate dev up` first")
        return f"https://127.0.0.1:{state.apiserver_port}"

    def running(self) -> bool:
        state = self.load_state()
        if state is None or not state.pids:
            return False
        return all(alive(p) for p in state.pids.values()) and self._ready(state)

    # --- certificates --------------------------------------------------------------------------
    def _write_pki(self) -> None:
        self.pki.mkdir(parents=True, exist_ok=True)
        year = dt.timedelta(days=365)
        ca = pki.make_ca("raygate-dev-ca", year)
        serving = pki.make_leaf(
            ca,
            "kube-apiserver",
            year,
            sans=["127.0.0.1", "localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                  "10.96.0.1"],
        )
        admin = pki.make_leaf(
            ca, ADMIN_USER, year, organizations=["system:masters"], server=False, client=True
        )
        sa_key, sa_pub = pki.make_signing_key()
        files = {
            "ca.crt": ca.cert_pem,
            "ca.key": ca.key_pem,
            "apiserver.crt": serving.cert_pem,
            "apiserver.key": serving.key_pem,
            "admin.crt": admin.cert_pem,
            "admin.key": admin.key_pem,
            "sa.key": sa_key,
            "sa.pub": sa_pub,
        }
        for name, data in files.items():
            path = self.pki / name
            path.write_bytes(data)
            path.chmod(0o600)

    def _write_kubeconfig(self, port: int) -> None:
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "raygate-dev",
                    "cluster": {
                        "server": f"https://127.0.0.1:{port}",
                        "certificate-authority": str(self.pki / "ca.crt"),
                    },
                }
            ],
            "users": [
                {
                    "name": ADMIN_USER,
                    "user": {
                        "client-certificate": str(self.pki / "admin.crt"),
                        "client-key": str(self.pki / "admin.key"),
                    },
                }
            ],
            "contexts": [{"name": "raygate-dev", "context": {"cluster": "raygate-dev", "user": ADMIN_USER}}],
            "current-context": "raygate-dev",
        }
        # JSON is valid YAML, and every kubeconfig reader accepts it.
        self.kubeconfig.write_text(json.dumps(cfg, indent=2))
        self.kubeconfig.chmod(0o600)

    # --- processes -----------------------------------------------------------------------------
    def spawn(self, state: State, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = (self.logs / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.workdir,
            env={**os.environ, **(env or {})},
            start_new_session=True,  # its own process group, so `down` can stop children too
        )
        log.close()
        state.pids[name] = proc.pid
        self.save_state(state)

    def _ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def _ready(self, state: State) -> bool:
        try:
            url = f"https://127.0.0.1:{state.apiserver_port}/readyz"
            with urllib.request.urlopen(url, context=self._ssl_context(), timeout=2) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError, ssl.SSLError):
            return False

    def wait_for(self, state: State, name: str, check: object, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not alive(state.pids[name]):
                raise RaygateError(f"{name} exited during start-up: {log_gist(self.logs / f'{name}.log')}")
            if callable(check) and check():
                return
            time.sleep(0.2)
        raise RaygateError(f"{name} was not ready after {timeout:.0f}s: {log_gist(self.logs / f'{name}.log')}")

    def kubectl(self, *args: str, input_text: str | None = None, check: bool = True) -> str:
        proc = subprocess.run(
            [str(self.bundle.binary("kubectl")), "--kubeconfig", str(self.kubeconfig), *args],
            input=input_text,
            capture_output=True,
            text=True,
            check=False,
        )
        if check and proc.returncode != 0:
            raise RaygateError(f"kubectl {' '.join(args[:3])} failed: {proc.stderr.strip()[:500]}")
        return proc.stdout

    @property
    def audit_log(self) -> Path:
        """Where kube-apiserver writes its audit log when started with `audit=True`."""
        return self.logs / "audit.log"

    def up(self, *, kuberay: bool = False, apiserver_port: int | None = None, log: bool = True,
           gang: bool | None = None, audit: bool = False, profiling: bool = False) -> State:
        """`gang`: Kubernetes' own gang scheduling on (True) or off (False): the Workload and PodGroup API,
        scheduling.k8s.io, served and run, through the feature gates of kube-apiserver, kube-controller-manager
        and kube-scheduler. None: as the running control plane has it (off for a new one). `audit`: a new
        control plane's kube-apiserver writes an audit log of every write (`audit_log`). `profiling`: a new
        control plane's kube-apiserver serves Go's CPU profiles (/debug/pprof), for the benchmarks."""
        if not self.bundle.complete:
            raise RaygateError(
                f"the control-plane binaries are not built in {self.bundle.root}: run `make cluster-bins`"
            )
        existing = self.load_state()
        if existing is not None and self.running():
            if gang is not None and gang_scheduling(existing) != gang:
                have = "on" if gang_scheduling(existing) else "off"
                raise RaygateError(
                    f"the control plane in {self.workdir} runs with gang scheduling {have}, and its feature gates are "
                    f"read only at start: run `raygate dev down`, then `raygate dev up` "
                    f"{'with' if gang else 'without'} --gang-scheduling (the cluster's data stays)")
            self.start_controller_manager(existing)  # one started by an older raygate may lack some
            if kuberay and "kuberay-operator" not in existing.pids:
                self.start_kuberay(existing)
            if log:
                print(f"dev: control plane already running at https://127.0.0.1:{existing.apiserver_port}")
            return existing
        if existing is not None:
            self.down(log=False)  # stale or half-started: clear it before starting again
        t0 = time.monotonic()
        for attempt in range(1, PORT_ATTEMPTS + 1):
            state = State(
                apiserver_port=require_free(apiserver_port, "kube-apiserver") if apiserver_port else free_port(),
                etcd_port=free_port(),
                etcd_peer_port=free_port(),
            )
            if gang:
                state.extra[GANG_STATE] = "on"
            self.save_state(state)
            try:
                self._start(state, kuberay=kuberay, audit=audit, profiling=profiling)
                break
            except RaygateError as err:
                self.down(log=False)
                # A port free when picked can be taken by another listener before its process binds it: pick again.
                if PORT_TAKEN not in str(err) or attempt == PORT_ATTEMPTS:
                    raise
                if log:
                    print(f"dev: a port was taken before it was bound ({err}); starting again on other ports")
            except BaseException:
                self.down(log=False)
                raise
        if log:
            print(f"dev: control plane ready at https://127.0.0.1:{state.apiserver_port} "
                  f"in {time.monotonic() - t0:.1f}s; kubeconfig {self.kubeconfig}")
        return state

    def _start(self, state: State, *, kuberay: bool, audit: bool = False, profiling: bool = False) -> None:
        self._write_pki()
        self._write_kubeconfig(state.apiserver_port)
        etcd_data = self.workdir / "etcd"
        etcd_url = f"http://127.0.0.1:{state.etcd_port}"
        peer_url = f"http://127.0.0.1:{state.etcd_peer_port}"
        self.spawn(state, "etcd", [
            str(self.bundle.binary("etcd")),
            f"--data-dir={etcd_data}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=default={peer_url}",
            "--unsafe-no-fsync=true",  # throwaway data: skip fsync for speed
            "--log-level=warn",
        ])
        b = self.bundle.binary
        p = self.pki
        self.spawn(state, "kube-apiserver", [
            str(b("kube-apiserver")),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={state.apiserver_port}",
            f"--tls-cert-file={p / 'apiserver.crt'}",
            f"--tls-private-key-file={p / 'apiserver.key'}",
            f"--client-ca-file={p / 'ca.crt'}",
            f"--service-account-key-file={p / 'sa.pub'}",
            f"--service-account-signing-key-file={p / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=RBAC",
            # As strict as hardened clusters: setting blockOwnerDeletion on a child needs update
            # on the owner's finalizers, so the reconciler's RBAC is tested for it.
            "--enable-admission-plugins=OwnerReferencesPermissionEnforcement",
            *(keys.GANG_APISERVER_FLAGS if gang_scheduling(state) else ()),
            "--allow-privileged=true",
            "--enable-priority-and-fairness=false",
            f"--profiling={str(profiling).lower()}",
            f"--cert-dir={p}",
            "--v=0",
            *(self._audit_args() if audit else []),
        ])
        self.wait_for(state, "etcd", lambda: _etcd_healthy(state.etcd_port), 30)
        self.wait_for(state, "kube-apiserver", lambda: self._ready(state), 60)
        self.start_controller_manager(state)
        self.install_crds()
        # Kept data may still register a raygate webhook by the URL of one that no longer runs (a `down`
        # that never happened): every create would fail. `up --raygate` registers it anew.
        from raygate.devenv.raygate_local import unregister_webhook

        unregister_webhook(self)
        if kuberay:
            self.start_kuberay(state)

    def _audit_args(self) -> list[str]:
        """Audit every write but Lease renewals, one line each (who, what, answer): a benchmark counts
        writes by writer from it, which the API server's own metrics cannot tell apart."""
        policy = self.workdir / "audit-policy.json"
        policy.write_text(json.dumps(AUDIT_POLICY))
        self.logs.mkdir(parents=True, exist_ok=True)
        return [f"--audit-policy-file={policy}", f"--audit-log-path={self.audit_log}", "--audit-log-format=json"]

    def start_controller_manager(self, state: State, extra: tuple[str, ...] = ()) -> None:
        """kube-controller-manager with the controllers the local stack needs, plus `extra` ones; a
        running one that lacks any of them is restarted with them (it reads the list only at start)."""
        base = (*CONTROLLERS, keys.GANG_PROTECTION_CONTROLLER) if gang_scheduling(state) else CONTROLLERS
        controllers = [*base, *(c for c in extra if c not in base)]
        running = [c for c in state.extra.get("kcm-controllers", "").split(",") if c]
        if "kube-controller-manager" in state.pids and alive(state.pids["kube-controller-manager"]):
            if set(controllers) <= set(running):
                return
            self.stop_process("kube-controller-manager", state)
            controllers = [*running, *(c for c in controllers if c not in running)]
        p = self.pki
        self.spawn(state, "kube-controller-manager", [
            str(self.bundle.binary("kube-controller-manager")),
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            "--leader-elect=false",
            f"--controllers={','.join(controllers)}",
            f"--root-ca-file={p / 'ca.crt'}",
            f"--service-account-private-key-file={p / 'sa.key'}",
            # Each controller under its own ServiceAccount of kube-system, as kubeadm and managed clusters run
            # them: raygate tells the Job controller's and the garbage collector's requests by that name.
            "--use-service-account-credentials=true",
            "--concurrent-gc-syncs=5",
            *(keys.GANG_CONTROLLER_MANAGER_FLAGS if gang_scheduling(state) else ()),
        ])
        state.extra["kcm-controllers"] = ",".join(controllers)
        self.save_state(state)

    def install_crds(self) -> None:
        """Server-side apply of every pinned CRD (the KubeRay CRDs exceed the annotation size limit of
        client-side apply), in parallel and straight over HTTPS: `kubectl apply` spends most of its
        time parsing 5 MB of YAML, and `kubectl wait --for=condition=Established crd --all` fails
        outright on a CRD whose status has no conditions yet, the state right after the apply."""
        from concurrent.futures import ThreadPoolExecutor

        crds = self._crd_documents()
        base = f"{self.server}/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        ctx = self._ssl_context()

        def apply(crd: dict[str, Any]) -> None:
            name = str(crd["metadata"]["name"])
            req = urllib.request.Request(
                f"{base}/{name}?fieldManager=raygate-dev&force=true", method="PATCH",
                data=json.dumps(crd).encode(), headers={"Content-Type": "application/apply-patch+yaml"},
            )
            try:
                with urllib.request.urlopen(req, context=ctx, timeout=60) as resp:
                    resp.read()
            except urllib.error.HTTPError as err:
                detail = err.read()[:300].decode(errors="replace")
                raise RaygateError(f"installing CRD {name} failed: HTTP {err.code}: {detail}") from None
            except (OSError, urllib.error.URLError) as err:
                raise RaygateError(f"installing CRD {name} failed: {err}") from None

        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(apply, crds))
        names = {str(c["metadata"]["name"]) for c in crds}
        # KubeRay's RayService CRD (its schema is large) took over 60 s to be Established on 2 cores shared with
        # four other control planes (load average 11-14): a slow machine is not a broken one.
        deadline = time.monotonic() + CRD_ESTABLISHED_SECONDS
        while True:
            pending = names - self._established_crds(base, ctx)
            if not pending:
                return
            if time.monotonic() > deadline:
                raise RaygateError(f"CRDs not Established after {CRD_ESTABLISHED_SECONDS:.0f}s: "
                                  f"{', '.join(sorted(pending))}")
            time.sleep(0.2)

    def _crd_documents(self) -> list[dict[str, Any]]:
        """The bundle's CRDs as JSON, converted from YAML once and kept next to them."""
        cached = self.bundle.root / "crds.json"
        sources = sorted(self.bundle.crd_dir.glob("*.yaml"))
        stamp = [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in sources]
        with contextlib.suppress(OSError, ValueError, KeyError):
            data = json.loads(cached.read_text())
            if data["stamp"] == stamp:
                return list(data["crds"])
        import yaml

        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        crds = [doc for p in sources for doc in yaml.load_all(p.read_text(), Loader=loader)
                if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition"]
        if not crds:
            raise RaygateError(f"no CRDs in {self.bundle.crd_dir}: rebuild with `raygate dev build --force`")
        tmp = cached.with_name(f"crds.json.{os.getpid()}")
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps({"stamp": stamp, "crds": crds}))
            tmp.replace(cached)
        return crds

    def _established_crds(self, base: str, ctx: ssl.SSLContext) -> set[str]:
        # Table-free metadata would not carry status; the full list is parsed in well under a second.
        try:
            with urllib.request.urlopen(base, context=ctx, timeout=30) as resp:
                items = json.loads(resp.read()).get("items", [])
        except (OSError, urllib.error.URLError, ValueError):
            return set()
        done = set()
        for crd in items:
            conditions = (crd.get("status") or {}).get("conditions") or []
            if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
                done.add(str(crd["metadata"]["name"]))
        return done

    def kubeconfig_as(self, user: str, groups: list[str]) -> Path:
        """A kubeconfig that impersonates `user`: a local process acts under that identity, as it would
        with its ServiceAccount token in a cluster (the admin certificate may impersonate anyone)."""
        cfg = json.loads(self.kubeconfig.read_text())
        cfg["users"][0]["user"].update({"as": user, "as-groups": groups})
        path = self.workdir / f"kubeconfig-{user.replace(':', '-')}"
        path.write_text(json.dumps(cfg, indent=2))
        path.chmod(0o600)
        return path

    def start_kuberay(self, state: State | None = None, *extra_args: str) -> None:
        """The KubeRay operator under its own ServiceAccount's name (the default of raygate's
        rayOperatorUsers), so raygate tells its requests from a user's as it would in a cluster."""
        state = state or self.load_state()
        if state is None:
            raise RaygateError("start the control plane before the KubeRay operator")
        _, namespace, name = KUBERAY_OPERATOR_USER.rsplit(":", 2)
        # Local only: cluster-admin for the operator's account instead of KubeRay's own ClusterRole.
        binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                   "metadata": {"name": "raygate-dev-kuberay-operator"},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                   "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]}
        self.kubectl("apply", "-f", "-", input_text=json.dumps(binding))
        kubeconfig = self.kubeconfig_as(KUBERAY_OPERATOR_USER, ["system:serviceaccounts",
                                                                f"system:serviceaccounts:{namespace}",
                                                                "system:authenticated"])
        self.spawn(
            state,
            "kuberay-operator",
            [
                str(self.bundle.binary("kuberay-operator")),
                "--metrics-addr=0",
                "--health-probe-bind-address=0",
                "--enable-leader-election=false",
                *extra_args,
            ],
            env={"KUBECONFIG": str(kubeconfig)},
        )
        time.sleep(0.5)
        self.wait_for(state, "kuberay-operator", lambda: True, 1)

    def stop_process(self, name: str, state: State | None = None) -> None:
        state = state or self.load_state()
        if state is None or name not in state.pids:
            return
        _terminate(state.pids.pop(name))
        self.save_state(state)

    def _owns(self, pid: int) -> bool:
        """Guard against a recycled pid: only stop processes started from this bundle or workdir."""
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return False
        return str(self.bundle.root) in cmdline or str(self.workdir) in cmdline or "raygate" in cmdline

    def wipe(self) -> None:
        """`up --fresh`: stop what runs and delete the stored cluster data (etcd), for an empty cluster."""
        self.down(log=False)
        shutil.rmtree(self.workdir / "etcd", ignore_errors=True)

    def down(self, *, log: bool = True) -> None:
        """Stop every process `up` started. What they registered in the cluster goes first: raygate's
        webhook configurations point at a local URL that would refuse every later create (failurePolicy
        Fail) once its webhook is gone. The cluster's data (etcd) stays for the next `up`."""
        state = self.load_state()
        if state is None:
            if log:
                print(f"dev: nothing running in {self.workdir}")
            return
        if "raygate-webhook" in state.pids and self._ready(state):
            from raygate.devenv.raygate_local import unregister_webhook

            unregister_webhook(self)
        # Reverse start order: operators first, etcd last.
        for name in reversed(list(state.pids)):
            if self._owns(state.pids[name]):
                _terminate(state.pids[name])
        self._state_path().unlink(missing_ok=True)
        if log:
            print(f"dev: stopped {', '.join(reversed(list(state.pids))) or 'nothing'}")


def _terminate(pid: int, grace: float = 10.0) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after `grace` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 5)
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            if not alive(pid):
                return
            time.sleep(0.05)
