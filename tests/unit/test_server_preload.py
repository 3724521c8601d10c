"""The webhook's gunicorn master imports what its workers run before it forks them (so they share those
pages), but none of the webhook's metrics: a value file of the master's pid would report its zeros beside
the workers' values (raygate_config_valid, aggregated by min, would read 0 for good)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from raygate.webhook.server import PRELOAD


def test_the_master_preloads_the_workers_imports_but_no_metric(tmp_path: Path) -> None:
    code = ("import json, os, sys; from raygate.webhook import server; server.preload(); "
            "print(json.dumps({'files': os.listdir(os.environ['PROMETHEUS_MULTIPROC_DIR']), "
            "'modules': [m for m in ('raygate.webhook.metrics', 'flask', 'raygate.core.policy', 'kubernetes') "
            "if m in sys.modules]}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                         env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout)
    assert seen["files"] == [], "the master created metric value files"
    assert seen["modules"] == ["flask", "raygate.core.policy"], seen["modules"]
    assert "raygate.webhook.app" not in PRELOAD and "raygate.webhook.state" not in PRELOAD
