"""Reporting for the benchmarks: human-readable numbers and tables, and the machine-readable result.

A benchmark prints its tables, then as its LAST stdout line ``RESULT {json}`` (:func:`emit_result`), which also
goes to ``--result-file`` when given (:func:`add_report_arguments`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["add_report_arguments", "emit_result", "fmt_bytes", "fmt_rate", "fmt_seconds", "table"]


# --- formatting -----------------------------------------------------------------------------------------------
def fmt_seconds(s: float | None) -> str:
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.3f} s"


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


def fmt_rate(bytes_per_s: float | None) -> str:
    if not bytes_per_s:
        return "-"
    return f"{bytes_per_s / 1e9:.2f} GB/s"


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str], left: Sequence[int] = (0,)) -> str:
    """A plain-text table; the columns whose indices are in ``left`` are left-aligned, the rest right-aligned."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        text = "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
        return text.rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), sep, *(line(r) for r in cells[1:])])


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--result-file", type=Path, default=None, help="also write the RESULT json to this file")


def emit_result(result: dict[str, Any], result_file: Path | None = None) -> None:
    """Print the machine-readable summary (must be the benchmark's last stdout line); write it to ``result_file``
    too when given (atomically)."""
    text = json.dumps(result, separators=(",", ":"), default=_json_default)
    if result_file is not None:
        result_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = result_file.with_name(f".{result_file.name}.tmp")
        tmp.write_text(text + "\n")
        os.replace(tmp, result_file)
    sys.stdout.flush()
    print("RESULT " + text, flush=True)


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy / torch scalars
        return value.item()
    if isinstance(value, Path):
        return str(value)
    return repr(value)
