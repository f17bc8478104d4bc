"""Learning matrix: does each RL algorithm raise held-out correctness, on the same task and the same budget?

    ./tools/dev bench learning                               # every algorithm, 20 steps each
    ./tools/dev bench learning --algos grpo,ppo --steps 10   # a subset, shorter
    ./tools/dev bench learning --markdown docs/results/learning.md --result-file docs/results/learning.json

The task is the quick start's (``rlvr-tiny``): worked two-digit additions, the policy starting from the cached
SFT warm-up (``recipe://rlvr-tiny-warmup``, which answers in the requested ``\\boxed{}`` format, knows the
one-digit facts, and forgets the carry in most greedy answers while ~40% of its samples carry it), 16 prompts x 8
samples per step, a reward of 1 for a right boxed answer. Every algorithm gets the same prompts, steps, learning
rate (LoRA excepted, see below) and validation: greedy answers to the 256 held-out problems (none of them, nor
their commuted twins, in training), graded by ``val/correct`` (the answer is right,
whatever its format) and ``val/format`` apart, before the first step and after the last.

The algorithms (:data:`VARIANTS`), each a change to the recipe:

* ``ppo``: GAE advantages from a critic (the warm-up with a value head), whitened; clipped PPO loss.
* ``grpo``: the recipe as it is (group-normalized rewards, no critic, no KL).
* ``reinforce_pp``: REINFORCE++ (batch-normalized returns).
* ``rloo``: leave-one-out baseline within each prompt's group.
* ``gspo``: GRPO advantages, sequence-level importance ratio with GSPO's clip range (3e-4 / 4e-4).
* ``dapo``: dynamic sampling (groups whose rewards all agree are dropped and refilled) + clip-higher (0.28).
* ``grpo_kl``: GRPO + a k3 KL loss (coefficient 0.01) against a frozen reference (the warm-up).
* ``grpo_tis``: GRPO + truncated importance sampling (cap 2) of the rollout engine's log-probs, recomputed.
* ``grpo_lora``: GRPO training a rank-8 LoRA adapter (alpha 16) with a 10x learning rate (5e-4), as LoRA
  usually needs; the merged weights are synced to the engine. Needs ``peft`` (roll-strategies[fsdp2]).

Each run is ``roll run <config>`` in a subprocess (its own Ray), one after the other; the warm-up is trained once
first (its time reported apart) into ``--cache-dir``. Reported per algorithm: val/correct and val/format before
and after, the change in val/correct, steps, wall time of the run. ``improved`` is a change of at least
``--min-gain`` (default 0.03: on 256 prompts a smaller change is within noise). A failed run is reported with
its error and the others still run. With ``--markdown`` the table is rewritten after every run, so an interrupted
matrix keeps the rows it has. The machine is shared and CPU-only: wall times move with its load (recorded).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from tools.bench._measure import environment
from tools.bench._report import add_report_arguments, emit_result, table

__all__ = ["VARIANTS", "Row", "run_variant", "variant_config", "warm_up"]

RECIPE = "rlvr-tiny"
WARMUP = "recipe://rlvr-tiny-warmup"

_CRITIC = {
    "world_size": 1,
    "model_args": {"model_name_or_path": WARMUP, "dtype": "float32", "model_head": "value"},
    "training_args": {"learning_rate": 1.0e-4, "per_device_train_batch_size": 32, "max_grad_norm": 1.0},
    "infer_batch_size": 64,
    "strategy_args": {"strategy_name": "fsdp2_train"},
}
_REFERENCE = {
    "world_size": 1,
    "model_args": {"model_name_or_path": WARMUP, "dtype": "float32"},
    "infer_batch_size": 64,
    "strategy_args": {"strategy_name": "hf_infer"},
}

# name -> (what it is, changes merged into the recipe)
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "ppo": (
        "PPO: GAE + critic",
        {"advantage": {"estimator": "gae", "whiten": True}, "critic": _CRITIC},
    ),
    "grpo": ("GRPO (the recipe)", {}),
    "reinforce_pp": ("REINFORCE++", {"advantage": {"estimator": "reinforce_plus_plus"}}),
    "rloo": ("RLOO", {"advantage": {"estimator": "rloo"}}),
    "gspo": (
        "GSPO: sequence-level ratio",
        {"policy_loss": {"importance_sampling": "sequence", "clip_low": 3.0e-4, "clip_high": 4.0e-4}},
    ),
    "dapo": (
        "DAPO: dynamic sampling + clip-higher",
        {"dynamic_sampling": {"enabled": True}, "policy_loss": {"clip_low": 0.2, "clip_high": 0.28}},
    ),
    "grpo_kl": (
        "GRPO + k3 KL loss, reference",
        {"kl": {"use_loss": True, "penalty": "k3", "loss_coef": 0.01}, "reference": _REFERENCE},
    ),
    "grpo_tis": ("GRPO + TIS (cap 2)", {"correction": {"tis_cap": 2.0}}),
    "grpo_lora": (
        "GRPO + LoRA r8 (lr 5e-4)",
        {
            "actor_train": {
                "model_args": {"lora_rank": 8, "lora_alpha": 16},
                "training_args": {"learning_rate": 5.0e-4},
            }
        },
    ),
}


def _merge(base: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def variant_config(name: str, *, steps: int, output_dir: Path, changes: Mapping[str, Any] | None = None) -> dict:
    """The recipe as data with algorithm ``name``'s changes, ``steps`` steps, validation before and after only."""
    from roll.pipelines.recipes import recipe_data

    if name not in VARIANTS:
        raise SystemExit(f"unknown algorithm {name!r}; one of {', '.join(VARIANTS)}")
    run = {
        "exp_name": f"learning-{name}",
        "output_dir": str(output_dir),
        "max_steps": steps,
        "eval_steps": steps,
        "save_steps": 0,
        "export_hf": False,
        "logging_steps": 1,
    }
    return _merge(_merge(_merge(recipe_data(RECIPE), VARIANTS[name][1]), run), changes or {})


