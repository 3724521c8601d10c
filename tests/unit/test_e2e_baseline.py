"""The e2e benchmark against an earlier raygate: sides spelled raygate@<git ref>, the tree of that ref exported once
and reused, its own webhook registration, and today's raygate against it per job count."""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import pytest

from benchmarks import baseline
from benchmarks.common import REPO, BenchError
from benchmarks.e2e_bench import SIDES, baseline_comparison, baseline_table, footprint_targets, title
from raygate.devenv.raygate_local import process_env, reconciler_rbac, registration


def test_a_side_at_a_ref_is_a_version_of_its_base_side() -> None:
    assert baseline.split_side("raygate@1e155ff") == ("raygate", "1e155ff")
    assert baseline.split_side("kueue") == ("kueue", None)
    assert baseline.base_side("raygate@main~3") == "raygate" and title("raygate@1e155ff") == "raygate@1e155ff"
    assert title("kueue") == "Kueue"


def test_sides_keep_the_known_order_each_ref_after_its_side() -> None:
    assert baseline.check_sides(["kueue", "raygate@b", "raygate", "raygate@a", "raygate"], SIDES) == [
        "raygate", "raygate@b", "raygate@a", "kueue"]


def test_raygate_serve_runs_and_counts_as_raygate_after_it() -> None:
    assert baseline.base_side("raygate-serve") == "raygate" and title("raygate-serve") == "raygate, one process"
    assert baseline.check_sides(["kueue", "raygate-serve", "raygate@a", "raygate"], SIDES) == [
        "raygate", "raygate-serve", "raygate@a", "kueue"]


def test_each_raygate_side_is_held_to_0_8_of_kueues_pss_per_job_count() -> None:
    pss = "peak PSS MB, the side's processes"
    agg = {"raygate 20": {pss: 93.0}, "raygate-serve 20": {pss: 70.0}, "kueue 20": {pss: 100.0},
           "raygate-serve 100": {pss: 90.0}}  # no Kueue at 100: nothing to hold it to
    targets = footprint_targets(agg, [20, 100], ["raygate", "raygate-serve", "kueue"])
    assert [(t.name, round(t.value, 2), t.met) for t in targets] == [
        (f"raygate / Kueue: {pss} (20 jobs)", 0.93, False),
        (f"raygate, one process / Kueue: {pss} (20 jobs)", 0.7, True)]


@pytest.mark.parametrize("side", ["volcano", "kueue@v0.19.2", "raygate@", "raygate-serve@a"])
def test_an_unknown_side_or_a_ref_of_another_side_is_refused(side: str) -> None:
    with pytest.raises(BenchError, match="unknown side"):
        baseline.check_sides([side], SIDES)


def row(p50: float, p99: float) -> dict[str, float]:
    return {"create -> every Ray pod Running p50": p50, "create -> every Ray pod Running p99": p99}


def test_todays_raygate_is_compared_with_each_earlier_one_per_job_count() -> None:
    agg = {"raygate 20": row(10.0, 20.0), "raygate@old 20": row(8.0, 20.0), "kueue 20": row(1.0, 1.0),
           "raygate 100": row(60.0, 120.0), "raygate@old 100": row(math.nan, 0.0)}
    out = baseline_comparison(agg, [20, 100], ["raygate", "raygate@old", "kueue"])
    assert [(r["jobs"], r["measure"].split()[-1], r["ratio"]) for r in out[:2]] == [(20, "p50", 1.25), (20, "p99", 1.0)]
    assert all(r["baseline"] == "raygate@old" for r in out)  # never Kueue
    assert math.isnan(out[2]["ratio"]) and math.isnan(out[3]["ratio"])  # no figure then: no ratio
    text = baseline_table(out)
    assert "1.250" in text and "n/a" in text and "within 5%" in text


def test_without_a_baseline_side_there_is_nothing_to_compare() -> None:
    assert baseline_comparison({"raygate 20": row(1.0, 2.0)}, [20], ["raygate", "kueue"]) == []


def test_a_ref_that_names_no_commit_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(BenchError, match="names no commit"):
        baseline.checkout("no-such-ref-anywhere", cache=tmp_path)


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="needs a git checkout")
def test_a_ref_is_exported_once_and_runs_with_its_own_registration_and_rbac(tmp_path: Path) -> None:
    tree = baseline.checkout("HEAD", cache=tmp_path)
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert tree == tmp_path / f"baseline-{sha}" and (tree / "raygate" / "webhook").is_symlink()
    (tree / "marker").write_text("kept")
    assert baseline.checkout("HEAD", cache=tmp_path) == tree and (tree / "marker").exists()  # reused, not redone
    assert [p.name for p in tmp_path.iterdir()] == [tree.name]  # nothing half-made left beside it
    assert process_env(tree)["PYTHONPATH"].split(":")[0] == str(tree)
    assert reconciler_rbac(tree)[0] == tree / "config" / "base" / "rbac-reconciler.yaml"
    # Read in a process that imports the exported tree: the same objects as this tree's (HEAD).
    assert registration("https://127.0.0.1:1", b"ca", "Ignore", tree) == registration("https://127.0.0.1:1", b"ca",
                                                                                         "Ignore")
