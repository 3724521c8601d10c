"""`make bench` keeps printing what the project claims: the benchmarks run end to end, small.

The burst, the side-by-side with Kueue, the end-to-end comparison on the real autoscaler, the scarce-capacity
comparison, the preemption benchmark and the pod gate's (one gang round a side) run as `make bench` runs them
(`python -m benchmarks.run`, their own fresh control planes), with a handful of jobs; the soak for 2 minutes
instead of 30. Nothing here judges a figure: speed and memory live in `make bench`. What is asserted is what a
reader of its output relies on: every job was admitted, the tables are printed, and the JSON holds the figures they
show; and for the soak, the invariants it checks (they are correctness, not figures) all hold.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_bench(out: Path, *args: str) -> tuple[str, dict[str, Any]]:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.run", *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "RAYGATE_BENCH_OUT": str(out)}, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / f"{args[0]}.json").read_text())
    return proc.stdout, report


def test_the_burst_prints_its_figures_and_where_a_jobs_time_went(tmp_path: Path) -> None:
    out, report = run_bench(tmp_path, "reconciler", "--jobs", "20", "--status-writers", "2")
    flow = report["flow"]
    assert flow["check"]["admitted"] == 20 and flow["check"]["unsuspended"] == 20, flow["check"]
    assert flow["check"]["jobs_with_more_than_one_request"] == 0
    # The queue's world: after the burst only the front asks, and while jobs are admitted one request is out at a time.
    assert flow["requests_out_at_phase_boundary"] == 1 and flow["most_requests_out_at_once"] == 1, flow
    # The admission itself still takes at most 6 writes; the queue's own (a "waiting in queue" reason, a FrontOfQueue
    # Event, a request withdrawn while the burst arrives) come on top, and the total is what kube-apiserver counted.
    # A patch the API server refused (its precondition no longer held: the benchmark's status writers race the
    # reconciler) is decided again and made once more; that redo is a write of the admission too.
    redone = report["writes_by_what"]["refused"] / 20
    assert report["admission_writes_per_admitted_job"] <= 6 + redone, report["writes_by_what"]
    assert report["writes_by_what"]["total"] == report["writes_per_admitted_job"] * 20
    for title in ("Reconciler: 20 RayJobs", "What the API server takes here",
                  "Where a job's time went inside the reconciler", "The API server's wall: 2 writers"):
        assert title in out, f"{title!r} not printed"
    # The reconciler's own histograms were read: each admission was a job handed to a worker and a PATCH.
    inside = flow["inside_reconciler"]["phase2"]
    assert inside["queue_wait_seconds"]["count"] >= 20
    assert inside["api_request_seconds PATCH"]["count"] >= 20
    assert flow["model"]["writers"] == 2 and flow["model"]["delay_s"] > 0


def test_the_side_by_side_with_kueue_prints_both_columns_and_what_differs(tmp_path: Path) -> None:
    out, report = run_bench(tmp_path, "peer", "--peer-jobs", "6", "--peer-sides", "raygate,kueue")
    runs = report["runs"]
    assert sorted((r["side"], r["rate"] or 0.0) for r in runs) == sorted(  # all at once is rate None
        (side, rate) for side in ("raygate", "kueue") for rate in report["pacings"].values())
    assert all(r["all_unsuspended"] and r["admitted"] == 6 for r in runs), [(r["side"], r["admitted"]) for r in runs]
    # raygate's admission still takes 6 writes a job (one more in a run, of 6 jobs, on a loaded machine: a patch made
    # on a view KubeRay had just changed, made again); its queue's own come on top, still fewer than Kueue's.
    assert report["median"]["raygate"]["admission_writes_per_job"] <= 6 + 1 / 6, [r["writes_by_what"] for r in runs]
    assert report["median"]["raygate"]["writes_per_job"] < report["median"]["kueue"]["writes_per_job"]
    assert report["median"]["kueue"]["writes_per_job"] > 0
    for title in ("raygate and Kueue v", "x raygate", "How each side ran", "Differences and why",
                  "client QPS", "everything installed: peak PSS"):
        assert title in out, f"{title!r} not printed"
    assert (tmp_path / "peer-cdf.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.integration
@pytest.mark.kuberay
@pytest.mark.timeout(960)  # run_bench gives up after 900 s
def test_a_short_soak_with_kills_ends_with_every_invariant_holding(tmp_path: Path) -> None:
    from benchmarks.soak_bench import VIOLATIONS, WATCHED

    out, report = run_bench(tmp_path, "soak", "--soak-minutes", "2")
    soak = report["soak"]
    final = soak["final"]
    assert soak["settled"], f"not quiet after {soak['settle_seconds']}s"
    assert final["violations"] == dict.fromkeys(VIOLATIONS, 0), final["examples"]
    assert soak["allowed_that_must_be_refused"] == 0, [t for t in soak["traffic"] if t["result"] == "allowed"]
    fuzz = soak["fuzz"]["counts"]
    assert fuzz["sent"] > 0
    for bad in ("http 5xx", "decisions with code 500", "malformed answers", "patches that fail to apply"):
        assert fuzz.get(bad, 0) == 0, (bad, soak["fuzz"]["examples"])
    # It did what it says: objects made and refused, processes killed, and every object made accounted for.
    assert soak["objects_created"] > 0 and sum(soak["kills"].values()) >= 1, (soak["objects_created"], soak["kills"])
    assert any(t["action"].startswith("invalid: ") and t["result"] == "refused by raygate" for t in soak["traffic"])
    counts = final["counts"]
    accounted = sum(counts.get(k, 0) for k in ("Admitted", "Failed, with a reason", "being deleted",
                                               "held, waiting for capacity the node group cannot give",
                                               "held, waiting in its queue behind another job",
                                               "gone (deleted by the soak)", "gone (not deleted by the soak)"))
    assert accounted >= soak["objects_created"], counts
    assert all(soak["rss"][name]["samples"] > 0 for name in WATCHED), soak["rss"]
    for title in ("Soak: 2 min of traffic", "Kills (SIGKILL, then restarted)",
                  "Fuzzed AdmissionReviews sent to the webhook", "At the end (settled in", "RSS (process tree"):
        assert title in out, f"{title!r} not printed"
    for what in VIOLATIONS:
        assert any(line.startswith(f"VIOLATION: {what}") and line.split()[-1] == "0" for line in out.splitlines()), what


@pytest.mark.integration
@pytest.mark.kuberay
@pytest.mark.kueue
@pytest.mark.timeout(960)  # run_bench gives up after 900 s
def test_the_e2e_comparison_runs_every_job_on_both_sides_and_draws_its_pictures(tmp_path: Path) -> None:
    from benchmarks.e2e_bench import MILESTONES, SUMMARY_ROWS

    # Not the earlier raygate `make bench` also runs (raygate@<ref>): a third stack; tests/unit/test_e2e_baseline.py
    # covers its export and registration.
    out, report = run_bench(tmp_path, "e2e", "--e2e-jobs", "2", "--e2e-rounds", "1", "--e2e-sides",
                            "raygate,raygate-serve,kueue")
    runs = report["runs"]
    assert sorted(r["side"] for r in runs) == ["kueue", "raygate", "raygate-serve"]
    for r in runs:
        # Every job reached Running, through every milestone, on capacity the real autoscaler added.
        assert r["all_running"] and r["running"] == 2, (r["side"], r["running"])
        for job, marks in r["marks"].items():
            assert [m for m in MILESTONES if m not in marks] == [], (r["side"], job, marks)
        assert r["gpu_nodes_added"] >= r["gpu_nodes_needed"] == 2
        assert r["writes"]["by_writer"].get("cluster-autoscaler", 0) > 0, r["writes"]["by_writer"]
        assert r["autoscaler"]["loops"] > 0
    # Both columns filled: every row of the table has a figure for each side.
    for side in ("raygate 2", "raygate-serve 2", "kueue 2"):
        empty = [row for row in SUMMARY_ROWS if report["median"][side][row] != report["median"][side][row]]  # NaN
        assert empty == [], (side, empty)
    # raygate serve is one process tree (the reconciler inside the webhook's), measured as raygate's footprint.
    serve = next(r for r in runs if r["side"] == "raygate-serve")
    assert list(serve["peak_pss_mb"]) == ["raygate-webhook"] and serve["peak_pss_mb"]["raygate-webhook"] > 0
    for side in ("raygate", "raygate, one process"):
        assert f"{side} / Kueue: peak PSS MB, the side's processes (2 jobs)" in out
    assert report["median"]["raygate 2"]["API writes per job, the side's own"] > 0
    assert report["median"]["kueue 2"]["API writes per job, the side's own"] > 0
    for title in ("GPU RayJobs from create to every Ray pod Running", "raygate, 2 jobs", "Kueue, 2 jobs",
                  "Where the time goes", "Differences and why", "Kueue has no such gate"):
        assert title in out, f"{title!r} not printed"
    for name in ("e2e-cdf-2.png", "e2e-timeline-2.png"):
        picture = tmp_path / name
        assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{name} is not a PNG"
        assert str(picture) in report["pictures"]


@pytest.mark.integration
@pytest.mark.kuberay
@pytest.mark.kueue
@pytest.mark.timeout(960)  # run_bench gives up after 900 s
def test_the_scarce_capacity_comparison_runs_every_job_in_turn_on_both_sides(tmp_path: Path) -> None:
    out, report = run_bench(tmp_path, "scarce", "--scarce-jobs", "4", "--scarce-hold", "2,3")
    runs = report["runs"]
    assert sorted(r["side"] for r in runs) == ["kueue", "raygate"]
    for r in runs:
        # Every job ran, one node each on a group of 2, and was deleted after its hold; none Failed.
        assert not r["timed_out"] and r["failed"] == {}, (r["side"], r["failed"])
        assert sorted(r["order"]) == ["q01", "q02", "q03", "q04"] and r["never_ran"] == [], (r["side"], r["order"])
        assert all("deleted" in m for m in r["marks"].values()), r["marks"]
        assert r["gpu_nodes_added"] >= 1 and max(_nodes_at_once(r["gpu_nodes"])) <= 2, r["gpu_nodes"]
        # The figures agree with the order: pairs out of order counted from it, waits from the marks.
        rank = {job: i for i, job in enumerate(r["order"])}
        names = sorted(rank)
        assert r["pairs"] == 6 and r["pairs_out_of_order"] == sum(
            1 for i, a in enumerate(names) for b in names[i + 1:] if rank[b] < rank[a])
        assert sorted(r["waits_s"]) == names and all(w > 0 for w in r["waits_s"].values())
        assert 0 < r["gpu_node_seconds_used"] <= r["gpu_node_seconds_available"] + 0.5
        assert r["gpu_node_seconds_available"] <= r["gpu_node_seconds_at_group_max"] + 0.5
        assert r["makespan_s"] == pytest.approx(max(m["running"] for m in r["marks"].values()), abs=0.01)
    kueue = next(r for r in runs if r["side"] == "kueue")
    cq = next(o for o in kueue["settings"]["queue_objects"] if o["kind"] == "ClusterQueue")
    assert cq["spec"]["queueingStrategy"] == "StrictFIFO"
    for title in ("Scarce capacity: 4 one-node GPU RayJobs", "pairs out of order", "GPU node-s used by running jobs",
                  "The order jobs started running", "Each job: its wait", "Jobs that ended Failed",
                  "queueingStrategy StrictFIFO", "Differences and why"):
        assert title in out, f"{title!r} not printed"


def _nodes_at_once(nodes: dict[str, dict[str, float]]) -> list[int]:
    """How many GPU nodes existed after each node event."""
    events = sorted([(n["added"], 1) for n in nodes.values()] + [(n["deleted"], -1) for n in nodes.values()
                                                                  if "deleted" in n])
    counts, now = [0], 0
    for _, step in events:
        now += step
        counts.append(now)
    return counts


@pytest.mark.integration
@pytest.mark.kuberay
@pytest.mark.timeout(960)  # run_bench gives up after 900 s
def test_the_preemption_benchmark_preempts_in_one_queue_and_waits_in_the_other(tmp_path: Path) -> None:
    out, report = run_bench(tmp_path, "preempt", "--preempt-rounds", "1", "--preempt-low-seconds", "10",
                            "--timeout", "240")
    (r,) = report["runs"]
    preempt, never = r["preempt"], r["never"]
    assert preempt["gave_up"] is None and never["gave_up"] is None, (preempt, never)
    # LowerPriority: the low job was suspended for the high one, said so in an Event, and ran again after it.
    assert preempt["high_ran"] and preempt["low_preempted_event"] and preempt["low_ran_again"], preempt
    assert "bench-preempt/high" in preempt["preempted_message"]
    # Never: the low job ran on until the benchmark deleted it; only then did the high one run.
    assert never["low_ran_until_deleted"] and not never["low_preempted_event"], never
    assert never["high_ran"] and never["low_deleted_to_high_running_s"] > 0, never
    assert report["all_targets_met"], report["targets"]
    for title in ("Preemption: a high-priority RayJob", "high create -> every high pod Running",
                  "low's Events say Preempted", "round 1", "Targets"):
        assert title in out, f"{title!r} not printed"


@pytest.mark.integration
@pytest.mark.kuberay
@pytest.mark.timeout(960)  # run_bench gives up after 900 s
def test_the_pod_gate_benchmark_prints_each_side_and_what_the_api_server_timed(tmp_path: Path) -> None:
    from benchmarks.podgate_bench import GANG, GANG_SIDES, ONE_BY_ONE_PODS

    out, report = run_bench(tmp_path, "podgate", "--podgate-rounds", "1", "--warmup", "0.5", "--duration", "1",
                            "--apiserver-profile")
    cap = report["capacity"]
    for side in GANG_SIDES:  # every gang bound whole on each side
        assert len(cap[f"gang-{side}"]["rounds_s"]) == 1, cap[f"gang-{side}"]
    (creates,) = report["creates_by_round"]
    assert all(creates[f"{side}_s"] > 0 for side in GANG_SIDES), creates
    # Each side's pods went through its own webhook, and only through it: what the API server timed says so. Born
    # gated from their admitted RayCluster's templates, raygate's workers are gated without any call to its webhook
    # (the head pod, which asks no GPU, is the one it answers).
    gangs = {side: cap[f"gang-{side}"]["apiserver_by_round"][0]["admission"] for side in GANG_SIDES}
    assert gangs["gated"].get("webhook mutate.raygate.io admit CREATE", {}).get("calls", 0) <= 1, gangs["gated"]
    assert gangs["noop"]["webhook noop.bench.raygate.io admit CREATE"]["calls"] >= GANG, gangs["noop"]
    assert not any(k.startswith("webhook mutate") for k in gangs["noop"]), gangs["noop"]
    assert not any(k.startswith("webhook") for k in gangs["ungated"]), gangs["ungated"]
    # What the gate adds to the API server's writes: one patch per worker, raygate's, to lift its gate.
    assert gangs["gated"]["pod writes PATCH (the pod)"]["calls"] >= GANG, gangs["gated"]
    assert gangs["ungated"].get("pod writes PATCH (the pod)", {}).get("calls", 0) < GANG, gangs["ungated"]
    # The reconciler's own count of what a round cost it: those patches, in fewer reconciles than workers, their
    # pod events batched (four per worker: created, released, bound, running; unbatched, the cluster was
    # reconciled about 50 times a round).
    work = cap["gang-gated"]["apiserver_by_round"][0]["reconciler"]
    assert work.get("API requests PATCH", 0) >= GANG, work
    assert 0 < work["reconciles"] < GANG, work
    # The API server's CPU profile of each round, read by Go's pprof: where its CPU went, its updates among it.
    for side in GANG_SIDES:
        profile = cap[f"gang-{side}"]["apiserver_profile_s"]
        assert 0 < profile["every update (storage GuaranteedUpdate)"] < profile["all samples"], profile
    one_by_one = cap["one_by_one_creates"]
    assert one_by_one["webhook"]["webhook mutate.raygate.io admit CREATE"]["calls"] == ONE_BY_ONE_PODS
    assert one_by_one["noop"]["webhook noop.bench.raygate.io admit CREATE"]["calls"] == ONE_BY_ONE_PODS
    for side in ("policy", "none"):  # KubeRay's pods, gated by the policy: no webhook call either
        assert not any(k.startswith("webhook") for k in one_by_one[side]), one_by_one[side]
    assert {r["concurrency"] for r in report["pod_webhook"]} == {1, 8}
    assert {r["hog_cores"] for r in report["pod_webhook"]} == {0, 1}
    for title in ("The pod webhook (a GPU worker pod, gated)", "a no-op webhook in Go", "the pod gate",
                  "KubeRay's 32 worker creates (first -> last created), each round", "noop / neither",
                  "What the API server timed during a round", "CPU seconds each process used during a round",
                  "raygate's reconciler during a round", "Writes to pods during a round",
                  "kube-apiserver's CPU by what it did",
                  "GPU pods created one by one", "Targets"):
        assert title in out, f"{title!r} not printed"


def test_a_benchmark_signalled_twice_still_stops_its_whole_control_plane() -> None:
    proc = subprocess.run([sys.executable, "-m", "tests.apps.bench_interrupted"], cwd=REPO, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert proc.returncode != 0 and "KeyboardInterrupt: signal 15" in proc.stderr, proc.stderr[-3000:]
    workdir = proc.stdout.split("workdir ", 1)[1].split()[0]
    left = subprocess.run(["pgrep", "-f", workdir], capture_output=True, text=True).stdout.split()
    for pid in left:  # the assertion below says so; nothing is left running for the next test
        subprocess.run(["kill", "-9", pid], check=False)
    assert left == [], f"still running from {workdir}: {left}"
