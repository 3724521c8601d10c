"""Fuzz the served webhook: damaged AdmissionReviews over keep-alive TLS, and what came back.

`raygate webhook` runs as it ships (gunicorn, its default workers x threads, TLS) on a local control plane.
Client processes send realistic RayJob and RayCluster reviews damaged at random (wrong types at any
path, fields removed, huge numbers and quantities, deep nesting, broken or cut JSON, bytes that are
not UTF-8, bogus operations, kinds and uids), each on its own keep-alive connection, and check every
answer: a 200 must be a well-formed AdmissionReview that echoes the uid, a patch must apply to the
object it was computed for, and no decision may be an internal error (code 500). Meanwhile one
connection sends a 50 MB body (refused unread with 413) and another 5.5 MB reviews, just under the limit, and
the workers' peak RSS is read from /proc at the end, against the Deployment's memory limit.

Everything is seeded: the same --seed sends the same reviews.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import multiprocessing
import random
import socket
import ssl
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonpatch
import orjson
import yaml

from benchmarks import common
from benchmarks.common import BenchError, Target
from benchmarks.samples import admission_review, rayjob
from benchmarks.webhook_bench import NAMESPACE, _Conn, _wait_all_workers_ready, http_request
from raygate.core import keys
from raygate.webhook.cli import THREADS, WORKERS

BIG_BODY_MB = 50
DEPLOYMENT = Path(__file__).resolve().parents[1] / "config" / "base" / "webhook-deployment.yaml"
JSON = dict[str, Any]


# --- what is sent -------------------------------------------------------------------------------

def _bases() -> list[JSON]:
    """Realistic reviews to damage: RayJob and RayCluster creates, and an update of a held job."""
    job = admission_review(rayjob(namespace=NAMESPACE))
    cluster = copy.deepcopy(job)
    obj = cluster["request"]["object"]
    obj["kind"] = keys.RAYCLUSTER_KIND
    obj["spec"] = obj["spec"]["rayClusterSpec"]
    cluster["request"]["kind"]["kind"] = keys.RAYCLUSTER_KIND
    update = copy.deepcopy(job)
    held = copy.deepcopy(update["request"]["object"])
    held["spec"]["suspend"] = True
    held["metadata"].setdefault("labels", {})[keys.STATE_LABEL] = "Provisioning"
    held["metadata"].setdefault("annotations", {})[keys.MODE_ANNOTATION] = "provisioning"
    grown = copy.deepcopy(held)
    grown["spec"]["suspend"] = False
    update["request"].update({"operation": "UPDATE", "object": grown, "oldObject": held})
    return [job, cluster, update]


def _deep(depth: int, leaf: Any = 1) -> Any:
    out = leaf
    for i in range(depth):
        out = [out] if i % 2 else {"x": out}
    return out


def _junk(rng: random.Random) -> Any:
    return rng.choice([
        None, True, False, 0, -1, 2**62, -(2**62), 1.5e308, 0.1, "", "x" * rng.randint(1, 5000), "1e+99999999999",
        "-4", "9" * 200, "1.5Gi", "\u0000\ud7ff\U0001f600", [], {}, [None, "a", 3], {"nested": {"deeper": [{}]}},
        _deep(rng.randint(10, 200)), {"nvidia.com/gpu": "1e+99999999999"}, {"limits": "lots"},
    ])


def _paths(node: Any, prefix: tuple[Any, ...] = (), out: list[tuple[Any, ...]] | None = None) -> list[tuple[Any, ...]]:
    out = [] if out is None else out
    if isinstance(node, dict):
        for k, v in node.items():
            out.append((*prefix, k))
            _paths(v, (*prefix, k), out)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.append((*prefix, i))
            _paths(v, (*prefix, i), out)
    return out


def _parent(doc: Any, path: tuple[Any, ...]) -> Any:
    for part in path[:-1]:
        doc = doc[part]
    return doc


def damage(rng: random.Random, bases: list[JSON], uid: str) -> tuple[bytes, JSON | None]:
    """One damaged review body, and the review as sent when it is JSON (None when the bytes are broken)."""
    review = copy.deepcopy(rng.choice(bases))
    review["request"]["uid"] = uid
    roll = rng.random()
    if roll < 0.08:  # bytes that are not a review at all
        body = orjson.dumps(review)
        return rng.choice([
            body[: rng.randint(0, len(body) - 1)],
            body.replace(b'"', b"'", rng.randint(1, 5)),
            body[:100] + b"\xff\xfe\x80" + body[100:],
            b"[" * 3000 + b"]" * 3000,
            b"",
            b"null",
            b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}',
        ]), None
    request = review["request"]
    if roll < 0.25:  # the envelope
        field = rng.choice(["operation", "kind", "uid", "object", "oldObject", "namespace", "userInfo", "dryRun"])
        if field == "kind":
            request["kind"] = rng.choice([{"kind": "Pod"}, {"kind": _junk(rng)}, _junk(rng), {}])
        elif field == "operation":
            request["operation"] = rng.choice(["CREATE", "UPDATE", "DELETE", "CONNECT", "", "create", _junk(rng)])
        else:
            request[field] = _junk(rng)
    else:  # somewhere inside the object(s)
        for _ in range(rng.randint(1, 4)):
            paths = _paths(request.get("object"), ("object",)) + _paths(request.get("oldObject"), ("oldObject",))
            if not paths:
                break
            path = rng.choice(paths)
            parent = _parent(request, path)
            if rng.random() < 0.3 and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = _junk(rng)
    try:
        body = orjson.dumps(review)
    except (TypeError, orjson.JSONEncodeError):  # deeper than orjson writes: the standard library does
        import json

        body = json.dumps(review).encode()
    sent = review if isinstance(review.get("request"), dict) else None
    return body, sent


# --- one client connection -------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    port: int
    ca_file: str
    seed: int
    count: int


def _check(status: int, data: bytes, sent: JSON | None, tally: Counter[str], examples: list[str]) -> None:
    tally[f"http {status}"] += 1
    if status >= 500:
        tally["http 5xx"] += 1
        examples.append(f"HTTP {status}: {data[:200]!r}")
        return
    if status != 200:
        return
    try:
        answer = orjson.loads(data)
        response = answer["response"]
        ok = answer.get("kind") == "AdmissionReview" and isinstance(response.get("allowed"), bool)
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        ok, response = False, {}
    request = (sent or {}).get("request") or {}
    if ok and response.get("uid") != request.get("uid"):
        ok = False
    if not ok:
        tally["malformed answers"] += 1
        examples.append(f"malformed: {data[:200]!r}")
        return
    tally["allowed" if response["allowed"] else "denied"] += 1
    if (response.get("status") or {}).get("code") == 500:
        tally["decisions with code 500"] += 1
        examples.append(f"code 500: {str(response.get('status'))[:300]}")
    patch = response.get("patch")
    if patch:
        tally["patches"] += 1
        try:
            jsonpatch.apply_patch(request.get("object"), orjson.loads(base64.b64decode(patch)))
        except Exception as err:
            tally["patches that fail to apply"] += 1
            examples.append(f"patch does not apply ({type(err).__name__}: {err})"[:300])


def _client(plan: Plan, results: Any) -> None:
    rng = random.Random(plan.seed)
    bases = _bases()
    tally: Counter[str] = Counter()
    examples: list[str] = []
    conn: _Conn | None = None
    for i in range(plan.count):
        body, sent = damage(rng, bases, f"fuzz-{plan.seed}-{i}")
        path = rng.choice(["/mutate", "/validate"])
        request = http_request(body, plan.port).replace(b"POST /mutate", b"POST " + path.encode(), 1)
        for attempt in range(2):
            try:
                conn = conn or _Conn(plan.port, plan.ca_file)
                status, data = conn.post(request)
                break
            except (OSError, BenchError) as err:  # the server closed the connection: count it, reconnect
                tally["connections closed by the server"] += 1
                if conn:
                    conn.close()
                conn = None
                if attempt:
                    examples.append(f"no answer: {err}")
                    status, data = 0, b""
        tally["sent"] += 1
        _check(status, data, sent, tally, examples)
    if conn:
        conn.close()
    results.put((dict(tally), examples[:20]))


def _client_process(plans: list[Plan], results: Any) -> None:
    threads = [threading.Thread(target=_client, args=(p, results)) for p in plans]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# --- large bodies -----------------------------------------------------------------------------------

def _big_body_status(port: int, ca_file: str, size: int) -> tuple[int, float]:
    """Send `size` bytes of body with its Content-Length; the answer's status and how long it took."""
    ctx = ssl.create_default_context(cafile=ca_file)
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
        sock.sendall(b"POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % size)
        chunk = b"x" * (1024 * 1024)
        sent = 0
        with contextlib.suppress(OSError):  # the server may answer and close before all of it is sent
            while sent < size:
                sock.sendall(chunk[: size - sent])
                sent += len(chunk)
        head = b""
        with contextlib.suppress(OSError):
            while b"\r\n" not in head:
                data = sock.recv(4096)
                if not data:
                    break
                head += data
    status = int(head[9:12]) if head[:5] == b"HTTP/" else 0
    return status, time.monotonic() - t0


def _large_review(target_bytes: int) -> bytes:
    """A valid review just under `target_bytes`: many worker groups."""
    review = admission_review(rayjob(namespace=NAMESPACE))
    groups = review["request"]["object"]["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    template = groups[0]
    one = len(orjson.dumps(template))
    for i in range(max(target_bytes // one - 1, 1)):
        g = copy.deepcopy(template)
        g["groupName"] = f"g{i}"
        groups.append(g)
    return orjson.dumps(review)


def _stress_large(port: int, ca_file: str, out: dict[str, Any], stop: threading.Event) -> None:
    status, seconds = _big_body_status(port, ca_file, BIG_BODY_MB * 1024 * 1024)
    out["50MB body"] = {"status": status, "seconds": round(seconds, 2)}
    body = _large_review(5 * 1024 * 1024 + 512 * 1024)  # just under the 6 MiB limit
    statuses: Counter[str] = Counter()
    while not stop.is_set():  # under the limit: parsed, one at a time per worker
        conn = _Conn(port, ca_file)
        try:
            status, _ = conn.post(http_request(body, port))
            statuses[f"http {status}"] += 1
        finally:
            conn.close()
    out["5.5MB reviews"] = {"bytes": len(body), **statuses}


# --- the run ------------------------------------------------------------------------------------------

def _memory_limit_mb() -> float:
    """The webhook container's memory limit in config/base, in MB."""
    from raygate.core import quantity

    for doc in yaml.safe_load_all(DEPLOYMENT.read_text()):
        for c in (((doc or {}).get("spec") or {}).get("template") or {}).get("spec", {}).get("containers", []):
            if c.get("name") == "webhook":
                return float(quantity.parse(c["resources"]["limits"]["memory"])) / 1e6
    raise BenchError(f"no webhook container with a memory limit in {DEPLOYMENT}")


def run_fuzz(total: int, seed: int, processes: int, threads: int) -> dict[str, Any]:
    from raygate.devenv import raygate_local

    per_client = -(-total // (processes * threads))
    with common.control_plane() as cp:
        cp.kubectl("create", "namespace", NAMESPACE)
        cp.kubectl("label", "namespace", NAMESPACE, f"{keys.OPT_IN_LABEL}={keys.OPT_IN_VALUE}")
        name = "raygate-webhook-fuzz"
        hook = raygate_local.start_webhook(cp, workers=WORKERS, threads=THREADS, register=False, name=name)
        _wait_all_workers_ready(hook, 2)
        state = cp.load_state()
        if state is None:
            raise BenchError("the control plane lost its state file")
        master = state.pids[name]
        workers_before = sorted(common.process_tree(master)[1:])
        port = int(hook.url.rsplit(":", 1)[1])
        ctx = multiprocessing.get_context("spawn")
        results = ctx.Queue()
        plans = [[Plan(port, str(hook.ca_file), seed * 1000 + p * threads + t, per_client) for t in range(threads)]
                 for p in range(processes)]
        large: dict[str, Any] = {}
        stop = threading.Event()
        stresser = threading.Thread(target=_stress_large, args=(port, str(hook.ca_file), large, stop))
        t0 = time.monotonic()
        procs = [ctx.Process(target=_client_process, args=(p, results)) for p in plans]
        for p in procs:
            p.start()
        stresser.start()
        tally: Counter[str] = Counter()
        examples: list[str] = []
        for _ in range(processes * threads):
            counts, ex = results.get(timeout=1800)
            tally.update(counts)
            examples += ex
        elapsed = time.monotonic() - t0
        stop.set()
        stresser.join(120)
        for p in procs:
            p.join(30)
        workers_after = sorted(common.process_tree(master)[1:])
        peak_kb = {pid: common.status_kb(pid, "VmHWM") for pid in workers_after}
        master_kb = common.status_kb(master, "VmHWM")
        cp.stop_process(name)
    return {
        "sent": tally["sent"], "seconds": round(elapsed, 1), "reviews_per_s": round(tally["sent"] / elapsed, 1),
        "counts": dict(sorted(tally.items())), "examples": examples[:40], "large_bodies": large,
        # gunicorn replaces a worker that died (or timed out) with a new process: a new pid.
        "worker_restarts": len(set(workers_after) - set(workers_before)),
        "workers_before": workers_before, "workers_after": workers_after,
        "peak_rss_mb_per_worker": {str(pid): round(kb / 1024, 1) for pid, kb in peak_kb.items()},
        "peak_rss_mb_master": round(master_kb / 1024, 1),
        "seed": seed, "processes": processes, "threads": threads,
    }


def main(args: Any) -> int:
    t0 = time.monotonic()
    report: dict[str, Any] = {"benchmark": "fuzz", "started": common.now_iso(), "machine": common.machine_info()}
    print(f"bench: fuzz: {args.fuzz_reviews:,} damaged reviews, seed {args.seed}; load average "
          f"{report['machine']['loadavg_at_start']}", flush=True)
    result = run_fuzz(args.fuzz_reviews, args.seed, args.client_processes, 4)
    report["fuzz"] = result
    counts = result["counts"]
    limit = _memory_limit_mb()
    peak = max(result["peak_rss_mb_per_worker"].values(), default=float("nan"))
    big = result["large_bodies"].get("50MB body", {})
    targets = [
        Target("damaged reviews sent", result["sent"], ">=", args.fuzz_reviews, ""),
        Target("decisions answered with code 500", counts.get("decisions with code 500", 0), "<=", 0, ""),
        Target("HTTP 5xx answers", counts.get("http 5xx", 0), "<=", 0, ""),
        Target("malformed answers", counts.get("malformed answers", 0), "<=", 0, ""),
        Target("patches that fail to apply", counts.get("patches that fail to apply", 0), "<=", 0, ""),
        Target("worker restarts", result["worker_restarts"], "<=", 0, ""),
        Target(f"{BIG_BODY_MB} MB body answered 413", 1 if big.get("status") == 413 else 0, ">=", 1, ""),
        Target("peak RSS of a worker (Deployment limit)", peak, "<=", limit, "MB"),
        Target("peak RSS of master + workers together", result["peak_rss_mb_master"] + sum(
            result["peak_rss_mb_per_worker"].values()), "<=", limit, "MB"),
    ]
    path = common.write_report("fuzz", report, targets, t0)
    print()
    print(common.table(["answer", "count"], [[k, f"{v:,}"] for k, v in counts.items()],
                       f"Fuzz: {result['sent']:,} damaged reviews in {result['seconds']}s "
                       f"({result['reviews_per_s']:,.0f}/s, {args.client_processes}x4 keep-alive TLS connections)"))
    print()
    print(common.table(["worker pid", "peak RSS MB"], [[p, v] for p, v in result["peak_rss_mb_per_worker"].items()],
                       "Webhook workers (VmHWM)"))
    print(f"large bodies: {result['large_bodies']}")
    for line in result["examples"][:10]:
        print(f"  example: {line}")
    print()
    print(common.targets_table(targets))
    print(common.report_footer(report, path))
    return 0
