from __future__ import annotations

import jsonpatch

from raygate.devenv.registration import configurations
from raygate.reconciler.housekeeping import failure_policy_patch


def test_failure_policy_patch_changes_every_webhook_and_guards_the_resource_version() -> None:
    mutating, _ = configurations("https://x", b"", failure_policy="Fail")
    mutating["metadata"]["resourceVersion"] = "42"
    patch = failure_policy_patch(mutating, "Ignore")
    assert patch[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "42"}
    patched = jsonpatch.apply_patch(mutating, patch)
    assert [h["failurePolicy"] for h in patched["webhooks"]] == ["Ignore"]


def test_failure_policy_patch_is_empty_when_nothing_differs() -> None:
    _, validating = configurations("https://x", b"", failure_policy="Ignore")
    assert failure_policy_patch(validating, "Ignore") == []


def test_failure_policy_patch_on_a_stale_copy_fails_instead_of_overwriting() -> None:
    mutating, _ = configurations("https://x", b"")
    mutating["metadata"]["resourceVersion"] = "7"
    patch = failure_policy_patch(mutating, "Ignore")
    newer = {**mutating, "metadata": {**mutating["metadata"], "resourceVersion": "8"}}
    try:
        jsonpatch.apply_patch(newer, patch)
    except jsonpatch.JsonPatchTestFailed:
        return
    raise AssertionError("a patch computed from resourceVersion 7 applied to 8")
