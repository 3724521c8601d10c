"""The alerts and the Grafana dashboard (config/monitoring, shipped by the chart too) refer only to
metrics, and labels, that raygate's components really export; docs/metrics.md names exactly those."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

import raygate.reconciler.metrics as reconciler_metrics
import raygate.webhook.metrics as webhook_metrics
from raygate.kube.client import Kube

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "config" / "monitoring"
CHART_FILES = ROOT / "charts" / "raygate" / "files"
METRICS_DOC = ROOT / "docs" / "metrics.md"
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
            "gauge": ("",), "summary": ("", "_count", "_sum", "_created")}

# PromQL words that are not metric names.
FUNCTIONS = {
    "sum", "min", "max", "avg", "count", "rate", "irate", "increase", "histogram_quantile", "absent",
    "min_over_time", "max_over_time", "avg_over_time", "vector", "scalar", "time", "clamp_min", "topk",
    "and", "or", "unless", "on", "ignoring", "by", "without", "group_left", "group_right", "bool", "offset",
}


def exported() -> dict[str, set[str]]:
    """Every sample name raygate's two components expose, with the label names it carries."""
    out: dict[str, set[str]] = {}
    for module in (webhook_metrics, reconciler_metrics):
        for obj in vars(module).values():
            if isinstance(obj, MetricWrapperBase):
                name, kind = obj._name, obj._type
                for suffix in SUFFIXES[kind]:
                    out[name + suffix] = set(obj._labelnames) | ({"le"} if suffix == "_bucket" else set())

    class FakeKube:
        requests = {"GET": 1}

    collector = reconciler_metrics.StateCollector(lambda: [], cast(Kube, FakeKube()), lambda: 3)
    for family in collector.collect():
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


def families() -> set[str]:
    """Every metric as a user queries it: a counter by its `_total` sample, a gauge or histogram by its name."""
    out: set[str] = set()
    for module in (webhook_metrics, reconciler_metrics):
        for obj in vars(module).values():
            if isinstance(obj, MetricWrapperBase):
                out.add(obj._name + ("_total" if obj._type == "counter" else ""))

    class FakeKube:
        requests = {"GET": 1}

    for family in reconciler_metrics.StateCollector(lambda: [], cast(Kube, FakeKube()), lambda: 3).collect():
        out.add(family.name + ("_total" if family.type == "counter" else ""))
    return out


def alert_rules() -> list[dict[str, Any]]:
    rule = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    return [r for g in rule["spec"]["groups"] for r in g["rules"]]


def dashboard_exprs() -> list[str]:
    dash = json.loads((MONITORING / "raygate-dashboard.json").read_text())
    return [t["expr"] for p in dash["panels"] for t in p["targets"]]


EXPRS = [(r["alert"], r["expr"]) for r in alert_rules()] + [
    (f"dashboard-{i}", e) for i, e in enumerate(dashboard_exprs())
]


def references(expr: str) -> tuple[set[str], dict[str, set[str]], set[str]]:
    """(metric names, label names matched per metric, label names grouped by) in one expression."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    matchers: dict[str, set[str]] = {}
    for metric, body in re.findall(r"([a-zA-Z_:][\w:]*)\s*\{([^}]*)\}", expr):
        matchers.setdefault(metric, set()).update(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", body))
    grouped: set[str] = set()
    for body in re.findall(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", expr):
        grouped.update(w.strip() for w in body.split(",") if w.strip())
    bare = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", bare)
    names = {w for w in re.findall(r"\b[a-zA-Z_:][\w:]*\b", bare)
             if w not in FUNCTIONS and not re.fullmatch(r"\d+[smhdwy]?|e\d+", w)}
    return names, matchers, grouped


def test_the_parser_finds_what_an_expression_names() -> None:
    names, matchers, grouped = references(
        'sum by (le, reason) (rate(a_total{x="1", y=~"b|c"}[5m])) / on() max(b_gauge) > 0.5'
    )
    assert names == {"a_total", "b_gauge"}
    assert matchers == {"a_total": {"x", "y"}}
    assert grouped == {"le", "reason"}


@pytest.mark.parametrize(("where", "expr"), EXPRS, ids=[e[0] for e in EXPRS])
def test_expression_uses_exported_metrics_and_labels(where: str, expr: str) -> None:
    metrics = exported()
    names, matchers, grouped = references(expr)
    assert names, f"{where}: no metric in {expr!r}"
    unknown = names - set(metrics)
    assert not unknown, f"{where}: raygate exports no {sorted(unknown)} (it exports {sorted(metrics)})"
    for metric, labels in matchers.items():
        assert labels <= metrics[metric], f"{where}: {metric} has no label {sorted(labels - metrics[metric])}"
    available = set().union(*(metrics[n] for n in names))
    assert grouped <= available, f"{where}: grouped by {sorted(grouped - available)}, which no metric here has"


def test_alerts_cover_what_an_on_call_engineer_needs() -> None:
    by_metric = {r["alert"]: references(r["expr"])[0] for r in alert_rules()}
    covered = set().union(*by_metric.values())
    for needed in ("raygate_webhook_reviews_total", "raygate_webhook_review_seconds_bucket",
                   "raygate_reconciler_jobs", "raygate_reconciler_requests_failed_total", "raygate_config_valid",
                   "raygate_reconciler_api_requests_total", "raygate_reconciler_queue_wait_seconds_bucket"):
        assert needed in covered, f"no alert on {needed}"
    for rule in alert_rules():
        assert rule["labels"]["severity"] in ("info", "warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]


def test_state_values_in_expressions_are_raygate_states() -> None:
    from raygate.core import keys

    states = {s.value for s in keys.State}
    for where, expr in EXPRS:
        for value in re.findall(r'state=~?"([^"]*)"', expr):
            assert set(value.split("|")) <= states, f"{where}: {value}"


def test_the_metrics_page_names_every_exported_metric_and_no_other() -> None:
    documented = set(re.findall(r"\braygate_\w+", METRICS_DOC.read_text()))
    exported_families = families()
    assert exported_families - documented == set(), "docs/metrics.md does not name these"
    assert documented - exported_families == set(), "docs/metrics.md names metrics raygate does not export"


@pytest.mark.parametrize("name", ["prometheusrule.yaml", "raygate-dashboard.json"])
def test_chart_ships_the_same_files(name: str) -> None:
    assert (CHART_FILES / name).read_text() == (MONITORING / name).read_text(), (
        f"charts/raygate/files/{name} differs from config/monitoring/{name}: `make chart-files` copies it"
    )

