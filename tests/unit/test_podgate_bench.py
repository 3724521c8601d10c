"""The podgate benchmark's reading of an API server CPU profile (`go tool pprof -top -cum`)."""

from __future__ import annotations

import pytest

from benchmarks.podgate_bench import frame_seconds

TOP = """File: kube-apiserver
Type: cpu
Duration: 18s, Total samples = 5.43s (30.16%)
Showing nodes accounting for 5.43s, 100% of 5.43s total
      flat  flat%   sum%        cum   cum%
         0     0%     0%      1.46s 26.89%  k8s.io/apiserver/pkg/storage/cacher.(*CacheDelegator).GuaranteedUpdate
     0.03s  0.55%  3.87%      390ms  7.18%  k8s.io/apiserver/pkg/admission.chainAdmissionHandler.Admit
         0     0% 15.34%      0.34s  6.26%  apiserver/pkg/endpoints/handlers.(*jsonPatcher).applyPatchToCurrentObject
         0     0% 16.00%      0.20s  3.68%  runtime.gcBgMarkWorker.func2
     0.01s  0.18% 16.02%      0.05s  0.92%  k8s.io/apiserver/pkg/admission.chainAdmissionHandler.Admit (inline)
"""


def test_a_profiles_top_gives_its_total_and_the_seconds_under_each_frame_named() -> None:
    assert frame_seconds(TOP) == pytest.approx({
        "all samples": 5.43,
        "every update (storage GuaranteedUpdate)": 1.46,
        "mutating admission": 0.39,  # milliseconds read as such; the inlined copy's line is not the frame
        "applying JSON patches": 0.34,
    })  # a frame's closure (gcBgMarkWorker.func2) is not the frame


def test_a_top_without_samples_gives_nothing() -> None:
    assert frame_seconds("File: kube-apiserver\nType: cpu\n") == {}
