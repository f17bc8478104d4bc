"""The TRL half of tools/bench/rlvr_vs_trl.py: TRL's ``GRPOTrainer`` on the same model, prompts and reward.

Run by rlvr_vs_trl.py with the python of the TRL venv (.bench-venvs/trl, created on first use), never by hand in
the roll venv: it imports trl at module level. That venv sees the roll venv's packages (torch, transformers,
vLLM, roll itself) through a .pth file, so prompts are rendered by roll's own chat-template code and scored by
roll's ``math_score``. Two modes:

* ``throughput``: ``--steps`` optimizer steps (one generation of ``prompts x num_generations`` samples each);
  the wall time between the end of step 1 (warm-up) and the end of the last step is timed;
* ``race``: train until ``--budget-s`` seconds of training time have passed (evaluation excluded), with a greedy
  evaluation on the eval prompts before the first step, every ``--eval-steps`` steps, and after the step during
  which the budget ran out (the last one).

``--generation vllm`` uses TRL's vLLM colocate mode (``use_vllm=True, vllm_mode="colocate"``); a failure to start
it is reported in the RESULT (``error``) rather than raised. The last stdout line is ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import psutil
import torch
import trl
from datasets import Dataset
from transformers import AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from roll.pipelines.data import DataArgs, encode_prompt
from roll.pipelines.data.templates import has_chat_template, render_chat
from roll.pipelines.rewards.math import math_score
from tools.bench._report import emit_result

CORRECT = 1.0 - 1e-6  # roll's validation threshold (roll.pipelines.rlvr.validation)


def log(message: str) -> None:
    print(f"[trl] {message}", file=sys.stderr, flush=True)


# --- data and reward --------------------------------------------------------------------------------------------
def prompt_text(tokenizer: Any, prompt: str) -> str:
    """The prompt as roll's encode_prompt renders it (one user turn through the chat template, no system prompt)."""
    if has_chat_template(tokenizer):
        return render_chat(tokenizer, [{"role": "user", "content": prompt}], add_generation_prompt=True)
    return prompt


def load_rows(path: str, tokenizer: Any, report: dict[str, Any]) -> list[dict[str, str]]:
    """The jsonl rows as ``{"prompt": rendered text, "ground_truth"}``; ``report`` counts the rendered prompts that
    do not tokenize (as TRL tokenizes a text prompt) to the ids roll's ``encode_prompt`` gives the same row."""
    raw = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    rows = [{"prompt": prompt_text(tokenizer, r["prompt"]), "ground_truth": str(r["ground_truth"])} for r in raw]
    data_args = DataArgs(file_name=path, extra_keys=["ground_truth"], default_tag="math")
    mismatches = sum(
        encode_prompt(r, tokenizer, data_args)["prompt_ids"] != tokenizer(row["prompt"])["input_ids"]
        for r, row in zip(raw, rows)
    )
    report["prompt_id_mismatches"] = report.get("prompt_id_mismatches", 0) + mismatches
    return rows


def math_reward(completions: list[str], ground_truth: list[str], **_: Any) -> list[float]:
    """roll's rlvr-tiny reward: math_score with require_boxed=True."""
    return [math_score(c, gt, require_boxed=True)[0] for c, gt in zip(completions, ground_truth)]


@torch.no_grad()
def greedy_accuracy(model: Any, tokenizer: Any, rows: list[dict[str, str]], max_new_tokens: int, batch: int) -> float:
    """Greedy decoding of every eval prompt with HF generate, scored like roll's validation."""
    was_training = model.training
    model.eval()
    correct = 0
    try:
        for start in range(0, len(rows), batch):
            chunk = rows[start : start + batch]
            enc = tokenizer([r["prompt"] for r in chunk], return_tensors="pt", padding=True, padding_side="left")
            out = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            correct += sum(
                math_score(t, r["ground_truth"], require_boxed=True)[0] >= CORRECT for t, r in zip(texts, chunk)
            )
    finally:
        model.train(was_training)
    return correct / len(rows)


