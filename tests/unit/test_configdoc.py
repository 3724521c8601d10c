"""The ConfigMap reference in README.md is generated from the pydantic models; it must not drift."""

from __future__ import annotations

from pathlib import Path

from raygate import configdoc
from raygate.policy import NamespacePolicy, RaygateConfig

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_config_reference_matches_the_models() -> None:
    readme = README.read_text()
    assert configdoc.splice(readme) == readme, "README.md is stale: run `python -m raygate.configdoc --write README.md`"


def test_every_config_field_is_documented_with_a_description() -> None:
    rendered = configdoc.render()
    for model in (RaygateConfig, NamespacePolicy):
        for name, info in model.model_fields.items():
            assert f"`{info.alias or name}" in rendered or f".{info.alias or name}`" in rendered
    assert "| `provisioning.className` |" in rendered
    assert "| `retry.limit` | int | `3` |" in rendered
