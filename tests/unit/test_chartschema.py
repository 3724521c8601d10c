"""The chart's values.schema.json is what raygate's config models say (tests/integration/test_chart.py
shows Helm refusing, with it, what parse_config refuses)."""

from __future__ import annotations

from raygate import chartschema
from raygate.core.policy import RaygateConfig


def test_committed_schema_is_generated_from_the_models() -> None:
    assert chartschema.SCHEMA_PATH.read_text() == chartschema.render(), (
        "charts/raygate/values.schema.json is stale: run `python -m raygate.chartschema --write`"
    )


def test_config_value_is_the_config_model() -> None:
    s = chartschema.schema()
    assert s["properties"]["config"] == {"$ref": "#/$defs/RaygateConfig"}
    config = s["$defs"]["RaygateConfig"]
    assert set(config["properties"]) == {f.alias for f in RaygateConfig.model_fields.values()}
    assert config["additionalProperties"] is False