# --- callbacks --------------------------------------------------------------------------------------------------
class StepClock(TrainerCallback):
    """Wall time at the end of every optimizer step, and the logged metrics of each step."""

    def __init__(self) -> None:
        self.start = 0.0
        self.launched_s = 0.0  # process start -> training start: imports, model and engine loading, data
        self.ends: list[float] = []
        self.logs: list[dict[str, Any]] = []

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()
        self.launched_s = time.time() - psutil.Process().create_time()

    def on_step_end(self, args, state, control, **kwargs):
        self.ends.append(time.perf_counter())

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs:
            self.logs.append({"step": state.global_step, **{k: v for k, v in logs.items() if _is_number(v)}})


class RaceCallback(TrainerCallback):
    """Greedy eval (untimed) at step 0, every ``eval_steps`` steps, and at the end of the step during which the
    training clock passed the budget; training stops there."""

    def __init__(self, tokenizer: Any, eval_rows: list[dict[str, str]], args: argparse.Namespace) -> None:
        self.tokenizer, self.eval_rows, self.args = tokenizer, eval_rows, args
        self.start = 0.0
        self.paused = 0.0  # seconds spent evaluating, taken off the training clock
        self.curve: list[dict[str, float]] = []

    def train_seconds(self) -> float:
        return time.perf_counter() - self.start - self.paused

    def evaluate(self, model: Any, step: int) -> None:
        clock, began = self.train_seconds(), time.perf_counter()
        accuracy = greedy_accuracy(model, self.tokenizer, self.eval_rows, self.args.max_new_tokens, self.args.val_batch)
        self.paused += time.perf_counter() - began
        self.curve.append({"step": step, "train_s": clock, "accuracy": accuracy, "eval_s": time.perf_counter() - began})
        log(f"step {step}: val/accuracy={accuracy:.3f} at {clock:.1f} s of training")

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.start = time.perf_counter()
        self.evaluate(model, 0)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        over = self.train_seconds() >= self.args.budget_s
        if over or state.global_step % self.args.eval_steps == 0:
            self.evaluate(model, state.global_step)
        if over:
            control.should_training_stop = True


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# --- trainer ----------------------------------------------------------------------------------------------------
def build_config(args: argparse.Namespace, output_dir: str, max_steps: int) -> GRPOConfig:
    samples = args.prompts * args.num_generations
    if samples % args.micro_batch:
        raise ValueError(
            f"prompts x num_generations = {samples} must be a multiple of --micro-batch {args.micro_batch}"
        )
    vllm = args.generation == "vllm"
    extra: dict[str, Any] = {}
    if args.ignore_eos:  # every sample gets the full length, as roll's ignore_eos
        extra["generation_kwargs"] = {"ignore_eos": True} if vllm else {"min_new_tokens": args.max_new_tokens}
    if vllm:
        extra.update(
            use_vllm=True,
            vllm_mode="colocate",
            vllm_max_model_length=args.max_model_len,
            vllm_enable_sleep_mode=False,
        )
    return GRPOConfig(
        output_dir=output_dir,
        use_cpu=True,
        bf16=False,
        fp16=False,
        model_init_kwargs={"dtype": torch.float32},
        gradient_checkpointing=False,  # roll's fsdp2_train default (TRL's default is True)
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=samples // args.micro_batch,  # one optimizer step per generation, as roll
        num_generations=args.num_generations,
        max_completion_length=args.max_new_tokens,
        temperature=1.0,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=args.beta,
        epsilon=0.2,
        num_iterations=1,
        loss_type="dapo",  # token-mean over the whole batch: roll's loss_agg_mode=token-mean
        scale_rewards="group",  # GRPO with the group std: roll's norm_std=True
        max_steps=max_steps,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        seed=args.seed,
        dataloader_num_workers=0,
        **extra,
    )


def make_trainer(args: argparse.Namespace, config: GRPOConfig, rows: list[dict[str, str]], callbacks: list) -> Any:
    if args.generation == "vllm":
        # vLLM reads these when the engine starts: engine core in this process, a small CPU KV cache.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.kv_cache_gb))
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    # vLLM's CPU worker drops torch to one thread and turns torch.set_num_threads into a no-op; in colocate mode
    # that would also throttle training, so restore both (the same fix roll's vllm strategy applies).
    set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
    try:
        trainer = GRPOTrainer(
            model=args.model,
            reward_funcs=math_reward,
            args=config,
            train_dataset=Dataset.from_list(rows),
            callbacks=callbacks,
        )
    finally:
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(threads)
    return trainer