@dataclass
class Row:
    algo: str
    description: str
    correct_before: float | None = None
    correct_after: float | None = None
    format_before: float | None = None
    format_after: float | None = None
    steps: int = 0
    wall_s: float = 0.0
    improved: bool = False
    error: str | None = None

    @property
    def gain(self) -> float | None:
        if self.correct_before is None or self.correct_after is None:
            return None
        return self.correct_after - self.correct_before


def _env(cache_dir: Path) -> dict[str, str]:
    return dict(os.environ, ROLL_CACHE_DIR=str(cache_dir), RAY_AUTH_MODE="disabled", PYTHONUNBUFFERED="1")


def warm_up(cache_dir: Path, timeout_s: float) -> float:
    """Train (or find cached) the SFT warm-up every run starts from; returns the seconds it took."""
    code = f"from roll.pipelines.launcher import run_cached_recipe; run_cached_recipe({WARMUP.split('://')[1]!r})"
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code], env=_env(cache_dir), capture_output=True, text=True, timeout=timeout_s
    )
    if done.returncode:
        raise SystemExit(f"the warm-up failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return time.perf_counter() - started


def _read(metrics: Path) -> list[dict[str, Any]]:
    if not metrics.is_file():
        return []
    return [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]


def run_variant(
    name: str, *, steps: int, work_dir: Path, cache_dir: Path, timeout_s: float, min_gain: float = 0.03
) -> Row:
    """Run algorithm ``name`` for ``steps`` steps (``roll run`` in a subprocess) and read its before/after."""
    out = work_dir / name
    config = variant_config(name, steps=steps, output_dir=out / "run")
    out.mkdir(parents=True, exist_ok=True)
    path = out / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    row = Row(algo=name, description=VARIANTS[name][0])
    started = time.perf_counter()
    cmd = [sys.executable, "-m", "roll.pipelines.cli", "run", str(path)]
    try:
        with (out / "log.txt").open("w") as log:
            done = subprocess.run(cmd, env=_env(cache_dir), stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s)
        if done.returncode:
            tail = (out / "log.txt").read_text().splitlines()[-3:]
            row.error = f"exit {done.returncode}: " + " | ".join(tail)[-400:]
    except subprocess.TimeoutExpired:
        row.error = f"timed out after {timeout_s:.0f} s"
    row.wall_s = time.perf_counter() - started
    rows = _read(out / "run" / "metrics.jsonl")
    evaluated = [r for r in rows if "val/correct" in r]
    row.steps = max((int(r["step"]) for r in rows if "actor/loss" in r or "critic/loss" in r), default=0)
    if evaluated:
        first, last = evaluated[0], evaluated[-1]
        row.correct_before, row.format_before = first["val/correct"], first.get("val/format")
        if last is not first:
            row.correct_after, row.format_after = last["val/correct"], last.get("val/format")
    row.improved = row.gain is not None and row.gain >= min_gain and row.error is None
    return row


def _pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{100 * value:+.1f}" if signed else f"{100 * value:.1f}"


def render(rows: list[Row]) -> str:
    return table(
        [
            [
                r.algo,
                r.description,
                _pct(r.correct_before),
                _pct(r.correct_after),
                _pct(r.gain, signed=True),
                _pct(r.format_before),
                _pct(r.format_after),
                r.steps,
                f"{r.wall_s / 60:.1f}",
                "yes" if r.improved else ("ERROR" if r.error else "no"),
            ]
            for r in rows
        ],
        ["algo", "what", "correct %", "after %", "change", "format %", "after %", "steps", "min", "improved"],
        left=(0, 1),
    )


def _markdown(rows: list[Row], meta: dict[str, Any], missing: list[str]) -> str:
    header = "| " + " | ".join(["algorithm", "what", "val/correct before", "after", "change (points)"])
    header += " | val/format before | after | steps | wall (min) | improved |\n|" + "---|" * 10 + "\n"
    lines = [
        f"| {r.algo} | {r.description} | {_pct(r.correct_before)} | {_pct(r.correct_after)} | "
        f"{_pct(r.gain, signed=True)} | {_pct(r.format_before)} | {_pct(r.format_after)} | {r.steps} | "
        f"{r.wall_s / 60:.1f} | {'yes' if r.improved else ('ERROR' if r.error else 'no')} |"
        for r in rows
    ]
    errors = [f"- {r.algo}: {r.error}" for r in rows if r.error]
    text = [
        "# Learning matrix: held-out correctness per RL algorithm\n",
        f"- date: {meta['date']}",
        f"- machine: {meta['env']['platform']}, {meta['env']['cpu_count']} CPUs (shared), load average at start "
        f"{meta['load_start']}, now {environment()['loadavg']}",
        f"- command: `{meta['command']}`",
        f"- budget: {meta['steps']} steps per algorithm (16 prompts x 8 samples), validation on 256 held-out "
        f"problems before and after; warm-up {meta['warmup_s'] / 60:.1f} min (trained once, or cached)",
        f"- improved = change >= {100 * meta['min_gain']:.0f} points; see `tools/bench/learning.py` for each "
        "algorithm's settings.\n",
        header + "\n".join(lines),
    ]
    if errors:
        text += ["\nErrors:", *errors]
    if missing:
        text.append(f"\nNot run (out of time): {', '.join(missing)}.")
    return "\n".join(text) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--algos", default=",".join(VARIANTS), help=f"comma-separated, of: {', '.join(VARIANTS)}")
    parser.add_argument("--steps", type=int, default=20, help="training steps per algorithm")
    parser.add_argument("--min-gain", type=float, default=0.03, help="val/correct change that counts as improved")
    parser.add_argument("--work-dir", type=Path, default=Path("output/bench-learning"))
    parser.add_argument("--cache-dir", type=Path, default=None, help="roll's asset cache (default: ROLL_CACHE_DIR)")
    parser.add_argument("--timeout-s", type=float, default=3600, help="per run")
    parser.add_argument("--markdown", type=Path, default=None, help="write the table here after every run")
    add_report_arguments(parser)
    args = parser.parse_args(argv)
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    for algo in algos:
        if algo not in VARIANTS:
            parser.error(f"unknown algorithm {algo!r}; one of {', '.join(VARIANTS)}")
    cache = args.cache_dir or Path(os.environ.get("ROLL_CACHE_DIR") or Path.home() / ".cache" / "roll")
    env = environment()
    meta: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "env": env,
        "load_start": env["loadavg"],
        "command": "./tools/dev bench learning " + " ".join(argv if argv is not None else sys.argv[1:]),
        "steps": args.steps,
        "min_gain": args.min_gain,
    }
    meta["warmup_s"] = warm_up(cache, args.timeout_s)
    print(f"warm-up ready in {meta['warmup_s']:.0f} s", flush=True)
    rows: list[Row] = []
    for i, algo in enumerate(algos):
        rows.append(
            run_variant(
                algo,
                steps=args.steps,
                work_dir=args.work_dir,
                cache_dir=cache,
                timeout_s=args.timeout_s,
                min_gain=args.min_gain,
            )
        )
        print(render(rows[-1:]), flush=True)
        if args.markdown:
            args.markdown.parent.mkdir(parents=True, exist_ok=True)
            args.markdown.write_text(_markdown(rows, meta, algos[i + 1 :]))
    print("\n" + render(rows))
    result = {
        **meta,
        "rows": [{**asdict(r), "gain": r.gain} for r in rows],
        "all_improved": all(r.improved for r in rows),
    }
    emit_result(result, args.result_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
