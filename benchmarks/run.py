"""`python -m benchmarks.run [NAME|all]` (`make bench` runs all: webhook, webhook-peer, reconciler, peer,
memory, startup, capacity, e2e, scarce, preempt, volcano, podgate, native, fuzz, soak).

Each benchmark prints tables and writes build/bench/<name>.json with the figures, the targets,
whether each was met, and the machine it ran on. The exit code is 0 when the benchmark ran, even if
a target was missed (the table says MISSED); nonzero only when the benchmark itself broke.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from raygate.webhook.cli import THREADS as WEBHOOK_THREADS
from raygate.webhook.cli import WORKERS as WEBHOOK_WORKERS

# The raygate the e2e benchmark compares today's with: main before the queue (issues 30 and 31).
BASELINE_REF = "1e155ff"


def _settings(text: str) -> list[tuple[int, int]]:
    try:
        out = []
        for item in text.split(","):
            w, t = item.lower().split("x")
            out.append((int(w), int(t)))
        return out
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WORKERSxTHREADS[,...], e.g. 2x8,1x8: {text!r}") from None


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers: {text!r}") from None


def _floats2(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN,MAX seconds, e.g. 10,15: {text!r}") from None
    if not 0 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"expected 0 <= MIN <= MAX: {text!r}")
    return lo, hi


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0])
    p.add_argument("which", nargs="?", default="all",
                   choices=["webhook", "webhook-peer", "reconciler", "peer", "memory", "startup", "capacity", "e2e",
                            "scarce", "preempt", "volcano", "podgate", "native", "fuzz", "soak", "all"])
    w = p.add_argument_group("webhook")
    w.add_argument("--iterations", type=int, default=20000, help="pure-decision iterations per case")
    w.add_argument("--settings", type=_settings, default=None,
                   help="gunicorn WORKERSxTHREADS to try, the first judged against the targets "
                        f"(default: {WEBHOOK_WORKERS}x{WEBHOOK_THREADS},1x4,2x2,2x4; raygate webhook ships with "
                        f"{WEBHOOK_WORKERS}x{WEBHOOK_THREADS})")
    w.add_argument("--concurrency", type=_ints, default=None, help="client connections (default: 1,8,32)")
    w.add_argument("--duration", type=float, default=6.0, help="measured seconds per concurrency level")
    w.add_argument("--warmup", type=float, default=1.5, help="unmeasured seconds before each level")
    w.add_argument("--open-rate", type=float, default=1000.0,
                   help="also offer this many reviews/s over 8 connections (open loop); 0 skips it")
    w.add_argument("--client-processes", type=int, default=2, help="load-generator processes (concurrency > 1)")
    r = p.add_argument_group("reconciler")
    r.add_argument("--jobs", type=int, default=1000, help="RayJobs created at once")
    r.add_argument("--reconciler-workers", type=int, default=None,
                   help="pass --workers N to `raygate reconciler` (default: its own default)")
    r.add_argument("--status-writers", type=int, default=8,
                   help="threads setting Provisioned on each request as a watch shows it, each as fast as the API "
                        "server answers (default %(default)s; the queue keeps few requests out at once; "
                        "cluster-autoscaler's own client sends at most 5 writes/s)")
    r.add_argument("--profile", action="store_true",
                   help="sample the reconciler with py-spy and print where its CPU went")
    r.add_argument("--timeout", type=float, default=600.0, help="give up on a phase after this many seconds")
    pe = p.add_argument_group("peer (raygate and Kueue side by side)")
    pe.add_argument("--peer-jobs", type=int, default=200, help="GPU RayJobs per run (default %(default)s)")
    pe.add_argument("--peer-rounds", type=int, default=1,
                    help="interleaved rounds; each runs every side at every pacing on a fresh control plane")
    pe.add_argument("--peer-sides", type=lambda t: t.split(","), default=["raygate", "kueue", "kueue-helm"],
                    help="comma-separated sides (default raygate,kueue,kueue-helm)")
    m = p.add_argument_group("memory")
    m.add_argument("--held-jobs", type=int, default=10_000, help="RayJobs held at once (default %(default)s)")
    f = p.add_argument_group("fuzz")
    f.add_argument("--fuzz-reviews", type=int, default=100_000, help="damaged reviews to send")
    f.add_argument("--seed", type=int, default=1, help="seed of the damage (the same seed sends the same reviews)")
    c = p.add_argument_group("capacity")
    c.add_argument("--capacity-jobs", type=_ints, default=[20, 100],
                   help="GPU RayJobs created at once on real capacity, one fresh cluster per figure (default 20,100)")
    e = p.add_argument_group("e2e (raygate and Kueue on the same real stack)")
    e.add_argument("--e2e-jobs", type=_ints, default=[20, 100],
                   help="GPU RayJobs created at once per run, one fresh stack per side and count (default 20,100)")
    e.add_argument("--e2e-rounds", type=int, default=2, help="rounds, the sides taking turns (default %(default)s)")
    e.add_argument("--e2e-sides", type=lambda t: t.split(","),
                   default=["raygate", "raygate-serve", f"raygate@{BASELINE_REF}", "kueue"],
                   help="comma-separated sides: raygate, raygate-serve (raygate in one process, `raygate serve`), "
                        "kueue, and raygate@<git ref> for raygate as of that ref (exported once into raygate's cache), "
                        f"compared with today's (default raygate,raygate-serve,raygate@{BASELINE_REF},kueue; "
                        f"{BASELINE_REF}: main before the queue)")
    e.add_argument("--e2e-provisioned-timeout", type=float, default=None,
                   help="raygate's provisionedTimeoutSeconds on the raygate side (default: raygate's default)")
    sc = p.add_argument_group("scarce (issue 30: one-node jobs in order on a node group of max 2, raygate and Kueue)")
    sc.add_argument("--scarce-jobs", type=int, default=20, help="one-node GPU RayJobs, created in order (default "
                    "%(default)s)")
    sc.add_argument("--scarce-nodes-max", type=int, default=2, help="the GPU node group's max (default %(default)s)")
    sc.add_argument("--scarce-interval", type=float, default=2.0,
                    help="seconds between two creates (default %(default)s; Kueue orders by creationTimestamp, "
                         "which has whole seconds: keep it >= 1)")
    sc.add_argument("--scarce-hold", type=_floats2, default=(10.0, 15.0),
                    help="MIN,MAX seconds a job runs before it is deleted, drawn per job from --scarce-seed (default "
                         "10,15)")
    sc.add_argument("--scarce-seed", type=int, default=1, help="seed of the hold times (the same on both sides)")
    sc.add_argument("--scarce-rounds", type=int, default=1, help="rounds, the sides taking turns (default %(default)s)")
    sc.add_argument("--scarce-sides", type=lambda t: t.split(","), default=["raygate", "kueue"],
                    help="comma-separated sides (default raygate,kueue)")
    sc.add_argument("--scarce-raygate-config", metavar="FILE", default=None,
                    help="raygate-config of the raygate side (default: the e2e benchmark's: provisioning mode, "
                         "best-effort-atomic); the jobs run in namespace bench-scarce")
    sc.add_argument("--scarce-timeout", type=float, default=1800.0,
                    help="give up on a side after this many seconds (default %(default)s)")
    pr = p.add_argument_group("preempt (issue 31: a high-priority RayJob for the only GPU node, held by a low one)")
    pr.add_argument("--preempt-rounds", type=int, default=3,
                    help="rounds, each the LowerPriority arm and the Never arm on one stack (default %(default)s)")
    pr.add_argument("--preempt-low-seconds", type=float, default=60.0,
                    help="the Never arm: the low job is deleted this many seconds after the high one is created "
                         "(default %(default)s)")
    v = p.add_argument_group("volcano")
    v.add_argument("--volcano-clusters", type=_ints, default=[20],
                   help="RayClusters created at once in volcano mode, one fresh cluster per figure (default 20)")
    pg = p.add_argument_group("podgate")
    pg.add_argument("--hog-cores", type=int, default=1,
                    help="also serve the pod webhook beside a CPU hog of this many cores (processes that spin at "
                         "normal priority, a busy neighbour); 0: idle only (default %(default)s)")
    pg.add_argument("--podgate-rounds", type=int, default=5,
                    help="gang rounds, each a gang with the gate, one through the no-op webhook and one through "
                         "neither (default %(default)s)")
    pg.add_argument("--pod-batch-seconds", type=float, default=None,
                    help="the reconciler's --pod-batch-seconds (default: the reconciler's own)")
    pg.add_argument("--pod-batch-max-seconds", type=float, default=None,
                    help="the reconciler's --pod-batch-max-seconds (default: the reconciler's own)")
    pg.add_argument("--podgate-threads", type=int, default=WEBHOOK_THREADS,
                    help="threads of the webhook's worker serving the pod reviews (default: as shipped, "
                         "%(default)s)")
    pg.add_argument("--podgate-one-process", action="store_true",
                    help="run raygate on real capacity as `raygate serve`, its reconciler in the webhook's process "
                         "(default: two processes)")
    pg.add_argument("--apiserver-profile", action="store_true",
                    help="serve kube-apiserver's CPU profiles and print where its CPU went in each side's gang rounds "
                         "(needs Go's pprof: `go tool pprof`)")
    so = p.add_argument_group("soak")
    so.add_argument("--soak-minutes", type=float, default=30.0,
                    help="minutes of mixed traffic, fuzzed reviews and kills before the invariants are checked "
                         "(default %(default)s)")
    so.add_argument("--soak-seed", type=int, default=1, help="seed of the traffic, the fuzz and the kills")
    s = p.add_argument_group("startup")
    s.add_argument("--startup-runs", type=int, default=3, help="warm `raygate dev up --kuberay` runs")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from benchmarks import (
        capacity_bench,
        e2e_bench,
        fuzz,
        memory_bench,
        native_bench,
        peer_bench,
        podgate_bench,
        preempt_bench,
        reconciler_bench,
        scarce_bench,
        soak_bench,
        startup_bench,
        volcano_bench,
        webhook_bench,
    )

    benches: dict[str, Callable[[Any], int]] = {
        "webhook": webhook_bench.main, "webhook-peer": webhook_bench.peer_main, "reconciler": reconciler_bench.main,
        "peer": peer_bench.main, "memory": memory_bench.main, "startup": startup_bench.main,
        "capacity": capacity_bench.main, "e2e": e2e_bench.main,
        "scarce": scarce_bench.main, "preempt": preempt_bench.main, "volcano": volcano_bench.main,
        "podgate": podgate_bench.main, "native": native_bench.main,
        "fuzz": fuzz.main, "soak": soak_bench.main,
    }
    names = list(benches) if args.which == "all" else [args.which]
    failed = []
    for name in names:
        try:
            if benches[name](args) != 0:
                failed.append(name)
        except KeyboardInterrupt:
            print(f"bench: {name} interrupted", file=sys.stderr)
            return 130
        except Exception:
            traceback.print_exc()
            print(f"bench: the {name} benchmark broke (see above); no figures for it", file=sys.stderr)
            failed.append(name)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