def run_throughput(args: argparse.Namespace, tokenizer: Any, out: str, report: dict[str, Any]) -> dict[str, Any]:
    rows = load_rows(args.train_file, tokenizer, report)
    clock = StepClock()
    trainer = make_trainer(args, build_config(args, out, args.steps), rows, [clock])
    trainer.train()
    if len(clock.ends) < 2:
        raise RuntimeError(f"only {len(clock.ends)} steps ran; need a warm-up step and at least one timed step")
    timed_steps = len(clock.ends) - 1
    seconds = clock.ends[-1] - clock.ends[0]
    samples = args.prompts * args.num_generations * timed_steps
    lengths = [entry["completions/mean_length"] for entry in clock.logs if "completions/mean_length" in entry]
    mean_length = sum(lengths[1:]) / len(lengths[1:]) if len(lengths) > 1 else None
    return {
        "startup_s": clock.launched_s,
        "warmup_step_s": clock.ends[0] - clock.start,
        "timed_steps": timed_steps,
        "step_times_s": [round(b - a, 4) for a, b in itertools.pairwise(clock.ends)],
        "seconds": seconds,
        "samples": samples,
        "samples_per_s": samples / seconds,
        "mean_completion_tokens": mean_length,
        "tokens_per_s": None if mean_length is None else samples * mean_length / seconds,
        "logs": clock.logs,
    }


def run_race(args: argparse.Namespace, tokenizer: Any, out: str, report: dict[str, Any]) -> dict[str, Any]:
    rows = load_rows(args.train_file, tokenizer, report)
    eval_rows = load_rows(args.eval_file, tokenizer, report)
    race = RaceCallback(tokenizer, eval_rows, args)
    clock = StepClock()
    trainer = make_trainer(args, build_config(args, out, args.max_steps), rows, [race, clock])
    trainer.train()
    return {
        "startup_s": clock.launched_s,  # after the step-0 evaluation (the race callback runs first), as roll's
        "steps": len(clock.ends),
        "train_s": race.train_seconds(),
        "curve": race.curve,
        "logs": clock.logs,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["throughput", "race"], required=True)
    p.add_argument("--generation", choices=["hf", "vllm"], default="hf")
    p.add_argument("--model", required=True)
    p.add_argument("--train-file", required=True)
    p.add_argument("--eval-file")
    p.add_argument("--prompts", type=int, required=True, help="prompts per step")
    p.add_argument("--num-generations", type=int, required=True)
    p.add_argument("--max-new-tokens", type=int, required=True)
    p.add_argument("--micro-batch", type=int, required=True)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--beta", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--max-model-len", type=int, default=256)
    p.add_argument("--kv-cache-gb", type=int, default=1)
    p.add_argument("--steps", type=int, default=3, help="throughput: optimizer steps, the first untimed")
    p.add_argument("--budget-s", type=float, default=300.0, help="race: seconds of training")
    p.add_argument("--eval-steps", type=int, default=5, help="race: evaluate every N steps")
    p.add_argument("--max-steps", type=int, default=100_000, help="race: a step cap besides the budget")
    p.add_argument("--val-batch", type=int, default=256)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    result: dict[str, Any] = {
        "trl": trl.__version__,
        "mode": args.mode,
        "generation": args.generation,
        "torch_threads": torch.get_num_threads(),
    }
    with tempfile.TemporaryDirectory(prefix="trl-grpo-") as out:
        try:
            run = run_throughput if args.mode == "throughput" else run_race
            result.update(run(args, tokenizer, out, result))
            result["torch_threads_after"] = torch.get_num_threads()  # after a vLLM engine started in-process
        except Exception as e:  # the report records why TRL could not run this configuration
            traceback.print_exc()
            result["error"] = f"{type(e).__name__}: {e}"[:2000]
    emit_result(result)


if __name__ == "__main__":
    main()
