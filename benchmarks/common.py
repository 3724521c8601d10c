"""What both benchmarks share: percentiles, targets, tables, the JSON report, machine info and a
throwaway control plane that is always torn down (also on Ctrl-C and SIGTERM)."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence, Sized
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from raygate.core.errors import RaygateError

REPO = Path(__file__).resolve().parent.parent
# Reports (and profiles) go here; RAYGATE_BENCH_OUT moves them (the benchmarks' own smoke tests do).
OUT_DIR = Path(os.environ.get("RAYGATE_BENCH_OUT") or REPO / "build" / "bench")


class BenchError(RaygateError):
    """The benchmark itself broke (as opposed to a target being missed)."""


# --- statistics ----------------------------------------------------------------------------------

def percentile(values: Sequence[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); NaN for no values."""
    if not values:
        return math.nan
    s = sorted(values)
    rank = (len(s) - 1) * p / 100.0
    lo, hi = math.floor(rank), math.ceil(rank)
    return s[lo] + (s[hi] - s[lo]) * (rank - lo)


def summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "n": float(len(values)),
        "min": min(values) if values else math.nan,
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": max(values) if values else math.nan,
        "mean": sum(values) / len(values) if values else math.nan,
    }


# --- targets -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    name: str
    value: float
    op: Literal["<=", ">="]
    limit: float
    unit: str

    @property
    def met(self) -> bool:
        if math.isnan(self.value):
            return False
        return self.value <= self.limit if self.op == "<=" else self.value >= self.limit

    def row(self) -> list[str]:
        return [self.name, f"{fmt(self.value)} {self.unit}", f"{self.op} {fmt(self.limit)} {self.unit}",
                "met" if self.met else "MISSED"]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "met": self.met}


def fmt(v: float) -> str:
    if isinstance(v, float) and math.isnan(v):
        return "n/a"
    if abs(v) >= 100 or float(v).is_integer():
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> str:
    cells = [[str(h) for h in headers]] + [[c if isinstance(c, str) else fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))

    out = [title, "=" * len(title)] if title else []
    out += [line(cells[0]), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)


def targets_table(targets: Sequence[Target]) -> str:
    return table(["target", "measured", "required", "result"], [t.row() for t in targets], "Targets")


# --- machine and report ------------------------------------------------------------------------

def create_all(names: Sequence[str], create: Callable[[str], object]) -> tuple[dict[str, float], float, float]:
    """Create every object at once from 8 clients: (when each create returned, the start, seconds taken).

    A create has returned once the webhook has answered, so the job is held from that instant."""
    from concurrent.futures import ThreadPoolExecutor

    created: dict[str, float] = {}

    def one(name: str) -> None:
        create(name)
        created[name] = time.monotonic()

    t0 = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, names))
    return created, t0, time.monotonic() - t0


