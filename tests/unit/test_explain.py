"""`raygate explain`: the webhook's decision offline, through the real CLI entry point."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml
from builders import RayCluster, RayJob

from raygate.cli import main
from raygate.core import keys
from raygate.core.policy import KUBERAY_OPERATOR_USER


def anchor_job() -> RayJob:
    """DESIGN.md's KubeRay anchor as an HTTPMode RayJob (no submitter pod)."""
    return (RayJob("train", "team").submission_mode("HTTPMode").head(requests={"cpu": "256m", "memory": "256Mi"})
            .worker("gpu", replicas=2, min_replicas=1, max_replicas=4,
                    requests={"cpu": "256m", "memory": "256Mi"}, limits={"nvidia.com/gpu": "1"}))


def write(tmp_path: Path, obj: Any, name: str = "obj.yaml") -> str:
    path = tmp_path / name
    path.write_text(obj if isinstance(obj, str) else yaml.safe_dump(obj))
    return str(path)


def explain_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = main(["explain", *args, "-o", "json"])
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # exactly one JSON object, on one line
    return code, json.loads(out)


def fails(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["explain", *args]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err  # one clear line
    return lines[0]


def test_json_shows_verdict_patch_and_gang(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    obj = anchor_job().obj()
    code, result = explain_json(capsys, "-f", write(tmp_path, obj))
    assert code == 0
    assert set(result) == {"allowed", "message", "patch", "gang", "groups", "queue"}
    assert result["groups"] is None  # provisioning mode: no group object
    assert result["queue"] == {"name": "default", "strategy": "BestEffortFIFO", "priorityClassName": None}
    assert (result["allowed"], result["message"]) == (True, None)
    patched = jsonpatch.apply_patch(obj, result["patch"])
    assert patched["spec"]["suspend"] is True
    assert patched["metadata"]["labels"][keys.STATE_LABEL] == "Pending"
    assert result["gang"] == {
        "minMember": 3,
        "minResources": {"cpu": "768m", "memory": "768Mi", "nvidia.com/gpu": "2"},
        "podSets": [
            {"name": "headgroup", "count": 1, "resources": {"cpu": "256m", "memory": "256Mi"}},
            {"name": "gpu", "count": 2, "resources": {"cpu": "256m", "memory": "256Mi", "nvidia.com/gpu": "1"}},
        ],
    }


def test_mode_volcano_adds_the_pod_group(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    obj = anchor_job().obj()
    code, result = explain_json(capsys, "-f", write(tmp_path, obj), "--mode", "volcano")
    patched = jsonpatch.apply_patch(obj, result["patch"])
    assert code == 0
    assert json.loads(patched["metadata"]["annotations"][keys.POD_GROUP_ANNOTATION])["minMember"] == 3
    assert patched["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["schedulerName"] == "volcano"


def test_mode_kueue_with_config_labels_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    obj = anchor_job().obj()
    cfg = write(tmp_path, "defaults:\n  queueName: team-lq\n", "config.yaml")
    code, result = explain_json(capsys, "-f", write(tmp_path, obj), "--mode", "kueue", "--config", cfg)
    patched = jsonpatch.apply_patch(obj, result["patch"])
    assert code == 0
    assert patched["metadata"]["labels"] == {keys.KUEUE_QUEUE_LABEL: "team-lq"}
    assert "suspend" not in patched["spec"]


def test_config_may_be_the_configmap_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": keys.CONFIGMAP_NAME},
          "data": {keys.CONFIGMAP_KEY: "namespaces:\n  team:\n    mode: kueue\n    queueName: cm-lq\n"}}
    _, result = explain_json(capsys, "-f", write(tmp_path, anchor_job().obj()), "--config", write(tmp_path, cm, "c"))
    assert {"op": "add", "path": "/metadata/labels", "value": {keys.KUEUE_QUEUE_LABEL: "cm-lq"}} in result["patch"]


def test_namespace_flag_picks_the_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write(tmp_path, "namespaces:\n  other:\n    maxGang: {nvidia.com/gpu: '1'}\n", "config.yaml")
    job = write(tmp_path, anchor_job().obj())
    assert explain_json(capsys, "-f", job, "--config", cfg)[1]["allowed"] is True
    refused = explain_json(capsys, "-f", job, "--config", cfg, "-n", "other")[1]
    assert refused["allowed"] is False and "namespace other allows at most 1" in refused["message"]


def test_refused_manifest_exits_2_with_the_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, result = explain_json(capsys, "-f", write(tmp_path, anchor_job().shutdown_after_finish(False).obj()))
    assert code == 2
    assert result["allowed"] is False and result["patch"] == []
    assert "Add `shutdownAfterJobFinishes: true` to spec" in result["message"]
    assert result["gang"]["minMember"] == 3  # still shown: it helps to see what was asked for


def test_fixed_field_is_reported_as_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write(tmp_path, "defaults:\n  fixShutdownAfterJobFinishes: true\n", "config.yaml")
    obj = anchor_job().shutdown_after_finish(False).obj()
    code, result = explain_json(capsys, "-f", write(tmp_path, obj), "--config", cfg)
    assert code == 0 and "shutdownAfterJobFinishes=true" in result["message"]
    assert jsonpatch.apply_patch(obj, result["patch"])["spec"]["shutdownAfterJobFinishes"] is True


def test_kuberays_cluster_of_a_rayjob_is_left_alone_but_for_its_parents_record(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    child = RayCluster("rc", "team").owned_by_rayjob().label(keys.STATE_LABEL, "Admitted").obj()
    code, result = explain_json(capsys, "-f", write(tmp_path, child), "--as", KUBERAY_OPERATOR_USER)
    assert code == 0
    assert (result["allowed"], result["gang"]) == (True, None)
    assert [op["path"] for op in result["patch"]] == ["/metadata/annotations"]  # only the record of whose it is
    assert list(result["patch"][0]["value"]) == [keys.PARENT_ANNOTATION]
    assert "belongs to a RayJob" in result["message"]


def test_a_claimed_rayjob_parent_is_held_when_a_user_creates_it(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    child = RayCluster("rc", "team").owned_by_rayjob().label(keys.STATE_LABEL, "Admitted").obj()
    code, result = explain_json(capsys, "-f", write(tmp_path, child))
    assert code == 0 and {"op": "add", "path": "/spec/suspend", "value": True} in result["patch"]


def test_autoscaling_shows_booked_pods_beside_volcanos_min_member(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    obj = (RayCluster("rc", "team").autoscaling()
           .worker("gpu", replicas=3, min_replicas=1, max_replicas=6, limits={"nvidia.com/gpu": "1"}).obj())
    assert main(["explain", "-f", write(tmp_path, obj)]) == 0
    out = capsys.readouterr().out
    assert "MIN MEMBER" in out and "MAX" in out
    row = next(line.split() for line in out.splitlines() if line.strip().startswith("gpu "))
    assert row[1] == "3" and row[-2:] == ["1", "6"]


def test_kube_system_is_left_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, result = explain_json(capsys, "-f", write(tmp_path, RayJob("j", "kube-system").obj()))
    assert (result["patch"], result["gang"]) == ([], None) and "never acts" in result["message"]


def test_human_output_shows_verdict_patch_and_gang_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = (RayJob("train", "team").head(requests={"cpu": "1", "memory": "2Gi"})
           .worker("gpu", replicas=2, requests={"cpu": "2", "memory": "8Gi"}, limits={"nvidia.com/gpu": "1"}))
    assert main(["explain", "-f", write(tmp_path, job.obj())]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "RayJob team/train in provisioning mode"
    assert out[1].startswith("verdict: admitted")
    assert "  add    /spec/suspend true" in out
    assert "gang: minMember 3" in out
    rows = {line.split()[0]: line.split(None, 2) for line in out if line.startswith("  ") and "  " in line[2:]}
    assert rows["headgroup"][1] == "1"
    assert rows["gpu"][1] == "2" and "cpu=4, memory=16Gi, nvidia.com/gpu=2" in rows["gpu"][2]
    assert rows["submittergroup"][1] == "1*"
    assert "cpu=5500m, memory=18632Mi, nvidia.com/gpu=2" in rows["gang"][2]


def test_human_output_for_a_refusal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "-f", write(tmp_path, anchor_job().shutdown_after_finish(False).obj())]) == 2
    out = capsys.readouterr().out
    assert "verdict: REFUSED" in out and "shutdownAfterJobFinishes must be true" in out


def test_reads_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(anchor_job().obj())))
    assert explain_json(capsys, "-f", "-")[1]["gang"]["minMember"] == 3


def test_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    line = fails(capsys, "-f", str(tmp_path / "nope.yaml"))
    assert line == f"raygate: error: cannot read {tmp_path / 'nope.yaml'}: No such file or directory"


def test_bad_yaml_names_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = fails(capsys, "-f", write(tmp_path, "kind: RayJob\nname: a: b\n"))
    assert line.endswith("is not valid YAML at line 2, column 8: mapping values are not allowed here")


@pytest.mark.parametrize(("text", "says"), [
    ("", "holds 0 documents"),
    ("kind: RayJob\n---\nkind: RayJob\n", "holds 2 documents"),
    ("- a\n", "is not a Kubernetes object"),
    ("apiVersion: v1\nkind: Pod\n", "holds a Pod: raygate explains RayJob and RayCluster"),
    ("apiVersion: ray.io/v1alpha1\nkind: RayJob\n", "apiVersion 'ray.io/v1alpha1' is not served"),
], ids=["empty", "two_documents", "a_list", "a_pod", "old_api_version"])
def test_not_one_ray_object(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, says: str) -> None:
    assert says in fails(capsys, "-f", write(tmp_path, text))


def test_bad_config_names_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write(tmp_path, "defaults:\n  mode: slurm\n", "config.yaml")
    line = fails(capsys, "-f", write(tmp_path, anchor_job().obj()), "--config", cfg)
    assert "is not a valid raygate config: defaults.mode: Input should be" in line


def test_mode_that_contradicts_the_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write(tmp_path, "defaults:\n  provisioning:\n    enabled: true\n", "config.yaml")
    line = fails(capsys, "-f", write(tmp_path, anchor_job().obj()), "--config", cfg, "--mode", "kueue")
    assert "--mode kueue does not fit the config" in line and "kueue mode cannot use" in line


def test_native_mode_shows_the_workload_and_pod_group_it_would_create(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, result = explain_json(capsys, "-f", write(tmp_path, anchor_job().obj()), "--mode", "native")
    assert code == 0
    workload, group = result["groups"]["objects"]
    assert (workload["kind"], group["kind"]) == ("Workload", "PodGroup")
    assert workload["apiVersion"] == "scheduling.k8s.io/v1alpha2"  # offline: what Kubernetes 1.36 serves
    assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 3}}
    assert "offline" in result["groups"]["summary"]
