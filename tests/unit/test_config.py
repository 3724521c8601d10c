"""ConfigMap raygate-config, key config.yaml: what an admin writes, what raygate makes of it, and
errors that name the field to change."""

from __future__ import annotations

import pytest

from raygate.core import keys
from raygate.core.config import parse_config
from raygate.core.keys import Mode
from raygate.core.modes import for_object
from raygate.core.policy import ConfigError, RaygateConfig
from raygate.kube.configsource import ConfigSource


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as err:
        parse_config(text)
    return err.value.problems


INVALID = [
    # (name, config.yaml, the problem lines that must be reported, each as a prefix "path: ...")
    ("unknown_top_level_key", "surprise: 1\n", ["surprise: Extra inputs are not permitted"]),
    ("unknown_key_in_defaults", "defaults:\n  lane: q\n", ["defaults.lane: Extra inputs are not permitted"]),
    ("unknown_key_in_a_namespace_override", "namespaces:\n  team:\n    lane: q\n",
     ["namespaces.team.lane: Extra inputs are not permitted"]),
    ("a_namespace_in_a_queue_nobody_defined", "namespaces:\n  team:\n    queue: a100\n",
     ["namespaces.team.queue: there is no queue 'a100': define it under `queues` (defined: default)"]),
    ("queues_without_the_default_one", "queues:\n  a100: {}\n",
     ["defaults.queue: there is no queue 'default'"]),
    ("a_bad_strategy", "queues:\n  default:\n    strategy: Random\n",
     ["queues.default.strategy: Input should be 'StrictFIFO' or 'BestEffortFIFO'"]),
    ("bad_mode", "defaults:\n  mode: slurm\n",
     ["defaults.mode: Input should be 'provisioning', 'volcano', 'kueue' or 'native'"]),
    ("bad_mode_in_override", "namespaces:\n  team:\n    mode: slurm\n", ["namespaces.team.mode: Input should be"]),
    ("nested_field_path", "defaults:\n  retry:\n    baseSeconds: -1\n",
     ["defaults.retry.baseSeconds: Input should be greater than 0"]),
    ("nested_override_path", "namespaces:\n  team:\n    provisioning:\n      className: ''\n",
     ["namespaces.team.provisioning.className: String should have at least 1 character"]),
    ("bad_max_gang_quantity", "defaults:\n  maxGang:\n    nvidia.com/gpu: lots\n",
     ["defaults.maxGang: nvidia.com/gpu: 'lots' is not a quantity"]),
    ("long_provisioning_parameter", f"defaults:\n  provisioning:\n    parameters:\n      noRetry: {'x' * 256}\n",
     ["defaults.provisioning.parameters: parameter 'noRetry' is longer than 255"]),
    ("no_managed_resources", "defaults:\n  managedResources: []\n", ["defaults.managedResources: List should have"]),
    ("bad_failure_policy", "failurePolicy: Retry\n", ["failurePolicy: Input should be 'Fail' or 'Ignore'"]),
    ("kueue_with_own_provisioning_requests", "defaults:\n  mode: kueue\n  provisioning:\n    enabled: true\n",
     ["defaults: kueue mode cannot use raygate's own ProvisioningRequests"]),
    ("kueue_override_with_own_provisioning_requests",
     "namespaces:\n  team:\n    mode: kueue\n    provisioning:\n      enabled: true\n",
     ["namespaces.team: kueue mode cannot use raygate's own ProvisioningRequests"]),
    ("override_turns_kueue_defaults_invalid", "defaults:\n  mode: kueue\nnamespaces:\n  team:\n    provisioning:\n"
     "      enabled: true\n", ["namespaces.team: kueue mode cannot use"]),
    ("selector_matching_everything_includes_kube_system", "namespaceSelector: {}\n",
     ["namespaceSelector: this selector matches kube-system"]),
    ("selector_naming_kube_system",
     "namespaceSelector:\n  matchLabels:\n    kubernetes.io/metadata.name: kube-system\n",
     ["namespaceSelector: this selector matches kube-system"]),
    ("selector_by_missing_label_matches_kube_system",
     "namespaceSelector:\n  matchExpressions:\n  - key: team\n    operator: DoesNotExist\n",
     ["namespaceSelector: this selector matches kube-system"]),
    ("selector_naming_raygate_system",
     "namespaceSelector:\n  matchExpressions:\n  - key: kubernetes.io/metadata.name\n    operator: In\n"
     "    values: [raygate-system]\n", ["namespaceSelector: this selector matches raygate-system"]),
    ("override_for_kube_system", "namespaces:\n  kube-system:\n    mode: kueue\n",
     ["namespaces.kube-system: raygate never acts in kube-system"]),
    ("override_not_a_mapping", "namespaces:\n  team: kueue\n", ["namespaces.team: Input should be a valid dictionary"]),
    ("operator_given_as_a_group", "rayOperatorUsers: [system:serviceaccounts:ray-system]\n",
     ["rayOperatorUsers: 'system:serviceaccounts:ray-system' is a group, not a user"]),
    ("operator_given_as_every_user", "rayOperatorUsers: [system:authenticated]\n",
     ["rayOperatorUsers: 'system:authenticated' is a group"]),
    ("operator_service_account_without_namespace", "rayOperatorUsers: ['system:serviceaccount:kuberay-operator']\n",
     ["rayOperatorUsers: 'system:serviceaccount:kuberay-operator' is not a ServiceAccount username"]),
    ("operator_wildcard", "rayOperatorUsers: ['*']\n", ["rayOperatorUsers: '*' is not a username"]),
    ("trusted_user_blank", "trustedUsers: ['']\n", ["trustedUsers: '' is not a username"]),
    ("not_yaml", "defaults: [\n", ["config.yaml is not valid YAML"]),
    ("not_a_mapping", "- defaults\n", ["config.yaml must be a mapping"]),
]


