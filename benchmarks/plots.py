"""Pictures of the comparisons, as PNGs beside the JSON (matplotlib, from the `bench` extra).

Small on purpose (about 800 pixels wide, few colours): docs/ keeps the latest committed ones.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

COLOURS = {"raygate": "#1f77b4", "kueue": "#d62728", "kueue-helm": "#ff7f0e"}
TITLES = {"raygate": "raygate", "kueue": "Kueue", "kueue-helm": "Kueue (Helm chart)"}
BASELINE_COLOURS = ("#9467bd", "#8c564b", "#17becf")  # raygate@<ref> sides, in the order they come


def _sides(runs: Sequence[dict[str, Any]]) -> list[str]:
    """The sides that ran, known ones first in COLOURS' order, then raygate@<ref> ones as they came."""
    seen = list(dict.fromkeys(r["side"] for r in runs))
    return [s for s in COLOURS if s in seen] + [s for s in seen if s not in COLOURS]


def _colours(sides: Sequence[str]) -> dict[str, str]:
    others = itertools.cycle(BASELINE_COLOURS)
    return {s: COLOURS.get(s) or next(others) for s in sides}
DPI = 80


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _log_x(ax: Any) -> None:
    """A log x axis labelled at powers of ten only (minor labels collide on a narrow panel)."""
    from matplotlib.ticker import NullFormatter

    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())


def _cdf(ax: Any, values: Sequence[float], label: str, colour: str) -> None:
    xs = sorted(values)
    if not xs:
        return
    ys = [(i + 1) / len(xs) for i in range(len(xs))]
    ax.step(xs, ys, where="post", label=f"{label} (n={len(xs)})", color=colour)


def _deltas(marks: dict[str, dict[str, float]], a: str, b: str) -> list[float]:
    return [m[b] - m[a] for m in marks.values() if a in m and b in m]


def e2e(runs: Sequence[dict[str, Any]], out: Path) -> list[Path]:
    """Per job count: the CDFs of both sides (every job of every round); for the largest count, the timeline
    of the last round of each side."""
    if not runs:
        return []
    plt = _pyplot()
    out.mkdir(parents=True, exist_ok=True)
    written = []
    panels = (("create -> request exists", "created", "request", 1.0, "s"),
              ("Provisioned -> unsuspended", "provisioned", "unsuspended", 1000.0, "ms"),
              ("create -> every Ray pod Running", "created", "running", 1.0, "s"))
    sides = _sides(runs)
    colours = _colours(sides)
    for n in sorted({r["jobs"] for r in runs}):
        fig, axes = plt.subplots(1, len(panels), figsize=(10, 3.2), dpi=DPI)
        for ax, (title, a, b, scale, unit) in zip(axes, panels, strict=True):
            for side in sides:
                values = [v * scale for r in runs if r["side"] == side and r["jobs"] == n
                          for v in _deltas(r["marks"], a, b)]
                _cdf(ax, values, TITLES.get(side, side), colours[side])
            ax.set_title(title, fontsize=10)
            ax.set_xlabel(unit + (", log scale" if unit == "ms" else ""))
            if unit == "ms":  # tens of milliseconds against a tail of seconds
                _log_x(ax)
            ax.set_ylim(0, 1.02)
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("fraction of jobs")
        axes[0].legend(fontsize=8, loc="lower right")
        rounds = len({r["round"] for r in runs if r["jobs"] == n})
        fig.suptitle(f"{n} GPU RayJobs per run, {rounds} round{'s' if rounds != 1 else ''}: per job", fontsize=10)
        fig.tight_layout()
        path = out / f"e2e-cdf-{n}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    n = max(r["jobs"] for r in runs)
    last = {side: max((r for r in runs if r["side"] == side and r["jobs"] == n), key=lambda r: r["round"])
            for side in sides}
    if last:
        written.append(_timeline(plt, last, colours, n, out / f"e2e-timeline-{n}.png"))
    return written


