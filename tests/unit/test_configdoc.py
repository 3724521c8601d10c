"""The ConfigMap reference in docs/configuration.md is generated from the pydantic models; it must not drift."""

from __future__ import annotations

from pathlib import Path

import pytest

from raygate import configdoc
from raygate.core.policy import NamespacePolicy, RaygateConfig

REPO = Path(__file__).resolve().parents[2]


def test_the_config_reference_matches_the_models() -> None:
    assert configdoc.DOC_PATH == REPO / "docs" / "configuration.md"
    doc = configdoc.DOC_PATH.read_text()
    assert configdoc.splice(doc) == doc, "docs/configuration.md is stale: run `python -m raygate.configdoc --write`"


def test_write_rewrites_a_stale_block_and_nothing_else(tmp_path: Path) -> None:
    stale = tmp_path / "config.md"
    stale.write_text(f"before\n\n{configdoc.BEGIN}\n| `gone` | old |\n{configdoc.END}\n\nafter\n")
    assert configdoc.main(["--write", str(stale)]) == 0
    assert stale.read_text() == f"before\n\n{configdoc.render()}\n\nafter\n"


def test_a_file_without_the_markers_is_refused() -> None:
    with pytest.raises(ValueError, match="no config-reference markers"):
        configdoc.splice("# Configuration\n")


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
