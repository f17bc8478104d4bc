"""ROLL's own examples/ folder, when a checkout is given: every config of a pipeline roll has loads, or fails only
with listed reasons (keys roll cannot honour), never with an unknown key or a crash.

Set ``ROLL_EXAMPLES_DIR`` to a ROLL checkout's ``examples`` folder to run it (skipped otherwise).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from roll.pipelines.compat import compose_file, translate
from roll.pipelines.config import load_config
from roll.pipelines.validate import validate_deployment
from roll.runtime import ConfigError

ROOT = os.environ.get("ROLL_EXAMPLES_DIR")
FILES = sorted(p for p in Path(ROOT).rglob("*.yaml") if "config" not in p.parent.name) if ROOT else []
OURS = {"rlvr", "sft", "dpo", "rlvr_rollout"}


@pytest.mark.skipif(not ROOT, reason="ROLL_EXAMPLES_DIR is not set")
@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES] if ROOT else [])
def test_roll_example(path: Path) -> None:
    try:
        data, referenced = compose_file(path)
        translation = translate(data, referenced)
    except ConfigError as e:  # a pipeline roll lacks (agentic, distill), or an unusable file
        assert (
            "agentic" in str(e)
            or "distill" in str(e)
            or "cannot tell" in str(e)
            or "defaults" in str(e)
            or ("environment variable" in str(e))
        ), str(e)
        pytest.skip(f"not a pipeline roll has: {e}")
    assert translation.pipeline in OURS
    assert [row.key for row in translation.rows if row.status == "unknown"] == []
    if translation.problems:
        with pytest.raises(ConfigError, match="roll cannot honour"):
            load_config(path)
        return
    config = load_config(path)
    lines = validate_deployment(config, check_ray=False)
    assert all(not line.startswith("error") for line in lines)
