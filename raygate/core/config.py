"""Loading raygate's config: `config.yaml` checked field by field by the models (policy.py), then each
namespace's policy against its mode (what the mode cannot run with) and against what the cluster serves.

The models are data and know no mode; this loader sits above the modes and asks each policy's rules
(`for_object`), so a config is refused whole, naming every problem by its path, and the components keep
the last good one.
"""

from __future__ import annotations

from pydantic import ValidationError

from raygate.core.api import OFFLINE, Served
from raygate.core.modes import for_object
from raygate.core.policy import (
    PROTECTED_NAMESPACES,
    ConfigError,
    RaygateConfig,
    field_problems,
    merge_override,
    parse_fields,
)


def parse_config(text: str, served: Served = OFFLINE) -> RaygateConfig:
    """Parse and fully validate `config.yaml`; raise ConfigError naming every bad field. `served`: what the
    cluster serves (discovery, when the component started): a mode it cannot run is refused here, so the
    last good config stays (OFFLINE: not checked)."""
    cfg = parse_fields(text)
    defaults = for_object(cfg.defaults).mode_rules
    # Every namespace inherits the defaults: a default its mode cannot run with is the one problem to name.
    if problems := [f"defaults: {p}" for p in defaults.config_problems(cfg.defaults)]:
        raise ConfigError(problems)
    problems = [f"defaults.mode: {p}" for p in defaults.cluster_problems(served)]
    if cfg.defaults.queue not in cfg.queues:
        problems.append(_no_queue("defaults.queue", cfg.defaults.queue, cfg))
    for ns, override in cfg.namespaces.items():
        if ns in PROTECTED_NAMESPACES:
            problems.append(f"namespaces.{ns}: raygate never acts in {ns}; remove this entry")
            continue
        if not isinstance(override, dict):
            problems.append(f"namespaces.{ns}: must be a mapping of fields from defaults")
            continue
        try:
            merged = merge_override(cfg.defaults, override)
        except ValidationError as err:
            problems.extend(field_problems(err, ("namespaces", ns)))
            continue
        if merged.queue not in cfg.queues and "queue" in override:
            problems.append(_no_queue(f"namespaces.{ns}.queue", merged.queue, cfg))
        rules = for_object(merged).mode_rules
        if config_problems := rules.config_problems(merged):
            problems += [f"namespaces.{ns}: {p}" for p in config_problems]
        elif merged.mode is not cfg.defaults.mode:
            problems += [f"namespaces.{ns}.mode: {p}" for p in rules.cluster_problems(served)]
    if problems:
        raise ConfigError(problems)
    return cfg


def _no_queue(path: str, name: str, cfg: RaygateConfig) -> str:
    return f"{path}: there is no queue {name!r}: define it under `queues` (defined: {', '.join(sorted(cfg.queues))})"