def wait_all(changed: threading.Condition, seen: Sized, total: int, timeout: float, label: str) -> bool:
    """Wait (notified through `changed`) until `seen` holds `total` entries; say how far it got every 10 s."""
    deadline = time.monotonic() + timeout
    last_report = time.monotonic()
    with changed:
        while len(seen) < total:
            left = deadline - time.monotonic()
            if left <= 0:
                print(f"bench: gave up waiting: {len(seen)} of {total} jobs {label}", flush=True)
                return False
            changed.wait(min(left, 1.0))
            if time.monotonic() - last_report > 10:
                print(f"bench: {len(seen)} of {total} jobs {label}", flush=True)
                last_report = time.monotonic()
    return True


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _mem_total_mb() -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    return 0


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             check=False, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def _uncommitted() -> list[str]:
    """Tracked files that differ from HEAD: what ran is HEAD plus these."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                             capture_output=True, text=True, check=False, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line[3:] for line in out.stdout.splitlines() if line.strip()]


def machine_info() -> dict[str, Any]:
    return {
        "hostname": platform.node(),
        "cpu_model": _cpu_model(),
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "memory_mb": _mem_total_mb(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "git_commit": _git_commit(),
        "uncommitted_changes": _uncommitted(),
        "loadavg_at_start": loadavg(),
    }


def write_report(name: str, report: dict[str, Any], targets: Sequence[Target], started: float) -> Path:
    """Add the verdicts and the end-of-run machine state, then write build/bench/<name>.json.

    `started` is the time.monotonic() at which the benchmark began."""
    report["targets"] = [t.to_json() for t in targets]
    report["all_targets_met"] = all(t.met for t in targets)
    report["machine"]["loadavg_at_end"] = loadavg()
    report["elapsed_s"] = round(time.monotonic() - started, 1)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / f"{name}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=2, default=str) + "\n")
    tmp.replace(path)
    return path


def report_footer(report: dict[str, Any], path: Path) -> str:
    """Where and under what load the figures were taken, and where the JSON went."""
    m = report["machine"]
    dirty = f" + uncommitted {', '.join(m['uncommitted_changes'])}" if m["uncommitted_changes"] else ""
    return (f"\nload average at start {m['loadavg_at_start']}, at end {m['loadavg_at_end']}; "
            f"code: git {m['git_commit']}{dirty}\nreport: {path}")


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


# --- process accounting --------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def process_tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(_children(p))
    return out


def cpu_seconds(pids: Sequence[int]) -> float:
    """user + system CPU time of these processes (live ones only)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / _TICK


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def status_kb(pid: int, key: str) -> int:
    """A `kB` field of /proc/<pid>/status (VmHWM, VmRSS); 0 when the process is gone."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def tree_rss_mb(pid: int) -> float:
    """Resident memory of a process and its children (a gunicorn master and its workers), in MB."""
    return sum(status_kb(p, "VmRSS") for p in process_tree(pid)) / 1024


def tree_hwm_mb(pid: int) -> float:
    """Sum of the peak RSS (VmHWM) of a process and its children, in MB. A page two processes share
    (a gunicorn master's imports its forked workers still use) counts once per process here."""
    return sum(status_kb(p, "VmHWM") for p in process_tree(pid)) / 1024


def pss_kb(pid: int) -> int:
    """Proportional set size (/proc/<pid>/smaps_rollup): a page shared by k processes counts 1/k in each,
    so the PSS of a process tree counts every page once, as the memory cgroup of its container does."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    return 0


def tree_pss_mb(pid: int) -> float:
    return sum(pss_kb(p) for p in process_tree(pid)) / 1024


class PeakSampler:
    """Samples the PSS and RSS of named process trees every `interval` seconds on a thread; keeps each
    one's peak (the kernel keeps a peak RSS per process, VmHWM, but no peak PSS)."""

    def __init__(self, pids: dict[str, int], interval: float = 1.0) -> None:
        self.pids = dict(pids)
        self.interval = interval
        self.peak_pss_mb: dict[str, float] = dict.fromkeys(pids, 0.0)
        self.peak_rss_mb: dict[str, float] = dict.fromkeys(pids, 0.0)
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peak-sampler", daemon=True)

    def _sample(self) -> None:
        for name, pid in self.pids.items():
            self.peak_pss_mb[name] = max(self.peak_pss_mb[name], tree_pss_mb(pid))
            self.peak_rss_mb[name] = max(self.peak_rss_mb[name], tree_rss_mb(pid))
        self.samples += 1

    def _run(self) -> None:
        self._sample()
        while not self._stop.wait(self.interval):
            self._sample()

    def start(self) -> PeakSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._sample()


# A busy neighbour: one process per core that never sleeps, at the same priority as everything else, as
# another tenant's workload on a shared node (production nodes are not idle).
HOG_CODE = "while True:\n    pass\n"


class CpuHog:
    """`cores` processes spinning on the CPU while it is entered; `cpu_cores` says how much they got."""

    def __init__(self, cores: int) -> None:
        self.cores = cores
        self.procs: list[subprocess.Popen[bytes]] = []
        self.cpu_cores = 0.0
        self._started = 0.0

    def __enter__(self) -> CpuHog:
        self.procs = [subprocess.Popen([sys.executable, "-c", HOG_CODE]) for _ in range(self.cores)]
        self._started = time.monotonic()
        time.sleep(0.5)  # spinning before anything is measured
        return self

    def __exit__(self, *exc: object) -> None:
        elapsed = time.monotonic() - self._started
        self.cpu_cores = cpu_seconds([p.pid for p in self.procs]) / max(elapsed, 1e-9)
        for p in self.procs:
            p.kill()
            p.wait()


# --- the control plane -------------------------------------------------------------------------

def _raise_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def bundle() -> Any:
    """The control-plane binaries, as the tests get them; `make bench` builds them first (cluster-bins)."""
    from raygate.devenv.build import ensure_bundle

    return ensure_bundle(log=False)


@contextlib.contextmanager
def control_plane(kuberay: bool = False, gang: bool = False, audit: bool = False,
                  profiling: bool = False) -> Iterator[Any]:
    """A fresh etcd + kube-apiserver + kube-controller-manager in a temporary directory; every
    process it (and whatever ran on it: webhook, reconciler) started is stopped on the way out.
    `gang`: with Kubernetes' gang scheduling on. `audit`: the API server logs every write
    (ControlPlane.audit_log), to count writes by writer. `profiling`: the API server serves CPU profiles."""
    from raygate.devenv.controlplane import ControlPlane

    previous = signal.signal(signal.SIGTERM, _raise_on_sigterm)
    workdir = Path(tempfile.mkdtemp(prefix="raygate-bench-"))
    cp = ControlPlane(workdir, bundle())
    try:
        t0 = time.monotonic()
        cp.up(kuberay=kuberay, log=False, gang=gang, audit=audit, profiling=profiling)
        print(f"bench: control plane up in {time.monotonic() - t0:.1f}s ({workdir})", flush=True)
        yield cp
    finally:
        # A second SIGTERM (a supervisor that signals the process and then its group, an impatient user) must not
        # cut the teardown short and leave the API server running.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            cp.down(log=False)
        finally:
            signal.signal(signal.SIGTERM, previous)
        keep = os.environ.get("RAYGATE_BENCH_KEEP")
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"bench: kept {workdir} (RAYGATE_BENCH_KEEP)")