def _timeline(plt: Any, runs: dict[str, dict[str, Any]], colours: dict[str, str], n: int, path: Path) -> Path:
    """Per job a bar: held (create -> Provisioned), provisioned (-> every pod Running), running; and the GPU
    nodes the autoscaler added, over time."""
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 2.6 * len(runs)), dpi=DPI, sharex=True, squeeze=False)
    end = max(max((v for m in r["marks"].values() for v in m.values()), default=0.0) for r in runs.values())
    end = end * 1.03 + 1
    for ax, (side, r) in zip(axes[:, 0], runs.items(), strict=True):
        jobs = sorted(r["marks"].values(), key=lambda m: (m.get("provisioned", end), m.get("created", 0.0)))
        for y, m in enumerate(jobs):
            created, prov, running = m.get("created", 0.0), m.get("provisioned"), m.get("running")
            ax.hlines(y, created, prov if prov is not None else end, color="#bbbbbb", linewidth=2)
            if prov is not None:
                ax.hlines(y, prov, running if running is not None else end, color="#ff9f1c", linewidth=2)
            if running is not None:
                ax.hlines(y, running, end, color="#2ca02c", linewidth=2)
        ax.set_ylabel("job")
        ax.set_ylim(-1, len(jobs))
        ax.set_title(f"{TITLES.get(side, side)}: held (grey), Provisioned until every pod Running (orange), Running "
                     "(green)", fontsize=9)
        nodes = sorted(v["added"] for v in r["gpu_nodes"].values() if "added" in v)
        twin = ax.twinx()
        twin.step([0.0, *nodes, end], [0, *range(1, len(nodes) + 1), len(nodes)], where="post",
                  color=colours[side], linewidth=1.2)
        twin.set_ylabel("GPU nodes", color=colours[side])
        twin.set_ylim(0, max(len(nodes), 1) * 1.05)
        ax.grid(alpha=0.3, axis="x")
    axes[-1, 0].set_xlabel("seconds since the first create")
    fig.suptitle(f"{n} GPU RayJobs created at once: each job, and the GPU nodes added", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def peer(runs: Sequence[dict[str, Any]], out: Path) -> list[Path]:
    """The side-by-side with the benchmark playing the autoscaler: per side, the CDFs of create -> request
    exists and of Provisioned -> unsuspended at each pacing (every job of every round)."""
    if not runs:
        return []
    plt = _pyplot()
    out.mkdir(parents=True, exist_ok=True)
    sides = [s for s in COLOURS if any(r["side"] == s for r in runs)]
    panels = [("create -> request exists (raygate: its turn in)", "create_to_request_s", None, 1.0, "s"),
              ("Provisioned -> unsuspended, 5/s", "provisioned_to_unsuspended_s", 5.0, 1000.0, "ms"),
              ("Provisioned -> unsuspended, all at once", "provisioned_to_unsuspended_s", 0.0, 1000.0, "ms")]
    fig, axes = plt.subplots(1, len(panels), figsize=(10, 3.2), dpi=DPI)
    for ax, (title, key, rate, scale, unit) in zip(axes, panels, strict=True):
        for side in sides:
            values = [v * scale for r in runs if r["side"] == side and (rate is None or (r["rate"] or 0.0) == rate)
                      for v in (r.get("per_job") or {}).get(key, [])]
            _cdf(ax, values, TITLES[side], COLOURS[side])
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(f"{unit}, log scale")
        _log_x(ax)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of jobs")
    axes[0].legend(fontsize=8, loc="lower right")
    jobs = max(r["jobs"] for r in runs)
    fig.suptitle(f"{jobs} GPU RayJobs per run, the benchmark playing the autoscaler: per job", fontsize=10)
    fig.tight_layout()
    path = out / "peer-cdf.png"
    fig.savefig(path)
    plt.close(fig)
    return [path]
