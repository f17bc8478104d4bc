"""ROLL's own examples/ folder, when a checkout is given: every config loads, or fails only with listed reasons (keys
roll cannot honour, or the ROLL settings of KNOWN_INVALID that roll's checks reject), never with an unknown key.

Set ``ROLL_EXAMPLES_DIR`` to a ROLL checkout's ``examples`` folder to run it (skipped otherwise).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from roll.pipelines.compat import compose_file, translate
from roll.pipelines.compat.multimodal import multimodal_markers
from roll.pipelines.config import load_config
from roll.pipelines.validate import validate_deployment
from roll.runtime import ConfigError

ROOT = os.environ.get("ROLL_EXAMPLES_DIR")
FILES = sorted(p for p in Path(ROOT).rglob("*.yaml") if "config" not in p.parent.name) if ROOT else []
# ROLL's own files whose settings roll's checks reject after translation (each reason read in the file).
KNOWN_INVALID = {
    # placeholders x_1 / x_2 for numbers (ROLL's loader rejects the string for its float field too)
    "docs_examples/example_topr.yaml": "use_topr_neg_loss_coef: x_2 is not a number",
    # env types of ROLL's own that roll does not build (roll validate names the entry and the env types it has)
    "qwen2.5-7B-agentic_megatron/agentic_val_webshop.yaml": "env_type webshop (ROLL's third_party submodule)",
    "qwen2.5-7B-agentic_megatron/agentic_val_webshop_amd.yaml": "env_type webshop",
    "qwen2.5-7B-agentic_megatron/agentic_val_webshop_gigpo.yaml": "env_type webshop",
}


@pytest.mark.skipif(not ROOT, reason="ROLL_EXAMPLES_DIR is not set")
@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES] if ROOT else [])
def test_roll_example(path: Path) -> None:
    try:
        data, referenced = compose_file(path)
        translation = translate(data, referenced)
    except ConfigError as e:  # an unusable file (empty, a missing include, an unset environment variable)
        assert any(text in str(e) for text in ("cannot tell", "defaults", "environment variable")), str(e)
        pytest.skip(f"not usable as it is: {e}")
    assert [row.key for row in translation.rows if row.status == "unknown"] == []
    if multimodal_markers(data):  # one clear reason, not the keys that follow from it
        assert [row.key for row in translation.problems] == ["(multimodal)"]
    if translation.problems:
        with pytest.raises(ConfigError, match="roll cannot honour"):
            load_config(path)
        return
    name = str(path.relative_to(ROOT))
    if name in KNOWN_INVALID:
        with pytest.raises(ConfigError):
            validate_deployment(load_config(path), check_ray=False)
        return
    lines = validate_deployment(load_config(path), check_ray=False)
    assert all(not line.startswith("error") for line in lines)
    if "rock_swe" in name:  # ROLL's ROCK examples: their task file and service are not here, which only warns
        warnings = [line for line in lines if line.startswith("warning")]
        assert any("dataset_name" in line for line in warnings), lines
        assert any("ROCK service" in line or "roll-agentic[rock]" in line for line in warnings), lines
    if "sokoban_sandbox" in name:  # ROLL's sandbox Sokoban: the ROCK service (base_url) is not here, which only warns
        warnings = [line for line in lines if line.startswith("warning")]
        assert any(
            "SokobanSandbox" in line and ("ROCK service" in line or "roll-agentic[rock]" in line) for line in warnings
        ), lines
