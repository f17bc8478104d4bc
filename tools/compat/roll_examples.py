"""Every ROLL example config through roll's ROLL-config loader: which load and pass ``roll validate --no-ray``,
which fail with listed reasons (keys roll cannot honour), and which belong to no pipeline roll has.

    python -m tools.compat.roll_examples ROLL/examples [--result-file out.json] [--markdown out.md]

Per file: ``compose_file`` + ``translate`` + ``load_config`` + ``validate_deployment(check_ray=False)``, the steps of
``roll validate --no-ray``. Hydra include folders (``examples/**/config/``) are skipped. Ends with ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import sys
from pathlib import Path
from typing import Any

from roll.pipelines.compat import compose_file, translate
from roll.pipelines.config import load_config
from roll.pipelines.validate import validate_deployment
from roll.runtime import ConfigError


def check_file(path: Path) -> dict[str, Any]:
    """{'status': loaded|failed|other, 'pipeline', 'reasons', 'unknown'} of one ROLL config file."""
    try:
        data, referenced = compose_file(path)
        translation = translate(data, referenced)
    except ConfigError as e:
        return {"status": "other", "pipeline": None, "reasons": [str(e).splitlines()[0][:160]], "unknown": []}
    unknown = [row.key for row in translation.rows if row.status == "unknown"]
    problems = [f"{row.key}: {row.note}" for row in translation.problems]
    if problems:
        return {"status": "failed", "pipeline": translation.pipeline, "reasons": problems, "unknown": unknown}
    try:
        lines = validate_deployment(load_config(path), check_ray=False)
    except Exception as e:  # a config error after translation is a finding, not a crash of the measurement
        lines = [line.strip() for line in str(e).splitlines()]
        detail = " / ".join(lines[1:]) if len(lines) > 1 else lines[0] if lines else ""
        reason = f"{type(e).__name__}: {detail}"[:400]
        return {"status": "failed", "pipeline": translation.pipeline, "reasons": [reason], "unknown": unknown}
    errors = [line for line in lines if line.startswith("error")]
    status = "failed" if errors else "loaded"
    return {"status": status, "pipeline": translation.pipeline, "reasons": errors, "unknown": unknown}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("examples", type=Path)
    parser.add_argument("--result-file", type=Path)
    parser.add_argument("--markdown", type=Path, help="write the per-file list as markdown")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    files = sorted(p for p in args.examples.rglob("*.yaml") if "config" not in p.parent.name)
    results = {str(p.relative_to(args.examples.parent)): check_file(p) for p in files}
    counts = collections.Counter(r["status"] for r in results.values())
    by_pipeline = collections.Counter((r["pipeline"], r["status"]) for r in results.values())
    summary = {
        "files": len(results),
        "loaded": counts["loaded"],
        "failed": counts["failed"],
        "other": counts["other"],
        "with_unknown_keys": sum(1 for r in results.values() if r.get("unknown")),
        "by_pipeline": {f"{p}/{s}": n for (p, s), n in sorted(by_pipeline.items(), key=str)},
    }
    if args.markdown:
        lines = []
        for status in ("loaded", "failed", "other"):
            chosen = {k: r for k, r in results.items() if r["status"] == status}
            lines += [f"### {status} ({len(chosen)})", ""]
            for name, r in chosen.items():
                reason = "; ".join(r["reasons"]) if status != "loaded" else ""
                lines.append(f"- `{name}` ({r['pipeline']})" + (f": {reason}" if reason else ""))
            lines.append("")
        args.markdown.write_text("\n".join(lines))
    if args.result_file:
        args.result_file.write_text(json.dumps({"summary": summary, "files": results}, indent=1))
    print("RESULT " + json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