@pytest.mark.parametrize(("text", "expected"), [(t, e) for _, t, e in INVALID], ids=[n for n, _, _ in INVALID])
def test_invalid_config_names_the_field(text: str, expected: list[str]) -> None:
    got = problems(text)
    for line in expected:
        assert any(p.startswith(line) for p in got), (line, got)
    assert all("\n" not in p for p in got)  # one line per problem: it goes into logs and an Event


def test_every_problem_is_reported_at_once() -> None:
    got = problems("defaults:\n  mode: slurm\n  retry:\n    limit: -1\nsurprise: 1\nnamespaces:\n  team:\n    x: 1\n")
    paths = {p.split(":")[0] for p in got}
    assert {"defaults.mode", "defaults.retry.limit", "surprise"} <= paths


VALID = [
    ("empty_means_defaults", ""),
    ("default_selector_by_opt_in_label", f"namespaceSelector:\n  matchLabels:\n    {keys.OPT_IN_LABEL}: enabled\n"),
    ("selector_excluding_system_namespaces", "namespaceSelector:\n  matchExpressions:\n"
     "  - key: kubernetes.io/metadata.name\n    operator: NotIn\n    values: [kube-system, raygate-system]\n"
     "  - key: gpu\n    operator: Exists\n"),
    ("kueue_without_provisioning", "defaults:\n  mode: kueue\n  queueName: lq\n"),
    ("kueue_with_provisioning_explicitly_off", "defaults:\n  mode: kueue\n  provisioning:\n    enabled: false\n"),
    ("every_field", "failurePolicy: Ignore\ntrustedUsers: [ops]\ndefaults:\n  mode: volcano\n  queueName: q\n"
     "  priorityClass: high\n  allowUserQueue: true\n  managedResources: [nvidia.com/gpu, amd.com/gpu]\n"
     "  provisioning:\n    enabled: true\n    className: best-effort-atomic-scale-up.autoscaling.x-k8s.io\n"
     "    parameters: {noRetry: 'true'}\n    provisionedTimeoutSeconds: 60\n    capacityRevoked: Requeue\n"
     "  retry: {limit: 5, baseSeconds: 1, maxSeconds: 30}\n  maxGang: {nvidia.com/gpu: '64', memory: 2Ti}\n"
     "  fixShutdownAfterJobFinishes: true\n"),
]


