"""The example non-model application runs end to end and filters what it should."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from roll.runtime.testing import ship_module_by_value

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "text_filter.py"


def load_example():
    spec = importlib.util.spec_from_file_location("roll_example_text_filter", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    import sys

    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    ship_module_by_value(spec.name)
    return module


def test_text_filter_example(ray_session, tmp_path):
    example = load_example()
    output = tmp_path / "kept.jsonl"
    counts = example.main(["--docs", "200", "--workers", "3", "--batch-size", "64", "--output", str(output)])
    assert counts == {"seen": 200, "kept": 140, "too_short": 20, "too_long": 20, "symbols": 20}
    kept = [json.loads(line)["text"] for line in output.read_text().splitlines()]
    assert len(kept) == 140
    corpus = example.synthetic_corpus(200)
    assert kept == [doc for i, doc in enumerate(corpus) if i % 10 >= 3]