def add_static_gpu_nodes(cp: Any, kube: Any, group: str, count: int, gpus: int, timeout: float) -> None:
    """`count` KWOK GPU nodes of `gpus` GPUs each, named and labelled `group` (no autoscaler manages them), once
    every one is Ready."""
    from raygate.core.api import NODES
    from raygate.devenv.capacity import node

    for i in range(count):
        cp.kubectl("apply", "-f", "-", input_text=json.dumps(node(f"{group}-{i}", group, 16, 128, gpus=gpus)))

    def ready() -> int:
        return sum(1 for n in kube.list(NODES)["items"] if n["metadata"]["name"].startswith(f"{group}-") and any(
            c["type"] == "Ready" and c["status"] == "True" for c in (n.get("status") or {}).get("conditions") or []))

    until(lambda: ready() == count, timeout, f"the {count} {group} GPU nodes Ready", 0.5)


def start_raygate(cp: Any, config: Mapping[str, Any] | str | None, namespaces: Sequence[str], *,
                  workers: int | None = None, threads: int | None = None, reconciler: Sequence[str] = (),
                  source: Path | None = None, one_process: bool = False) -> Any:
    """raygate's webhook (`workers` x `threads`, as shipped unless given) and reconciler (with the arguments
    `reconciler`) on the control plane `cp`, with `config` as raygate-config (a mapping or its YAML; None: no
    ConfigMap, so raygate's defaults), and `namespaces` created and opted in. Returns the webhook
    (raygate_local.LocalWebhook). `source`: another checkout's raygate (benchmarks/baseline.py), not this one.
    `one_process`: both in one process (`raygate serve`, named raygate-webhook; `workers` is then 1)."""
    import yaml

    from raygate.core import keys
    from raygate.devenv.raygate_local import ensure_system_namespace, start_reconciler, start_webhook
    from raygate.webhook.cli import THREADS, WORKERS

    ensure_system_namespace(cp)
    if config is not None:
        text = config if isinstance(config, str) else yaml.safe_dump(dict(config))
        cp.kubectl("create", "configmap", keys.CONFIGMAP_NAME, "-n", keys.SYSTEM_NAMESPACE,
                   f"--from-literal={keys.CONFIGMAP_KEY}={text}")
    hook = start_webhook(cp, workers=workers or WORKERS, threads=threads or THREADS, source=source,
                         reconciler=list(reconciler) if one_process else None)
    if not one_process:
        start_reconciler(cp, *reconciler, source=source)
    for ns in namespaces:
        cp.kubectl("create", "namespace", ns)
        cp.kubectl("label", "namespace", ns, f"{keys.OPT_IN_LABEL}={keys.OPT_IN_VALUE}")
    return hook


# --- waiting on a Ray cluster -----------------------------------------------------------------------------------