@pytest.mark.parametrize("text", [t for _, t in VALID], ids=[n for n, _ in VALID])
def test_valid_config(text: str) -> None:
    assert isinstance(parse_config(text), RaygateConfig)


def test_defaults_when_nothing_is_configured() -> None:
    cfg = parse_config("")
    policy = cfg.policy_for("anywhere")
    rules = for_object(policy)
    assert rules.mode is Mode.PROVISIONING and rules.books and rules.holds
    assert policy.managed_resources == ["nvidia.com/gpu", "nvidia.com/mig-*", "amd.com/gpu"]
    assert cfg.failure_policy == "Fail"
    assert cfg.trusted_users == [f"system:serviceaccount:{keys.SYSTEM_NAMESPACE}:{keys.RECONCILER_SERVICE_ACCOUNT}"]
    assert cfg.opted_in("team", {keys.OPT_IN_LABEL: keys.OPT_IN_VALUE})
    assert not cfg.opted_in("team", {})
    assert not cfg.opted_in("kube-system", {keys.OPT_IN_LABEL: keys.OPT_IN_VALUE})


def test_namespace_override_merges_over_defaults() -> None:
    cfg = parse_config(
        "defaults:\n  mode: volcano\n  queueName: shared\n  priorityClass: normal\n"
        "  provisioning:\n    className: best-effort-atomic-scale-up.autoscaling.x-k8s.io\n"
        "    parameters: {noRetry: 'true'}\n"
        "  managedResources: [nvidia.com/gpu, amd.com/gpu]\n"
        "namespaces:\n"
        "  team:\n    queueName: team-q\n    provisioning:\n      parameters: {processorInstance: a3}\n"
        "    managedResources: [google.com/tpu]\n"
        "  research:\n    mode: kueue\n    queueName: research-lq\n"
    )
    team = cfg.policy_for("team")
    assert team.mode is Mode.VOLCANO  # from defaults
    assert (team.queue_name, team.priority_class) == ("team-q", "normal")  # overridden / inherited
    # Nested objects merge key by key; lists replace.
    assert team.provisioning.class_name == "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
    assert team.provisioning.parameters == {"noRetry": "true", "processorInstance": "a3"}
    assert team.managed_resources == ["google.com/tpu"]
    research = cfg.policy_for("research")
    assert (research.mode, research.queue_name, for_object(research).holds) == (Mode.KUEUE, "research-lq", False)
    assert not for_object(research).books  # kueue never uses raygate's own ProvisioningRequests
    assert cfg.policy_for("other") == cfg.defaults


def test_config_source_keeps_the_last_good_config() -> None:
    reported: list[list[str]] = []
    source = ConfigSource(None, on_result=reported.append).start()
    assert source.set_text("defaults:\n  mode: kueue\n  queueName: lq\n")
    assert not source.set_text("defaults:\n  mode: slurm\n")
    assert source.config.policy_for("team").mode is Mode.KUEUE
    assert source.last_error and source.last_error[0].startswith("defaults.mode:")
    assert reported == [[], source.last_error]
    assert source.set_text("")  # a good version replaces the old one and clears the error
    assert source.config.policy_for("team").mode is Mode.PROVISIONING and source.last_error == []


def test_snake_case_keys_are_unknown_keys_not_synonyms() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config("defaults:\n  queue_name: q\n")
    assert err.value.problems == ["defaults.queue_name: Extra inputs are not permitted"]
    with pytest.raises(ConfigError) as err:
        parse_config("namespaces:\n  team: {max_gang: {cpu: '1'}}\n")
    assert err.value.problems == ["namespaces.team.max_gang: Extra inputs are not permitted"]
