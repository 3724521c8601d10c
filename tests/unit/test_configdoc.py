"""The ConfigMap reference in README.md is generated from the pydantic models; it must not drift."""

from __future__ import annotations

from pathlib import Path

from raygate import configdoc
from raygate.core.policy import NamespacePolicy, RaygateConfig

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_config_reference_matches_the_models() -> None:
    readme = README.read_text()
    assert configdoc.splice(readme) == readme, "README.md is stale: run `python -m raygate.configdoc --write README.md`"


def test_every_config_field_is_documented_with_a_description() -> None:
    rendered = configdoc.render()
    rows = [ln for ln in rendered.splitlines() if ln.startswith("| `")]
    documented = {ln.split("`")[1] for ln in rows}
    for model in (RaygateConfig, NamespacePolicy):
        for name, info in model.model_fields.items():
            alias = info.alias or name
            assert alias in documented or any(d.startswith(f"{alias}.") for d in documented), alias
    for row in rows:
        meaning = row.rstrip("|").rsplit("|", 1)[1].strip()
        assert meaning, f"no description: {row}"
    assert "| `provisioning.className` |" in rendered
    assert "| `retry.limit` | int | `3` |" in rendered