def until(check: Callable[..., object], timeout: float, what: str, interval: float = 0.05) -> float:
    """Poll `check` until it is true; return the moment it was (monotonic), or raise BenchError naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return time.monotonic()
        time.sleep(interval)
    raise BenchError(f"timed out after {timeout:.0f}s waiting for {what}")


def gpu_workers(kube: Any, cluster: str, namespace: str, group: str = "gpu") -> list[dict[str, Any]]:
    """The pods of one worker group of a RayCluster (KubeRay's labels)."""
    from raygate.core import keys
    from raygate.core.api import PODS

    return [p for p in kube.list(PODS, namespace, labelSelector=f"{keys.RAY_CLUSTER_LABEL}={cluster}")["items"]
            if (p["metadata"].get("labels") or {}).get(keys.RAY_GROUP_LABEL) == group]


def bound_workers(kube: Any, cluster: str, namespace: str) -> int:
    return sum(bool(p["spec"].get("nodeName")) for p in gpu_workers(kube, cluster, namespace))


def request_provisioned(kube: Any, cluster: str, namespace: str) -> bool:
    """Whether the ProvisioningRequest raygate recorded on a held RayCluster is Provisioned."""
    from raygate.core import keys
    from raygate.core.api import RAYCLUSTERS, provisioning_requests
    from raygate.core.conditions import conditions
    from raygate.kube.client import ApiError

    obj = kube.get(RAYCLUSTERS, cluster, namespace)
    request = (obj["metadata"].get("annotations") or {}).get(keys.REQUEST_ANNOTATION)
    if not request:
        return False
    try:
        found = conditions(kube.get(provisioning_requests("v1"), request, namespace))
    except ApiError as err:
        if err.not_found:  # deleted between the two reads (a retry): not Provisioned
            return False
        raise
    return "Provisioned" in found and found["Provisioned"].true


@dataclass
class RequestOwners:
    """Which RayJob a ProvisioningRequest books: raygate's requests are owned by the job itself, Kueue's by the
    job's Workload, whose own owner is the job. A request seen before its Workload waits here (with whatever the
    caller keeps about it) until the Workload is seen. Not locked: callers hold their own lock."""

    names: set[str]
    job_of_workload: dict[str, str] = field(default_factory=dict)
    early: dict[str, list[tuple[Any, float]]] = field(default_factory=dict)  # workload -> requests seen first

    def workload(self, obj: dict[str, Any]) -> list[tuple[str, Any, float]]:
        """Record a Workload; return (job, request, seen) for each of its requests seen before it."""
        job = self._job(obj)
        if job is None:
            return []
        name = str(obj["metadata"].get("name"))
        self.job_of_workload[name] = job
        return [(job, request, seen) for request, seen in self.early.pop(name, [])]

    def request(self, obj: dict[str, Any], keep: Any, seen: float) -> str | None:
        """The job a request books, or None (not one of ours, or its Workload not seen yet: `keep` waits)."""
        job = self._job(obj)
        if job is not None:
            return job
        for ref in obj["metadata"].get("ownerReferences") or []:
            if ref.get("kind") == "Workload":
                workload = str(ref.get("name"))
                if workload in self.job_of_workload:
                    return self.job_of_workload[workload]
                self.early.setdefault(workload, []).append((keep, seen))
        return None

    def _job(self, obj: dict[str, Any]) -> str | None:
        from raygate.core import keys

        return next((str(ref["name"]) for ref in obj["metadata"].get("ownerReferences") or []
                     if ref.get("kind") == keys.RAYJOB_KIND and ref.get("name") in self.names), None)


def wait_admitting(kube: Any, namespace: str, obj: Mapping[str, Any], timeout: float = 60.0) -> float:
    """Until the API server gets an answer from raygate's webhook for a create in `namespace`: a server-side dry
    run (it calls every admission webhook and stores nothing), repeated while the API server reports that it failed
    calling a webhook, so that a burst starts against a webhook the API server reaches. (A burst's creates once
    failed on the 5 s the API server gives a webhook, the webhook's log empty: not a cold start, as first
    thought, but connections kept idle after their TLS handshake holding every thread; webhook/worker.py.)
    Returns the seconds it took, which the benchmark prints."""
    from raygate.core.api import RAYJOBS
    from raygate.kube.client import ApiError

    t0 = time.monotonic()
    while True:
        try:
            kube.request("POST", RAYJOBS.path(namespace), body=dict(obj), query={"dryRun": "All"})
            return time.monotonic() - t0
        except ApiError as err:
            if err.status != 500 or "failed calling webhook" not in err.message or time.monotonic() - t0 > timeout:
                raise
            time.sleep(0.5)
